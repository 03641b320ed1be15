"""Storage scaling: seconds per trial written, and the study view's latency, at 1k and 10k trials.

For each backend (SQLite file; PostgreSQL when ``HPO_TEST_DATABASE_URL`` answers):

* two studies grow to 10k finished trials on the same database; seconds per
  trial are measured over the last 200 trials before 1k and before 10k,
  written in one study through ``hpo.record.StudyRecord`` (what a study driver
  writes: ask, 5 intermediate values, user attributes, tell) and in the other
  through raw Optuna (ask, 5 ``report``, ``tell``; Optuna's default sampler, TPE, which
  reads every trial at each ask; the hpo study samples at random). The trials before each
  window are bulk-written as whole finished trials (``create_new_trial`` with
  a template of the same shape: one transaction each), to keep the run short;
  Optuna's trial cache then reads them once, a one-time cost that a driver pays
  only when it loads a stored study: it is timed apart ("1st", seconds), before
  the window;
* at 1k and 10k, ``GET /v1/studies/{name}`` is timed over HTTP on a live
  server (p50, p99 of 200 requests), against the raw Optuna read a naive view
  needs (``load_study`` + ``trials`` + ``best_trial``, p50/p99 of 10).

Goals: no superlinear growth from 1k to 10k; p99 of the study view < 100 ms at 10k.

    python bench/storage_scaling.py [--sizes 1000 10000] [--backends sqlite postgresql]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path

import httpx
import optuna
import sqlalchemy as sa

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hpo.record import StudyRecord  # noqa: E402
from hpo.spec import parse_spec  # noqa: E402
from service.app import create_app  # noqa: E402
from service.auth import create_token  # noqa: E402
from service.settings import Settings  # noqa: E402
from tests.service.conftest import serve_in_thread  # noqa: E402

PG_URL = os.environ.get("HPO_TEST_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/test")
WINDOW = 200
DIST = {"lr": optuna.distributions.FloatDistribution(1e-4, 0.3, log=True)}


def spec_data(name: str, n_trials: int) -> dict:
    return {"name": name, "task": "digits", "config": {"max_epochs": 1},
            "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}},
            "objective": {"metric": "val_accuracy"}, "sampler": {"name": "random", "seed": 0},
            "budget": {"n_trials": n_trials}}


def write_record_trial(record: StudyRecord, i: int) -> None:
    ray_id = f"t{i}"
    record.ask(ray_id)
    record.started(ray_id)
    for step in range(1, 6):
        record.result(ray_id, {"step": 10 * step, "val_accuracy": 0.5 + 0.05 * step,
                               "planned_updates": 50, "samples": 640 * step, "node_ip": "n"})
    record.complete_or_prune(ray_id, "asha")


def bulk_fill(storage, name: str, n: int) -> None:
    """``n`` finished trials of the same shape in study ``name``, one transaction each."""
    study_id = storage.get_study_id_from_name(name)
    for i in range(n):
        template = optuna.trial.create_trial(
            params={"lr": 1e-3}, distributions=DIST, value=0.75,
            intermediate_values={10 * step: 0.5 + 0.05 * step for step in range(1, 6)},
            user_attrs={"ray_trial_id": f"b{i}", "wall_time_s": 1.0, "device_seconds": 1.0,
                        "samples": 3200, "node_ip": "n"})
        storage.create_new_trial(study_id, template_trial=template)


def write_raw_trial(study: optuna.Study, i: int) -> None:
    trial = study.ask(DIST)
    for step in range(1, 6):
        trial.report(0.5 + 0.05 * step, 10 * step)
    study.tell(trial, 0.75)


def percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]


def time_view(http: httpx.Client, name: str, n: int = 200) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        r = http.get(f"/v1/studies/{name}")
        samples.append(time.perf_counter() - t0)
        r.raise_for_status()
    return percentiles(samples)


def time_raw_view(storage, name: str, n: int = 10) -> tuple[float, float]:
    samples = []
    for _ in range(n):
        t0 = time.perf_counter()
        study = optuna.load_study(study_name=name, storage=storage)
        _ = len(study.trials), study.best_trial
        samples.append(time.perf_counter() - t0)
    return percentiles(samples)


def run_backend(label: str, url: str, sizes: list[int]) -> list[str]:
    app = create_app(Settings(database_url=url, results_dir=Path(tempfile.mkdtemp()),
                              run_dispatcher=False))
    token = create_token(app.state.components.sessions, "bench", admin=True)
    storage = app.state.components.studies.storage
    rows = []
    with serve_in_thread(app) as base, httpx.Client(
            base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as http:
        http.post("/v1/studies", json=spec_data("scale", sizes[-1])).raise_for_status()
        record = StudyRecord(parse_spec(spec_data("scale", sizes[-1])), storage)
        raw = optuna.create_study(study_name="raw", storage=storage, direction="maximize")
        done = 0
        for size in sizes:
            per_trial, first_read = {}, {}
            for way, write, target in (("hpo record", write_record_trial, record),
                                       ("raw optuna", write_raw_trial, raw)):
                bulk_fill(storage, "scale" if way == "hpo record" else "raw",
                          size - WINDOW - done)
                # Optuna's trial cache reads the bulk-written trials once, on the next ask: a
                # one-time cost (a driver sees its trials one at a time, or loads a stored
                # study once), timed apart from the window
                t0 = time.perf_counter()
                (target.study if way == "hpo record" else target).get_trials(deepcopy=False)
                first_read[way] = time.perf_counter() - t0
                t0 = time.perf_counter()
                for i in range(size - WINDOW, size):
                    write(target, i)
                per_trial[way] = (time.perf_counter() - t0) / WINDOW
            done = size
            p50, p99 = time_view(http, "scale")
            r50, r99 = time_raw_view(storage, "raw")
            rows.append(f"{label:10} {size:>6} {1e3 * per_trial['hpo record']:10.1f} "
                        f"{1e3 * per_trial['raw optuna']:10.1f} {1e3 * p50:9.1f} "
                        f"{1e3 * p99:9.1f} {1e3 * r50:10.0f} {1e3 * r99:10.0f} "
                        f"{first_read['hpo record']:9.2f} {first_read['raw optuna']:9.2f}")
            print(rows[-1], flush=True)
    app.state.components.studies.storage.engine.dispose()
    return rows


@contextlib.contextmanager
def pg_schema():
    engine = sa.create_engine(PG_URL)
    schema = f"bench_{uuid.uuid4().hex[:8]}"
    with engine.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    try:
        sep = "&" if "?" in PG_URL else "?"
        yield f"{PG_URL}{sep}options=-csearch_path%3D{schema}"
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
        engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"{'backend':10} {'trials':>6} {'hpo ms/tr':>10} {'raw ms/tr':>10} {'view p50':>9} "
          f"{'view p99':>9} {'raw rd p50':>10} {'raw rd p99':>10} {'hpo 1st s':>9} "
          f"{'raw 1st s':>9}   (times in ms; first reads of the bulk-written trials in s)")
    for backend in args.backends:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                run_backend("sqlite", f"sqlite:///{tmp}/scale.db", args.sizes)
        else:
            try:
                with pg_schema() as url:
                    run_backend("postgresql", url, args.sizes)
            except sa.exc.OperationalError as e:
                print(f"postgresql skipped: unreachable at {PG_URL} ({type(e).__name__})")


if __name__ == "__main__":
    main()
