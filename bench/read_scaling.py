"""Read scaling: the study view and a 100-trial page, at growing study sizes (issue 11, 9-10).

For each backend (SQLite file; PostgreSQL when ``HPO_TEST_DATABASE_URL`` answers) and
for a single-objective and a two-objective study, the study grows to each size of
``--sizes`` finished trials, bulk-written into Optuna's tables through its ORM models
(1000 per transaction, the rows ``create_new_trial`` writes for a whole finished trial;
random parameters and values, so that a two-objective study has a small Pareto front;
5 intermediate values for the single-objective study, user attributes for both). At
each size, over HTTP on a live server (no dispatcher):

* ``GET /v1/studies/{name}`` (the study view, with the best trial or Pareto front, from
  the study's summary in the service's own table: the bulk-written trials have no driver
  to keep it, so after each fill it is computed as a driver starting on the study does,
  one read of every trial, and stored; that read is timed as ``summary s``);
* ``GET /v1/studies/{name}/trials?offset=...&limit=100`` (a page in the middle);

are timed (p50, p99 of ``--requests`` requests each) and their SQL statements
counted (SQLAlchemy's ``before_cursor_execute`` on every engine of the process: the
service's and the Optuna storage's).

Goals: p99 < 100 ms at 10k trials everywhere; statements per request that do not grow
with the study.

    python bench/read_scaling.py [--sizes 1000 10000] [--backends sqlite postgresql]
                                 [--requests 100] [--objectives 1 2]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import gc
import json
import random
import sys
import tempfile
import time
from pathlib import Path

import httpx
import optuna
import sqlalchemy as sa
import sqlalchemy.orm

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.storage_scaling import percentiles, pg_schema  # noqa: E402
from service.app import create_app  # noqa: E402
from service.auth import create_token  # noqa: E402
from service.db import StudyRow, SummaryRow  # noqa: E402
from service.settings import Settings  # noqa: E402
from service.summaries import compute_summary, store_summary  # noqa: E402
from tests.service.conftest import serve_in_thread  # noqa: E402

DIST = {"lr": optuna.distributions.FloatDistribution(1e-4, 0.3, log=True),
        "width": optuna.distributions.IntDistribution(8, 64),
        "act": optuna.distributions.CategoricalDistribution(["relu", "gelu"])}
PAGE = 100


def spec_data(name: str, n_trials: int, objectives: int) -> dict:
    objective = ({"metric": "val_accuracy"} if objectives == 1 else
                 [{"metric": "val_accuracy"}, {"metric": "val_loss"}])
    return {"name": name, "task": "digits", "config": {"max_epochs": 1},
            "search_space": {"lr": {"type": "float", "low": 1e-4, "high": 0.3, "log": True}},
            "objective": objective, "sampler": {"name": "random", "seed": 0},
            "budget": {"n_trials": n_trials}}


def fill(storage, name: str, start: int, stop: int, objectives: int, rng: random.Random) -> None:
    """Finished trials ``start`` .. ``stop - 1`` of study ``name``, 1000 per transaction.

    Optuna writes one trial per transaction (``create_new_trial``): 10k trials took about
    half an hour on PostgreSQL on the loaded 2-core machine. The same rows go in here
    through Optuna's own ORM models (private: a bench's shortcut, not the product's; the
    import is in hpo.storage, the module for Optuna's private names).
    """
    from hpo.storage import orm_models

    models = orm_models()

    study_id = storage.get_study_id_from_name(name)
    finite = models.TrialValueModel.TrialValueType.FINITE
    finite_iv = models.TrialIntermediateValueModel.TrialIntermediateValueType.FINITE
    dists = {k: optuna.distributions.distribution_to_json(d) for k, d in DIST.items()}
    now = datetime.datetime.now()
    for batch in range(start, stop, 1000):
        rows = []
        for i in range(batch, min(stop, batch + 1000)):
            acc = rng.random()
            values = [acc] if objectives == 1 else [acc, rng.random()]
            params = {"lr": 10 ** rng.uniform(-4, -0.6), "width": rng.randint(8, 64),
                      "act": rng.choice(["relu", "gelu"])}
            attrs = {"ray_trial_id": f"b{i}", "wall_time_s": 1.0, "device_seconds": 1.0,
                     "samples": 3200, "node_ip": "n"}
            rows.append(models.TrialModel(
                number=i, study_id=study_id, state=optuna.trial.TrialState.COMPLETE,
                datetime_start=now, datetime_complete=now,
                values=[models.TrialValueModel(objective=k, value=v, value_type=finite)
                        for k, v in enumerate(values)],
                params=[models.TrialParamModel(
                    param_name=k, param_value=DIST[k].to_internal_repr(v),
                    distribution_json=dists[k]) for k, v in params.items()],
                user_attributes=[models.TrialUserAttributeModel(key=k, value_json=json.dumps(v))
                                 for k, v in attrs.items()],
                intermediate_values=[models.TrialIntermediateValueModel(
                    step=10 * s, intermediate_value=acc * s / 5,
                    intermediate_value_type=finite_iv)
                    for s in range(1, 6)] if objectives == 1 else []))
        with sa.orm.Session(storage.engine) as session:
            session.add_all(rows)
            session.commit()


def summarize(app, name: str) -> float:
    """Store the study's summary as its driver would have it (``hpo.summary``: one read of
    every trial, as at a driver's start); the seconds that read and the write took."""
    c = app.state.components
    t0 = time.perf_counter()
    with c.sessions.begin() as session:
        row = session.execute(sa.select(StudyRow).where(StudyRow.name == name)).scalar_one()
        session.execute(sa.delete(SummaryRow).where(SummaryRow.study_id == row.id))
        store_summary(session, row.id, compute_summary(c.studies.storage, row))
    return time.perf_counter() - t0


