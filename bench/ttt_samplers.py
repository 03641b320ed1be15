"""Trials to target of TPE settings on ``time_to_target.py``'s task, simulated without Ray.

Issue 18, point 4: which sampler settings a system brings decides how many trials the
search needs, and ``time_to_target.py`` measures that with 10 seeds at minutes per seed.
This script answers the sampler's part alone, 20 seeds in a few minutes: one process,
the same ``digits`` task, space, target, budget (80) and ASHA rungs (1 and 4 of 6
epochs, reduction factor 4) as that bench, 2 trials in flight (each trial's training
runs in a thread of its own, one at a time, with its own global random state, and hands
every evaluation over; the trial with fewer epochs trains next, so the two interleave
epoch by epoch as two equal workers would), and
Ray's ASHA rule (``AsyncHyperBandScheduler``): at a rung, a trial whose value is below
the 75th percentile of the values recorded there before it stops.

How a stopped trial is told to the sampler (``--tell``):

* ``pruned``: as this product's record does (and Optuna's own pruning): PRUNED, with its
  intermediate values, so TPE ranks it below every COMPLETE trial, by how far it got;
* ``complete``: as Ray's ``OptunaSearch`` does (``on_trial_complete`` tells the last
  result as a COMPLETE value, whether ASHA stopped the trial or not).

``--variant`` is ``random`` or the JSON keyword arguments of ``optuna.samplers.TPESampler``
besides the seed (and ``random_fraction``: that share of the trials sampled at random, as
BOHB does). Optuna 5's TPE is multivariate (for one objective) with a constant liar
by default; the product's is the independent TPE with a constant liar
(``hpo.algorithms.TPESamplerSpec.is_multivariate``): ``{"n_startup_trials": 4,
"multivariate": false}`` is the product's sampler on the example's spec and 80 trials.
Rows of ``bench/README.md`` before 2026-12-07's eleventh session ran the multivariate
TPE as the product's.

``--spec`` takes another spec's task, search space and config (``bench/ttt-wide.yaml``: a
wide space of 11 parameters; ``bench/ttt-recipe.yaml`` and ``bench/ttt-charlm.yaml``: a
fixed model of ``digits`` or ``charlm``, the search over its training recipe).
``--metric val_loss`` (or ``val_bpc``) makes the search minimize that metric and the
target a value at or below ``--target`` (default: ``val_accuracy``, maximized, at or
above 0.9895).

Prints each seed's trial (start rank) and epochs to the target, then the medians and the
runs that never reached it (counted as infinite). Only the search differs from the
bench: no system's time is in it.
"""

import argparse
import json
import math
import queue
import random
import statistics
import sys
import threading
from pathlib import Path

import numpy as np
import optuna
import torch

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent)]

import time_to_target as ttt  # noqa: E402

import trainers  # noqa: E402
from hpo.space import distributions  # noqa: E402
from hpo.spec import load_spec, parse_spec  # noqa: E402

RUNGS = (4, 1)  # epochs, highest first, as Ray's bracket checks them
MINIMIZED = ("val_loss", "val_bpc")


# One trial trains at a time, and each keeps its own global random state across its
# hand-overs (dropout draws from torch's global generator), so that a configuration's
# curve is what it is in a process of its own, as in the real systems.
BATON = threading.Lock()


def random_state() -> tuple:
    return torch.get_rng_state(), np.random.get_state(), random.getstate()


def set_random_state(state: tuple) -> None:
    torch.set_rng_state(state[0])
    np.random.set_state(state[1])
    random.setstate(state[2])


class HandOver:
    """A trial's reporter: every evaluation's score out (``--metric``'s value, negated for
    a metric to minimize: the search maximizes the score), a decision back in."""

    def __init__(self, metric: str = "val_accuracy", sign: float = 1.0) -> None:
        self.values, self.decisions = queue.Queue(), queue.Queue()
        self.metric, self.sign = metric, sign

    def report(self, metrics, save_checkpoint):
        state = random_state()
        self.values.put(self.sign * float(metrics[self.metric]))
        BATON.release()
        decision = self.decisions.get()
        BATON.acquire()
        set_random_state(state)
        return decision


class RunningTrial:
    """One trial training in a thread of its own, one evaluation at a time."""

    def __init__(self, trial: optuna.Trial, rank: int, task_name: str, fixed: dict,
                 metric: str = "val_accuracy", sign: float = 1.0) -> None:
        self.trial, self.rank, self.epoch = trial, rank, 0
        self.hand_over = HandOver(metric, sign)

        def train() -> None:
            with BATON:
                try:
                    task, config = trainers.create(task_name,
                                                   {**fixed, **trial.params})
                    trainers.fit(task, config, self.hand_over)
                finally:
                    self.hand_over.values.put(None)

        self.thread = threading.Thread(target=train, daemon=True)
        self.thread.start()

    def next_value(self) -> float:
        value = self.hand_over.values.get()
        if value is None:
            raise RuntimeError(f"trial {self.rank} ended without an evaluation")
        self.epoch += 1
        return value

    def decide(self, stop: bool) -> None:
        self.hand_over.decisions.put(trainers.Decision.STOP if stop
                                     else trainers.Decision.CONTINUE)
        if stop:
            self.thread.join()


