"""Search quality on ``digits``: trials TPE and random search need to reach a target accuracy.

For each seed, both samplers (built from a spec by ``hpo.space.build_sampler``,
as the service builds them) suggest up to ``--budget`` trials over the
example's search space; each trial trains ``digits`` in this process
(``trainers.fit``, a few epochs). The figure is the number of trials until
the first val_accuracy >= ``--target`` (budget + 1 when never reached), the
median over seeds. Goal: TPE needs at most half of random's trials.

    python bench/search_quality.py [--seeds 10] [--budget 150] [--target 0.93] [--epochs 1]

One epoch keeps the target hard: over 40 random configurations of the example's
search space, 1 epoch of training reached 0.91 at best and 0.73 at the median.
Only the samplers' seeds vary; training uses the task's fixed seed. The budget is
large enough that random search reaches the target within it for most seeds: a
run that never reaches it counts as budget + 1, and with a budget of 60, 6 of 10
random runs did not, so the median ratio was only an upper bound (0.52).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import optuna

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import trainers  # noqa: E402
from hpo.space import build_sampler, distributions  # noqa: E402
from hpo.spec import parse_spec  # noqa: E402

SPACE = {
    "lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True},
    "weight_decay": {"type": "float", "low": 1e-6, "high": 1e-2, "log": True},
    "width": {"type": "int", "low": 8, "high": 64, "step": 8},
    "depth": {"type": "int", "low": 1, "high": 3},
    "dropout": {"type": "float", "low": 0.0, "high": 0.5},
    "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]},
}


def trials_to_target(sampler: str, seed: int, args) -> tuple[int, float]:
    """Trials until val_accuracy >= target (budget + 1 if never), and the best reached."""
    spec = parse_spec({"name": f"q-{sampler}-{seed}", "task": "digits",
                       "config": {"max_epochs": args.epochs, "micro_batch_size": 64},
                       "search_space": SPACE, "objective": {"metric": "val_accuracy"},
                       "sampler": {"name": sampler, "seed": seed,
                                   **({"n_startup_trials": 5} if sampler == "tpe" else {})},
                       "budget": {"n_trials": args.budget}})
    study = optuna.create_study(direction="maximize", sampler=build_sampler(spec))
    dists = distributions(spec)
    best = 0.0
    for n in range(1, args.budget + 1):
        trial = study.ask(dists)
        task, config = trainers.create("digits", {**spec.config, **trial.params})
        accuracy = trainers.fit(task, config).metrics["val_accuracy"]
        study.tell(trial, accuracy)
        best = max(best, accuracy)
        if accuracy >= args.target:
            return n, best
    return args.budget + 1, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--budget", type=int, default=150)
    parser.add_argument("--target", type=float, default=0.93)
    parser.add_argument("--epochs", type=int, default=1)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    started = time.perf_counter()
    needed: dict[str, list[int]] = {"tpe": [], "random": []}
    for seed in range(args.seeds):
        for sampler in needed:
            n, best = trials_to_target(sampler, seed, args)
            needed[sampler].append(n)
            print(f"seed {seed} {sampler:6}: {n if n <= args.budget else f'>{args.budget}':>4} "
                  f"trials (best {best:.4f})", flush=True)
    tpe, rnd = (statistics.median(needed[s]) for s in ("tpe", "random"))
    print(f"digits, {args.epochs} epochs per trial, target val_accuracy >= {args.target}, "
          f"budget {args.budget}, {args.seeds} seeds, {time.perf_counter() - started:.0f} s")
    print(f"median trials to target: tpe {tpe:g}, random {rnd:g}; ratio tpe/random "
          f"{tpe / rnd:.2f} (goal <= 0.5: {'met' if tpe <= 0.5 * rnd else 'NOT met'})")


if __name__ == "__main__":
    main()
