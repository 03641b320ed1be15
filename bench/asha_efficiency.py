"""ASHA versus the same trials at full budget, on ``digits``.

Both studies draw the same configurations (random sampler, same seed: its draws
do not depend on results) from the search space of
``examples/digits-tpe-asha.yaml``. One runs every trial to the full 12 epochs;
the other lets ASHA stop the weak ones. Prints total epochs trained and the best
val_accuracy of each. Goal: ASHA within 1 percentage point of the full-budget
best with at most 1/3 of its epochs.

    python bench/asha_efficiency.py [--trials 24] [--seeds 0 1 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

import optuna
import ray

from hpo.spec import load_spec, parse_spec
from hpo.tune.driver import run_study

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "digits-tpe-asha.yaml"
UPDATES_PER_EPOCH = 23  # 1437 training images / micro-batch 64


def run(name: str, scheduler: dict, n_trials: int, seed: int, workdir: Path) -> tuple[float, float]:
    data = load_spec(EXAMPLE).to_dict()
    data.update(name=name, scheduler=scheduler, sampler={"name": "random", "seed": seed},
                budget={**data["budget"], "n_trials": n_trials})
    url = f"sqlite:///{workdir / 'asha.db'}"
    run_study(parse_spec(data), url, results_dir=workdir / "runs")
    trials = optuna.load_study(study_name=name, storage=url).trials
    epochs = sum(max(t.intermediate_values) for t in trials) / UPDATES_PER_EPOCH
    best = max(t.value for t in trials if t.state == optuna.trial.TrialState.COMPLETE)
    return epochs, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    asha = load_spec(EXAMPLE).scheduler.model_dump()
    print(f"{args.trials} trials of digits per study (random sampler); ASHA {asha}")
    print(f"{'seed':>4} {'full epochs':>12} {'full best':>10} {'asha epochs':>12} "
          f"{'asha best':>10} {'epochs ratio':>13} {'gap pp':>7}")
    ratios, gaps = [], []
    for seed in args.seeds:
        with tempfile.TemporaryDirectory() as tmp:
            full_epochs, full_best = run(f"full-{seed}", {"name": "fifo"}, args.trials, seed,
                                         Path(tmp))
            asha_epochs, asha_best = run(f"asha-{seed}", asha, args.trials, seed, Path(tmp))
        ratios.append(asha_epochs / full_epochs)
        gaps.append(100 * (full_best - asha_best))
        print(f"{seed:4d} {full_epochs:12.0f} {full_best:10.4f} {asha_epochs:12.0f} "
              f"{asha_best:10.4f} {ratios[-1]:13.3f} {gaps[-1]:7.2f}")
    print(f"median epochs ratio {statistics.median(ratios):.3f} (goal <= 0.333), "
          f"median accuracy gap {statistics.median(gaps):.2f} pp (goal <= 1)")


if __name__ == "__main__":
    main()
