"""MO-ASHA versus NSGA-II without pruning, at equal epochs (issue 18.1).

Task ``digits-size``: the built-in ``digits`` with a second metric, ``n_params``
(the model's parameter count), so that the two objectives conflict: maximize
``val_accuracy``, minimize ``n_params``. Search space, epochs (12 per trial) and
concurrency (2) of ``examples/digits-tpe-asha.yaml``; sampler NSGA-II
(``population_size`` 8, the seed) in both studies:

* ``nsga2``: ``--full-trials`` trials, every one trained 12 epochs (fifo);
* ``mo-asha``: up to ``--mo-asha-trials`` trials under ``mo-asha`` (grace period
  1 epoch, reduction factor 3: rungs at 1, 3 and 9 epochs).

Equal epochs: the NSGA-II study's epochs (``full-trials`` x 12) are the budget.
The MO-ASHA study's trials are taken in the order they ended, each costing the
epochs it trained, while the running total stays within that budget; the rest
are left out. Hypervolume of the COMPLETE trials' front (trained to their end,
the samplers' full results), objectives ``1 - val_accuracy`` and
``log10(n_params)``, both minimized, reference point ``(1, log10(largest model
of the space) + 0.1)``; the 2-D hypervolume is summed exactly. Goal: MO-ASHA's
median over seeds higher than NSGA-II's.

    python bench/mo_asha.py [--seeds 0 1 2 3 4] [--full-trials 12] [--mo-asha-trials 60]
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import sys
import tempfile
from pathlib import Path

import torch

from trainers.config import TrainConfig
from trainers.tasks.digits import DigitsCNN, DigitsTask

BENCH = Path(__file__).resolve().parent
EXAMPLE = BENCH.parent / "examples" / "digits-tpe-asha.yaml"
UPDATES_PER_EPOCH = 23  # 1437 training images / micro-batch 64
EPOCHS = 12


class DigitsSizeTask(DigitsTask):
    """``digits`` that also reports ``n_params``, its model's parameter count."""

    name = "digits-size"
    metrics = {**DigitsTask.metrics, "n_params": "minimize"}

    def build_model(self, config: TrainConfig) -> torch.nn.Module:
        model = super().build_model(config)
        self.n_params = sum(p.numel() for p in model.parameters())
        return model

    def eval_metrics(self, sums):
        return {**super().eval_metrics(sums), "n_params": float(self.n_params)}


def register_task(plugin_dir: Path) -> None:
    """Register ``digits-size`` through the ``hpo.trainers`` entry points (this file's
    module ``mo_asha``), for this process and for Ray's workers (``PYTHONPATH``)."""
    info = plugin_dir / "hpo_bench_mo_asha-0.1.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: hpo-bench-mo-asha\n"
                                   "Version: 0.1\n")
    (info / "entry_points.txt").write_text("[hpo.trainers]\n"
                                           "digits-size = mo_asha:DigitsSizeTask\n")
    sys.path[:0] = [str(BENCH), str(plugin_dir)]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in [str(BENCH), str(plugin_dir), str(BENCH.parent),
                    os.environ.get("PYTHONPATH", "")] if p)


def hypervolume_2d(points: list[tuple[float, float]], reference: tuple[float, float]) -> float:
    """Area dominated by ``points`` (both coordinates minimized) and bounded by ``reference``."""
    inside = sorted((x, y) for x, y in points if x < reference[0] and y < reference[1])
    area, best_y = 0.0, reference[1]
    for i, (x, y) in enumerate(inside):
        if y < best_y:
            best_y = y
        right = inside[i + 1][0] if i + 1 < len(inside) else reference[0]
        area += (right - x) * (reference[1] - best_y)
    return area


def study_spec(name: str, seed: int, n_trials: int, scheduler: dict):
    from hpo.spec import load_spec, parse_spec

    data = load_spec(EXAMPLE).to_dict()
    data.update(name=name, task="digits-size", scheduler=scheduler,
                objective=[{"metric": "val_accuracy"}, {"metric": "n_params"}],
                sampler={"name": "nsga2", "seed": seed, "population_size": 8},
                budget={**data["budget"], "n_trials": n_trials})
    return parse_spec(data)