class RandomFraction(optuna.samplers.BaseSampler):
    """BOHB's remedy for a model-based search stuck in one basin (Falkner et al., 2018,
    "BOHB", its ``random_fraction``): a fixed fraction of the trials, drawn by trial
    number, sampled at random; the others by ``base``. Here to measure it only."""

    def __init__(self, base: optuna.samplers.BaseSampler, fraction: float, seed: int) -> None:
        self.base, self.random = base, optuna.samplers.RandomSampler(seed=seed)
        self.fraction, self.seed = fraction, seed

    def _is_random(self, trial) -> bool:
        return random.Random(f"{self.seed}:{trial.number}").random() < self.fraction

    def infer_relative_search_space(self, study, trial):
        return {} if self._is_random(trial) else self.base.infer_relative_search_space(
            study, trial)

    def sample_relative(self, study, trial, search_space):
        return {} if self._is_random(trial) else self.base.sample_relative(
            study, trial, search_space)

    def sample_independent(self, study, trial, param_name, param_distribution):
        chosen = self.random if self._is_random(trial) else self.base
        return chosen.sample_independent(study, trial, param_name, param_distribution)

    def before_trial(self, study, trial) -> None:
        self.base.before_trial(study, trial)

    def after_trial(self, study, trial, state, values) -> None:
        self.base.after_trial(study, trial, state, values)


def sampler(variant: str, seed: int) -> optuna.samplers.BaseSampler:
    """``random``, or TPE with ``variant``'s keyword arguments; a ``random_fraction`` among
    them wraps it in :class:`RandomFraction`."""
    if variant == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    options = json.loads(variant)
    fraction = options.pop("random_fraction", 0)
    tpe = optuna.samplers.TPESampler(seed=seed, **options)
    return RandomFraction(tpe, fraction, seed) if fraction else tpe


def asha_stops(rungs: dict[int, dict[int, float]], rank: int, epoch: int,
               value: float) -> bool:
    """Ray's ``_Bracket.on_result``: record at the highest rung reached; stop if below the
    rung's (1 - 1/reduction factor) quantile of the values recorded before."""
    for milestone in RUNGS:
        if epoch < milestone or rank in rungs[milestone]:
            continue
        recorded = list(rungs[milestone].values())
        rungs[milestone][rank] = value
        return bool(recorded) and value < np.nanpercentile(
            recorded, (1 - 1 / ttt.REDUCTION_FACTOR) * 100)
    return False


def simulate(variant: str, tell: str, seed: int, args) -> tuple[float, float]:
    """(trial, epochs) to the first evaluation at the target; (inf, inf) if never."""
    data = load_spec(args.spec).to_dict()
    fixed = {**data["config"], "max_epochs": args.epochs}
    if args.val_fraction is not None:
        fixed["val_fraction"] = args.val_fraction
    elif args.spec == ttt.EXAMPLE:  # the example trains on digits' default split
        fixed["val_fraction"] = ttt.VAL_FRACTION
    dists = distributions(parse_spec({**data, "config": fixed}))
    study = optuna.create_study(direction="maximize", sampler=sampler(variant, seed))
    rungs: dict[int, dict[int, float]] = {m: {} for m in RUNGS}
    running: list[RunningTrial] = []
    sign = -1.0 if args.metric in MINIMIZED else 1.0  # the study maximizes sign * metric
    target = sign * args.target
    started = epochs = 0

    def start() -> None:
        nonlocal started
        started += 1
        running.append(RunningTrial(study.ask(dists), started, data["task"], fixed, args.metric,
                                    sign))

    while len(running) < 2 and started < args.trials:
        start()
    while running:
        t = min(running, key=lambda r: (r.epoch, r.rank))
        value = t.next_value()
        epochs += 1
        t.trial.report(value, t.epoch)
        if value >= target:
            t.decide(stop=True)
            for other in running:
                if other is not t:
                    other.decide(stop=True)
            return t.rank, epochs
        done = t.epoch >= args.epochs
        stop = asha_stops(rungs, t.rank, t.epoch, value) or done
        t.decide(stop)
        if stop:
            if done or tell == "complete":
                study.tell(t.trial, value)
            else:
                study.tell(t.trial, state=optuna.trial.TrialState.PRUNED)
            running.remove(t)
            if started < args.trials:
                start()
    return math.inf, math.inf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variant", default="random",
                        help="'random' or TPESampler's keyword arguments as JSON")
    parser.add_argument("--tell", choices=["pruned", "complete"], default="pruned")
    parser.add_argument("--seeds", type=int, nargs="+", default=list(range(20)))
    parser.add_argument("--trials", type=int, default=ttt.TRIALS)
    parser.add_argument("--metric", choices=["val_accuracy", *MINIMIZED], default="val_accuracy",
                        help="what the search optimizes and the target is on (val_loss: "
                             "minimized, reached at or below --target)")
    parser.add_argument("--target", type=float, default=None,
                        help=f"default {ttt.TARGET_ACCURACY} (val_accuracy)")
    parser.add_argument("--epochs", type=int, default=ttt.EPOCHS)
    parser.add_argument("--spec", type=Path, default=ttt.EXAMPLE,
                        help="the spec whose search space and config the trials take "
                             "(default: time_to_target.py's)")
    parser.add_argument("--val-fraction", type=float, default=None,
                        help=f"the task's val_fraction (default: the spec's; "
                             f"{ttt.VAL_FRACTION} for time_to_target.py's)")
    args = parser.parse_args()
    if args.target is None and args.metric != "val_accuracy":
        parser.error(f"--metric {args.metric} needs its --target")
    args.target = ttt.TARGET_ACCURACY if args.target is None else args.target
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    torch.set_num_threads(1)
    results = []
    for seed in args.seeds:
        rank, epochs = simulate(args.variant, args.tell, seed, args)
        results.append((rank, epochs))
        print(f"seed {seed:3d}: trial {rank}, {epochs} epochs", flush=True)
    ranks, epochs = [r for r, _ in results], [e for _, e in results]
    print(f"{args.variant} ({args.tell}): median trials {statistics.median(ranks)}, epochs "
          f"{statistics.median(epochs)}, never {sum(math.isinf(r) for r in ranks)} of "
          f"{len(results)}")


if __name__ == "__main__":
    main()
