"""Seconds per trial of dispatching: ``hpo`` versus raw Ray Tune + OptunaSearch versus plain Optuna.

Every trial does the same trivial work: one optimizer update of the ``digits``
task through ``trainers.fit`` (dataset, model, one update, one evaluation).
What differs is the dispatch around it:

* ``hpo``: ``run_study`` (our searcher, the Optuna record, the checkpoint of each
  trial's last report: its only one here, ``checkpoint_interval_s``);
* ``raw-tune``: ``tune.Tuner`` + ``OptunaSearch``, ``reuse_actors=True``,
  ``max_concurrent_trials`` as for hpo, ``tune.report`` without checkpoints;
* ``optuna``: ``study.optimize`` in this process, one trial at a time.

Prints seconds per trial and the ratio hpo / raw-tune (goal <= 1.2).

    python bench/dispatch_overhead.py [--trials 200] [--concurrency 2]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import optuna
import ray
from ray import tune
from ray.tune.search.optuna import OptunaSearch

import trainers
from hpo.spec import parse_spec
from hpo.tune.driver import run_study

WORK = {"max_updates": 1, "max_epochs": None, "width": 8, "depth": 1}


def trivial_fit(lr: float) -> float:
    task, config = trainers.create("digits", {**WORK, "lr": lr})
    return trainers.fit(task, config).metrics["val_accuracy"]


def bench_hpo(n: int, concurrency: int, workdir: Path) -> float:
    spec = parse_spec({"name": "bench-dispatch", "task": "digits", "config": WORK,
                       "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1,
                                               "log": True}},
                       "objective": {"metric": "val_accuracy"},
                       "sampler": {"name": "tpe", "seed": 0},
                       "budget": {"n_trials": n, "max_concurrent_trials": concurrency}})
    started = time.perf_counter()
    run_study(spec, f"sqlite:///{workdir / 'hpo.db'}", results_dir=workdir / "hpo-runs")
    return time.perf_counter() - started


def _raw_trainable(config):
    tune.report({"val_accuracy": trivial_fit(config["lr"])})


def bench_raw_tune(n: int, concurrency: int, workdir: Path) -> float:
    storage = optuna.storages.RDBStorage(f"sqlite:///{workdir / 'raw.db'}")
    search = OptunaSearch(metric="val_accuracy", mode="max", storage=storage,
                          study_name="raw", sampler=optuna.samplers.TPESampler(seed=0))
    tuner = tune.Tuner(
        tune.with_resources(_raw_trainable, {"cpu": 1}),
        param_space={"lr": tune.loguniform(1e-4, 1e-1)},
        tune_config=tune.TuneConfig(search_alg=search, num_samples=n, reuse_actors=True,
                                    max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name="raw", storage_path=str(workdir / "raw-runs"),
                                  verbose=0))
    started = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - started


def bench_optuna(n: int, workdir: Path) -> float:
    study = optuna.create_study(storage=f"sqlite:///{workdir / 'plain.db'}", direction="maximize",
                                sampler=optuna.samplers.TPESampler(seed=0))
    started = time.perf_counter()
    study.optimize(lambda t: trivial_fit(t.suggest_float("lr", 1e-4, 1e-1, log=True)),
                   n_trials=n)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False,
             logging_level="ERROR")
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        raw = bench_raw_tune(args.trials, args.concurrency, workdir)
        hpo = bench_hpo(args.trials, args.concurrency, workdir)
        plain = bench_optuna(args.trials, workdir)
    n = args.trials
    print(f"{n} trials, {args.concurrency} concurrent, {os.cpu_count()} CPUs; "
          "work per trial: 1 update of digits")
    print(f"{'dispatch':10} {'s/trial':>8} {'vs raw-tune':>12}")
    for name, seconds in [("hpo", hpo), ("raw-tune", raw), ("optuna", plain)]:
        print(f"{name:10} {seconds / n:8.3f} {seconds / raw:12.2f}")


if __name__ == "__main__":
    main()