def run(spec, workdir: Path) -> list:
    """The study's trials in the order they ended."""
    import optuna

    from hpo.tune.driver import run_study

    url = f"sqlite:///{workdir / 'mo.db'}"
    run_study(spec, url, results_dir=workdir / "runs")
    trials = optuna.load_study(study_name=spec.name, storage=url).trials
    ended = [t for t in trials if t.datetime_complete is not None]
    return sorted(ended, key=lambda t: t.datetime_complete)


def epochs_of(trial) -> float:
    if trial.state.name == "COMPLETE":
        return EPOCHS
    return (trial.user_attrs.get("budget_updates") or 0) / UPDATES_PER_EPOCH


def front_volume(trials, budget_epochs: float, reference) -> tuple[float, float, int]:
    """Hypervolume of the COMPLETE trials that ended within ``budget_epochs``; the epochs
    those trials used; how many of them completed."""
    taken = taken_within(trials, budget_epochs)
    points = [(1.0 - t.values[0], math.log10(t.values[1])) for t in taken
              if t.state.name == "COMPLETE"]
    return hypervolume_2d(points, reference), sum(map(epochs_of, taken)), len(points)


def taken_within(trials, budget_epochs: float) -> list:
    """The first trials (in the order they ended) whose epochs add up to at most the budget."""
    taken, used = [], 0.0
    for t in trials:
        if used + epochs_of(t) > budget_epochs:
            break
        taken.append(t)
        used += epochs_of(t)
    return taken


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    parser.add_argument("--full-trials", type=int, default=12)
    parser.add_argument("--mo-asha-trials", type=int, default=60)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as plugin:
        register_task(Path(plugin))
        import optuna
        import ray

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
                 logging_level="ERROR")
        largest = sum(p.numel() for p in DigitsCNN(64, 3, 0.0, True).parameters())
        reference = (1.0, math.log10(largest) + 0.1)
        mo_asha = {"name": "mo-asha", "grace_period": UPDATES_PER_EPOCH, "reduction_factor": 3}
        budget = args.full_trials * EPOCHS
        print(f"digits-size, NSGA-II (population 8); {args.full_trials} trials x {EPOCHS} "
              f"epochs = {budget} epochs each; mo-asha {mo_asha}, up to "
              f"{args.mo_asha_trials} trials; reference point ({reference[0]}, "
              f"{reference[1]:.3f})")
        print(f"{'seed':>4} {'nsga2 HV':>9} {'complete':>8} {'mo-asha HV':>10} "
              f"{'epochs':>7} {'trials':>6} {'complete':>8}")
        full_hv, mo_hv = [], []
        for seed in args.seeds:
            with tempfile.TemporaryDirectory() as tmp:
                full = run(study_spec(f"nsga2-{seed}", seed, args.full_trials,
                                      {"name": "fifo"}), Path(tmp))
                mo = run(study_spec(f"mo-asha-{seed}", seed, args.mo_asha_trials, mo_asha),
                         Path(tmp))
            hv, _, n_complete = front_volume(full, budget, reference)
            mhv, used, m_complete = front_volume(mo, budget, reference)
            n_taken = len(taken_within(mo, budget))
            full_hv.append(hv)
            mo_hv.append(mhv)
            print(f"{seed:4d} {hv:9.4f} {n_complete:8d} {mhv:10.4f} {used:7.1f} "
                  f"{n_taken:6d} {m_complete:8d}", flush=True)
        a, b = statistics.median(full_hv), statistics.median(mo_hv)
        print(f"median hypervolume: nsga2 {a:.4f}, mo-asha {b:.4f} ({b / a:.3f}x); "
              f"goal mo-asha higher: {'met' if b > a else 'NOT met'}")



if __name__ == "__main__":
    main()
