"""Seconds per trial of the service versus ``hpo run`` versus raw Ray Tune + OptunaSearch.

The same trivial study (one optimizer update of ``digits`` per trial, TPE, 2
concurrent) is run three ways:

* ``service``: submitted over REST to ``python -m service.server`` (its own local
  Ray, already up, and its warm driver ready: ``/readyz``), timed from the POST to the
  study's end as the server records it (``ended_at``; the bench polls every second for
  the status, as ``hpo submit --wait`` does, and before 2026-12-06 timed to the poll that
  saw COMPLETED, adding half a second on average): the claim, the hand-over to the warm
  driver, the study's setup and every heartbeat are included;
* ``service, cold``: the same with ``HPO_WARM_DRIVER=false`` (no warm spare: the driver
  starts after the claim and imports Ray and torch then), with ``--warm both`` or ``off``;
* ``hpo run``: ``run_study`` in this process (what ``hpo run`` calls), its one-time
  imports and loads (``hpo.board.preload``, ``hpo.storage.preload``) before the clock;
* ``raw-tune``: ``tune.Tuner`` + ``OptunaSearch``, ``reuse_actors=True``.

Prints seconds per trial and the ratios to raw Ray Tune, the medians over ``--rounds``
interleaved rounds (goals: service <= 1.10, ``hpo run`` <= 1.05, issue 18.5; issue 13 asked
service <= 1.25).

    python bench/service_overhead.py [--trials 200] [--concurrency 2] [--warm on|off|both]
                                     [--rounds 1]
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import optuna

REPO = Path(__file__).resolve().parents[1]
WORK = {"max_updates": 1, "max_epochs": None, "width": 8, "depth": 1}


def spec(name: str, n_trials: int, concurrency: int) -> dict:
    return {"name": name, "task": "digits", "config": WORK,
            "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 1e-1, "log": True}},
            "objective": {"metric": "val_accuracy"}, "sampler": {"name": "tpe", "seed": 0},
            "budget": {"n_trials": n_trials, "max_concurrent_trials": concurrency}}


def bench_service(n: int, concurrency: int, workdir: Path, warm: bool = True,
                  port: int = 8799) -> float:
    """Wall seconds from POST to COMPLETED on a real server with its own local Ray, with or
    without its warm driver."""
    from service.auth import create_token
    from service.db import build_engine, create_tables, session_factory

    workdir = workdir / ("warm" if warm else "cold")
    workdir.mkdir()
    url = f"sqlite:///{workdir / 'service.db'}"
    engine = build_engine(url)
    create_tables(engine)
    token = create_token(session_factory(engine), "bench", admin=True)
    engine.dispose()
    env = {**os.environ, "HPO_DATABASE_URL": url, "HPO_RESULTS_DIR": str(workdir / "svc-runs"),
           "HPO_PORT": str(port), "HPO_NUM_CPUS": str(os.cpu_count()),
           "HPO_WARM_DRIVER": "true" if warm else "false"}
    env.pop("RAY_ADDRESS", None)
    log = open(workdir / "server.log", "wb")  # noqa: SIM115 - the server keeps it
    server = subprocess.Popen([sys.executable, "-m", "service.server"], cwd=REPO, env=env,
                              stdout=log, stderr=subprocess.STDOUT)
    base, headers = f"http://127.0.0.1:{port}", {"Authorization": f"Bearer {token}"}
    try:
        _wait_ready(base, server, warm)
        started = time.time()  # the wall clock: the study's ended_at is the server's
        r = httpx.post(f"{base}/v1/studies", json=spec("bench-service", n, concurrency),
                       headers=headers, timeout=60)
        r.raise_for_status()
        while True:
            study = httpx.get(f"{base}/v1/studies/bench-service", headers=headers).json()
            if study["status"] in ("COMPLETED", "STOPPED", "FAILED"):
                break
            time.sleep(1.0)  # as `hpo submit --wait` polls: reads cost the trials CPU
        if study["status"] != "COMPLETED":
            raise RuntimeError(f"service study {study['status']}: {study['error']}")
        # until the study ended, as the server recorded it (same machine, same clock), not
        # until the poll saw it: the poll's 1 s steps are the bench's, not the service's
        return dt.datetime.fromisoformat(study["ended_at"]).timestamp() - started
    finally:
        server.terminate()
        server.wait(120)


def _wait_ready(base: str, server: subprocess.Popen, warm: bool,
                timeout_s: float = 180) -> None:
    """Until the server is ready and idle: its warm driver, if kept, has imported and joined
    Ray (as the other two ways start timing with Ray up and imported)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError("the server exited; see server.log")
        try:
            r = httpx.get(f"{base}/readyz", timeout=2)
            if r.status_code == 200 and (not warm or
                                         r.json()["checks"].get("warm_driver") == "ready"):
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.3)
    raise RuntimeError("the server did not become ready")


