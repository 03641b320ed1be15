"""The reads of a study agree with Optuna's own API (SQLite, PostgreSQL): pages of trials
read set-based over Optuna's tables, and the summary (counts, device-seconds, best trial,
Pareto front) that ``hpo.summary`` computes from a study's trials."""

from __future__ import annotations

import datetime as dt
import math
import random

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from hpo.storage import open_storage
from hpo.summary import StudySummary, SummaryTracker, TrialCounts
from service import optuna_sql


def _study(storage, name: str, states: list[TrialState]) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=storage)
    for i, state in enumerate(states):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        trial.set_user_attr("device_seconds", 1.5 * (i + 1))
        study.tell(trial, 0.5 if state == TrialState.COMPLETE else None, state=state)
    return study


def _summary(storage, name: str, devices_held: float = 1.0) -> StudySummary:
    """The summary a driver starting on the stored study would write."""
    return SummaryTracker.from_storage(storage, name, devices_held).summary()


def test_counts_ids_pages_and_device_seconds_match_optuna(db_url):
    storage = open_storage(db_url)
    states = [TrialState.COMPLETE] * 3 + [TrialState.PRUNED] * 2 + [TrialState.FAIL]
    _study(storage, "one", states)
    _study(storage, "two", [TrialState.COMPLETE])
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        counts = {name: _summary(storage, name).counts for name in ("one", "two")}
        counts["absent"] = TrialCounts()  # a study with no summary shows zero counts
        ids = optuna_sql.study_ids(conn, ["one", "two", "absent"])
        page = optuna_sql.trial_ids_page(conn, ids["one"], offset=2, limit=3)
        used = _summary(storage, "one", devices_held=1.0).device_seconds()
        n_one = optuna_sql.n_trials(conn, ids["one"])
    assert counts["one"] == TrialCounts(complete=3, pruned=2, failed=1)
    assert counts["one"].budget_used == 6
    assert n_one == counts["one"].total == 6
    assert counts["two"].finished == 1 and counts["absent"].total == 0
    assert ids == {name: storage.get_study_id_from_name(name) for name in ("one", "two")}
    assert [storage.get_trial(i).number for i in page] == [2, 3, 4]
    assert used == sum(1.5 * (i + 1) for i in range(6))
    engine.dispose()


def test_requeued_fail_trials_do_not_count_against_the_budget(db_url):
    storage = open_storage(db_url)
    study = _study(storage, "rq", [TrialState.COMPLETE, TrialState.FAIL])
    trial = study.ask()
    trial.set_user_attr("requeued", True)  # as hpo.record marks a lost driver's trial
    study.tell(trial, state=TrialState.FAIL)
    counts = _summary(storage, "rq").counts
    assert (counts.failed, counts.requeued, counts.finished, counts.budget_used) == (2, 1, 3, 2)


def test_device_seconds_counts_running_trials_from_their_start(db_url):
    storage = open_storage(db_url)
    study = optuna.create_study(study_name="live", storage=storage)
    study.ask()
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        sid = storage.get_study_id_from_name("live")
        start = storage.get_trial(optuna_sql.trial_ids_page(conn, sid, 0, 1)[0]).datetime_start
        later = start.astimezone(dt.UTC) + dt.timedelta(seconds=10)
        summary = _summary(storage, "live", devices_held=2.0)
        assert summary.device_seconds(now=later) == 20.0
        assert summary.counts.running == 1
        assert summary.device_seconds(now=later - dt.timedelta(seconds=60)) == 0.0  # never < 0
    engine.dispose()


DISTS = {"lr": optuna.distributions.FloatDistribution(1e-4, 0.3, log=True),
         "drop": optuna.distributions.FloatDistribution(0.0, 0.5, step=0.1),
         "width": optuna.distributions.IntDistribution(8, 64, step=8),
         "act": optuna.distributions.CategoricalDistribution(["relu", None, 2.5])}


def _varied_study(storage, name: str, directions: list[str], n: int,
                  constrained: bool = False) -> optuna.Study:
    """Trials of every state, every parameter kind, attributes, inf and NaN where allowed
    (written whole, one transaction each, as ``Study.add_trial`` does)."""
    study = optuna.create_study(study_name=name, storage=storage, directions=directions)
    rng = random.Random(n)
    states = [TrialState.COMPLETE] * 5 + [TrialState.PRUNED, TrialState.FAIL]
    for i in range(n):
        state = states[i % 7]
        values = [rng.random() for _ in directions]
        if i == 3:
            values[0] = float("-inf") if directions[0] == "minimize" else float("inf")
        curve = [rng.random(), float("nan"), float("inf")][: i % 4]
        study.add_trial(optuna.trial.create_trial(
            state=state, values=values if state == TrialState.COMPLETE else None,
            params={"lr": 10 ** rng.uniform(-4, -0.6), "drop": 0.1 * (i % 6),
                    "width": 8 * (1 + i % 8), "act": ["relu", None, 2.5][i % 3]},
            distributions=DISTS, user_attrs={"i": i, "nested": {"a": [i, None, "x"]}},
            system_attrs={"note": f"n{i}"},
            intermediate_values=({10 * s: v for s, v in enumerate(curve)}
                                 if len(directions) == 1 else {}),
            # Optuna's own key: feasible when every value is <= 0
            constraints={"c": rng.uniform(-1, 0.5)} if constrained else None))
    study.ask()  # RUNNING
    study.enqueue_trial({"lr": 0.01})  # WAITING, with Optuna's system attributes
    return study


def _plain(trial: optuna.trial.FrozenTrial) -> dict:
    """The trial's fields, NaN made comparable (NaN != NaN)."""
    fields = dict(trial.__dict__)
    fields["intermediate_values"] = {k: "NaN" if math.isnan(v) else v
                                     for k, v in trial.intermediate_values.items()}
    return fields


@pytest.mark.parametrize("directions", [["minimize"], ["maximize"]])
def test_load_trials_and_best_trial_equal_optunas_own_read(db_url, directions):
    storage = open_storage(db_url)
    study = _varied_study(storage, "so", directions, 40)
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        expected = study.get_trials()
        loaded = optuna_sql.load_trials(conn, [t._trial_id for t in reversed(expected)])
        bare = optuna_sql.load_trials(conn, [expected[1]._trial_id, 10**9],
                                      intermediate=False)
    best = _summary(storage, "so").best_trials()
    engine.dispose()
    assert [_plain(t) for t in loaded] == [_plain(t) for t in reversed(expected)]
    assert len(bare) == 1 and bare[0].intermediate_values == {}
    assert bare[0].params == expected[1].params and bare[0].values == expected[1].values
    assert best[0].values[0] in (float("inf"), float("-inf"))  # inf ranks like Optuna's
    best_expected = dict(_plain(study.best_trial), intermediate_values={})
    assert [_plain(t) for t in best] == [best_expected]


@pytest.mark.parametrize(("directions", "constrained"), [
    (["minimize", "maximize"], False), (["maximize", "maximize", "minimize"], False),
    (["minimize", "minimize"], True)])
def test_pareto_front_equals_optunas_best_trials(db_url, directions, constrained):
    storage = open_storage(db_url)
    study = _varied_study(storage, "mo", directions, 80, constrained=constrained)
    front = _summary(storage, "mo").best_trials()
    optuna.create_study(study_name="empty", storage=storage, directions=directions)
    none = _summary(storage, "empty").best_trials()
    expected = study.best_trials
    assert 1 <= len(expected) < 40 and none == []
    assert [t.number for t in front] == [t.number for t in expected]
    assert [_plain(t) for t in front] == [_plain(t) for t in expected]  # no curves: MO