class StatementCounter:
    """Counts the SQL statements every engine of this process sends."""

    def __init__(self) -> None:
        self.n = 0
        sa.event.listen(sa.Engine, "before_cursor_execute", self._count)

    def _count(self, *args) -> None:
        self.n += 1

    def close(self) -> None:
        sa.event.remove(sa.Engine, "before_cursor_execute", self._count)


def time_get(http: httpx.Client, path: str, n: int,
             counter: StatementCounter) -> tuple[float, float, int]:
    """p50 and p99 in seconds of ``n`` GETs of ``path``, and the statements of the last one."""
    samples = []
    for _ in range(n):
        before = counter.n
        t0 = time.perf_counter()
        r = http.get(path)
        samples.append(time.perf_counter() - t0)
        r.raise_for_status()
        statements = counter.n - before
    return (*percentiles(samples), statements)


def run_backend(label: str, url: str, sizes: list[int], requests: int,
                objective_counts: list[int]) -> None:
    app = create_app(Settings(database_url=url, results_dir=Path(tempfile.mkdtemp()),
                              run_dispatcher=False))
    token = create_token(app.state.components.sessions, "bench", admin=True)
    storage = app.state.components.studies.storage
    gc.freeze()  # as service.server.serve does once the app is built
    counter = StatementCounter()
    rng = random.Random(0)
    try:
        with serve_in_thread(app) as base, httpx.Client(
                base_url=base, headers={"Authorization": f"Bearer {token}"},
                timeout=600) as http:
            for objectives in objective_counts:
                name = f"read{objectives}"
                http.post("/v1/studies", json=spec_data(name, sizes[-1], objectives)
                          ).raise_for_status()
                done = 0
                for size in sizes:
                    t0 = time.perf_counter()
                    fill(storage, name, done, size, objectives, rng)
                    fill_s, done = time.perf_counter() - t0, size
                    summary_s = summarize(app, name)
                    v50, v99, v_n = time_get(http, f"/v1/studies/{name}", requests, counter)
                    p50, p99, p_n = time_get(
                        http, f"/v1/studies/{name}/trials?offset={size // 2}&limit={PAGE}",
                        requests, counter)
                    print(f"{label:10} {objectives:>4} {size:>6} {1e3 * v50:9.1f} "
                          f"{1e3 * v99:9.1f} {v_n:>7} {1e3 * p50:9.1f} {1e3 * p99:9.1f} "
                          f"{p_n:>7} {fill_s:8.1f} {summary_s:9.2f}", flush=True)
    finally:
        counter.close()
        storage.engine.dispose()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[1000, 10000])
    parser.add_argument("--backends", nargs="+", default=["sqlite", "postgresql"])
    parser.add_argument("--requests", type=int, default=100, help="requests per figure")
    parser.add_argument("--objectives", type=int, nargs="+", default=[1, 2], choices=[1, 2])
    args = parser.parse_args()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    print(f"{'backend':10} {'objs':>4} {'trials':>6} {'view p50':>9} {'view p99':>9} "
          f"{'view st':>7} {'page p50':>9} {'page p99':>9} {'page st':>7} {'fill s':>8} "
          f"{'summary s':>9}   (ms; st: SQL statements per request; fill: seconds to "
          "bulk-write; summary: seconds to compute and store the summary)")
    for backend in args.backends:
        if backend == "sqlite":
            with tempfile.TemporaryDirectory() as tmp:
                run_backend("sqlite", f"sqlite:///{tmp}/read.db", args.sizes, args.requests,
                            args.objectives)
        else:
            try:
                with pg_schema() as url:
                    run_backend("postgresql", url, args.sizes, args.requests,
                                args.objectives)
            except sa.exc.OperationalError as e:
                print(f"postgresql skipped: unreachable ({type(e).__name__})")


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