def bench_hpo_run(n: int, concurrency: int, workdir: Path) -> float:
    from hpo import board, storage
    from hpo.spec import parse_spec
    from hpo.tune.driver import run_study

    # start-up excluded, as for raw Tune (its imports and its storage made before the
    # clock) and for the service (its warm driver does the same while it waits)
    board.preload()
    storage.preload()
    started = time.perf_counter()
    run_study(parse_spec(spec("bench-hpo", n, concurrency)), f"sqlite:///{workdir / 'hpo.db'}",
              results_dir=workdir / "hpo-runs")
    return time.perf_counter() - started


def _raw_trainable(config):
    from ray import tune

    import trainers

    task, cfg = trainers.create("digits", {**WORK, "lr": config["lr"]})
    tune.report({"val_accuracy": trainers.fit(task, cfg).metrics["val_accuracy"]})


def bench_raw_tune(n: int, concurrency: int, workdir: Path) -> float:
    import tensorboardX  # noqa: F401 - Tune's TBX logger imports it in fit(): start-up
    from ray import tune
    from ray.tune.search.optuna import OptunaSearch

    storage = optuna.storages.RDBStorage(f"sqlite:///{workdir / 'raw.db'}")
    search = OptunaSearch(metric="val_accuracy", mode="max", storage=storage, study_name="raw",
                          sampler=optuna.samplers.TPESampler(seed=0))
    tuner = tune.Tuner(
        tune.with_resources(_raw_trainable, {"cpu": 1}),
        param_space={"lr": tune.loguniform(1e-4, 1e-1)},
        tune_config=tune.TuneConfig(search_alg=search, num_samples=n, reuse_actors=True,
                                    max_concurrent_trials=concurrency),
        run_config=tune.RunConfig(name="raw", storage_path=str(workdir / "raw-runs"), verbose=0))
    started = time.perf_counter()
    tuner.fit()
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=2)
    parser.add_argument("--warm", choices=["on", "off", "both"], default="on",
                        help="the service with its warm driver, without it, or both")
    parser.add_argument("--rounds", type=int, default=1,
                        help="rounds of all the ways, interleaved; the ratios are the "
                             "medians of each round's (the machine's speed drifts)")
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ.setdefault("RAY_AIR_NEW_OUTPUT", "0")
    rounds: list[dict[str, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.rounds):
            workdir = Path(tmp) / f"round-{i}"
            workdir.mkdir()
            rounds.append(bench_round(args, workdir))
            print(f"round {i}: " + ", ".join(f"{k} {v:.1f} s" for k, v in rounds[-1].items()),
                  flush=True)
    report(args, rounds)


def bench_round(args, workdir: Path) -> dict[str, float]:
    """Seconds of each way, one after another: the services (each with its own Ray), then
    raw Tune and ``hpo run`` on a local Ray of this process."""
    import ray

    seconds = {}
    for warm in {"on": [True], "off": [False], "both": [True, False]}[args.warm]:
        seconds["service" if warm else "svc cold"] = bench_service(
            args.trials, args.concurrency, workdir, warm)
    ray.init(address="local", num_cpus=os.cpu_count(), include_dashboard=False,
             log_to_driver=False, logging_level="ERROR")
    try:
        seconds["raw-tune"] = bench_raw_tune(args.trials, args.concurrency, workdir)
        seconds["hpo run"] = bench_hpo_run(args.trials, args.concurrency, workdir)
    finally:
        ray.shutdown()
    return seconds


GOALS = {"service": 1.10, "hpo run": 1.05}  # issue 18.5 (issue 13: service <= 1.25)


def report(args, rounds: list[dict[str, float]]) -> None:
    n = args.trials
    print(f"{n} trials, {args.concurrency} concurrent, {os.cpu_count()} CPUs, "
          f"{len(rounds)} round(s); work per trial: 1 update of digits")
    print(f"{'way':10} {'s/trial':>8} {'vs raw-tune':>12}   (medians over rounds; per round)")
    for way in rounds[0]:
        per_trial = statistics.median(r[way] / n for r in rounds)
        ratios = [r[way] / r["raw-tune"] for r in rounds]
        print(f"{way:10} {per_trial:8.3f} {statistics.median(ratios):12.2f}   "
              + " ".join(f"{x:.2f}" for x in ratios))
    for way, goal in GOALS.items():
        if way in rounds[0]:
            ratio = statistics.median(r[way] / r["raw-tune"] for r in rounds)
            print(f"goal: {way} <= {goal:.2f}x raw-tune: {'met' if ratio <= goal else 'NOT met'}")


if __name__ == "__main__":
    main()
