"""Reads that must not grow with the study (issue 11, points 9 and 10).

The study view (from the summary the driver keeps, issue 13.5), a page of trials and a
stop cost the same number of SQL statements
at 20 and at 520 trials (520: past the 500 ids that SQLAlchemy's ``selectinload``
loads per statement, so a read of every trial shows), for one and two objectives, on
SQLite and PostgreSQL; and they answer what Optuna's own view of the study says.
"""

from __future__ import annotations

import contextlib
import json
import random

import optuna
import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from optuna.trial import TrialState

from service.app import create_app
from service.auth import create_token
from service.schemas import TrialOut
from service.settings import Settings
from tests.service.conftest import bearer, record_summary, tiny_spec

SIZES = (20, 520)
DISTS = {"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)}


@pytest.fixture
def world(db_url, tmp_path):
    app = create_app(Settings(database_url=db_url, results_dir=tmp_path / "results",
                              run_dispatcher=False))
    with TestClient(app) as client:
        token = create_token(app.state.components.sessions, "admin", admin=True)
        yield app, client, bearer(token)


@contextlib.contextmanager
def counting():
    """Counts the SQL statements of every engine of the process (the service's and
    the Optuna storage's) while the block runs."""
    seen = []

    def count(*args) -> None:
        seen.append(1)

    sa.event.listen(sa.Engine, "before_cursor_execute", count)
    try:
        yield seen
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", count)


def _fill(storage, name: str, n: int, objectives: int) -> optuna.Study:
    """``n`` trials written whole (COMPLETE, PRUNED, FAIL; random values), one RUNNING."""
    study = optuna.load_study(study_name=name, storage=storage)
    rng = random.Random(n)
    states = [TrialState.COMPLETE] * 4 + [TrialState.PRUNED, TrialState.FAIL]
    for i in range(n - 1):
        state = states[i % 6]
        values = [rng.random() for _ in range(objectives)]
        curve = {10: rng.random(), 20: float("nan")} if objectives == 1 else {}
        study.add_trial(optuna.trial.create_trial(
            state=state, values=values if state == TrialState.COMPLETE else None,
            params={"lr": 10 ** rng.uniform(-3, -1)}, distributions=DISTS,
            intermediate_values=curve, user_attrs={"device_seconds": 1.5, "i": i}))
    study.ask(DISTS)
    return study


def _summarize(app, name: str) -> None:
    """Store the summary the study's driver would have kept (the trials here are written
    behind the service's back, without a driver)."""
    record_summary(app, name)


def _json(trial: optuna.trial.FrozenTrial, intermediate: bool) -> dict:
    return json.loads(TrialOut.of(trial, intermediate).model_dump_json())


@pytest.mark.slow  # 4-9 s here (2 idle cores)
@pytest.mark.parametrize("objectives", [1, 2])
def test_study_view_trials_page_and_stop_cost_the_same_statements_at_20_and_520_trials(
        world, objectives):
    app, client, h = world
    storage = app.state.components.studies.storage
    objective = ({"metric": "val_accuracy"} if objectives == 1 else
                 [{"metric": "val_accuracy"}, {"metric": "val_loss"}])
    costs = {}
    for n in SIZES:
        name = f"s{n}"
        assert client.post("/v1/studies", json=tiny_spec(name, n_trials=n, objective=objective),
                           headers=h).status_code == 201
        study = _fill(storage, name, n, objectives)
        _summarize(app, name)
        trials = study.get_trials()
        best = [study.best_trial] if objectives == 1 else study.best_trials
        offset = n // 2 - 5
        with counting() as view_cost:
            view = client.get(f"/v1/studies/{name}", headers=h).json()
        with counting() as page_cost:
            page = client.get(f"/v1/studies/{name}/trials?offset={offset}&limit=100"
                              "&intermediate=true", headers=h).json()
        with counting() as bare_cost:
            bare = client.get(f"/v1/studies/{name}/trials?limit=100", headers=h).json()
        with counting() as one_cost:
            one = client.get(f"/v1/studies/{name}/trials/{n - 2}", headers=h).json()
        with counting() as stop_cost:
            stopped = client.post(f"/v1/studies/{name}/stop", headers=h).json()
        costs[n] = {"view": len(view_cost), "page": len(page_cost), "bare": len(bare_cost),
                    "trial": len(one_cost), "stop": len(stop_cost)}
        # the answers are Optuna's own view of the study
        assert view["best_trials"] == [_json(t, False) for t in best] and best
        assert stopped["best_trials"] == view["best_trials"]
        assert stopped["status"] == "STOPPED"
        assert page["total"] == n and page["items"] == [
            _json(t, True) for t in trials[offset:offset + 100]]
        assert bare["items"] == [_json(t, False) for t in trials[:100]]
        assert one == _json(trials[n - 2], True)
    assert costs[SIZES[0]] == costs[SIZES[1]]
    assert max(costs[SIZES[1]].values()) <= 20  # a few per request, none per trial
