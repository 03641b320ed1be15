"""The aggregate reads over Optuna's tables agree with Optuna's own API (SQLite, PostgreSQL)."""

from __future__ import annotations

import datetime as dt
import math
import random

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from hpo.storage import open_storage
from service import optuna_sql


def _study(storage, name: str, states: list[TrialState]) -> optuna.Study:
    study = optuna.create_study(study_name=name, storage=storage)
    for i, state in enumerate(states):
        trial = study.ask({"x": optuna.distributions.FloatDistribution(0, 1)})
        trial.set_user_attr("device_seconds", 1.5 * (i + 1))
        study.tell(trial, 0.5 if state == TrialState.COMPLETE else None, state=state)
    return study


def test_counts_ids_pages_and_device_seconds_match_optuna(db_url):
    storage = open_storage(db_url)
    states = [TrialState.COMPLETE] * 3 + [TrialState.PRUNED] * 2 + [TrialState.FAIL]
    _study(storage, "one", states)
    _study(storage, "two", [TrialState.COMPLETE])
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        counts = optuna_sql.trial_counts(conn, ["one", "two", "absent"])
        ids = optuna_sql.study_ids(conn, ["one", "two", "absent"])
        page = optuna_sql.trial_ids_page(conn, ids["one"], offset=2, limit=3)
        used = optuna_sql.device_seconds(conn, ids["one"], devices_held=1.0)
        n_one = optuna_sql.n_trials(conn, ids["one"])
    assert counts["one"] == optuna_sql.TrialCounts(complete=3, pruned=2, failed=1)
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
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        counts = optuna_sql.trial_counts(conn, ["rq"])["rq"]
    engine.dispose()
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
        assert optuna_sql.device_seconds(conn, sid, devices_held=2.0, now=later) == 20.0
        assert optuna_sql.trial_counts(conn, ["live"])["live"].running == 1
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
        best = optuna_sql.best_trials(conn, study._study_id)
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
    engine = sa.create_engine(db_url)
    with engine.connect() as conn:
        front = optuna_sql.best_trials(conn, study._study_id)
        empty = optuna.create_study(study_name="empty", storage=storage, directions=directions)
        none = optuna_sql.best_trials(conn, empty._study_id)
    engine.dispose()
    expected = study.best_trials
    assert 1 <= len(expected) < 40 and none == []
    assert [t.number for t in front] == [t.number for t in expected]
    assert [_plain(t) for t in front] == [_plain(t) for t in expected]  # no curves: MO


def test_a_kept_pareto_front_follows_new_trials_and_a_study_made_again(db_url):
    storage = open_storage(db_url)
    engine = sa.create_engine(db_url)

    def front(study: optuna.Study) -> list[int]:
        with engine.connect() as conn:
            return [t.number for t in optuna_sql.best_trials(conn, study._study_id)]

    study = optuna.create_study(study_name="kept", storage=storage,
                                directions=["minimize", "minimize"])
    for values in ([2.0, 2.0], [3.0, 1.0]):
        study.add_trial(optuna.trial.create_trial(values=values))
    assert front(study) == [0, 1]
    assert front(study) == [0, 1]  # kept
    study.add_trial(optuna.trial.create_trial(values=[1.0, 1.0]))  # dominates both
    assert front(study) == [2]
    running = study.ask()
    assert front(study) == [2]  # a trial that has not completed changes nothing
    study.tell(running, [0.5, 3.0])
    assert front(study) == [2, 3] == [t.number for t in study.best_trials]
    optuna.delete_study(study_name="kept", storage=storage)
    again = optuna.create_study(study_name="kept", storage=storage,
                                directions=["minimize", "minimize"])
    for values in ([5.0, 5.0], [4.0, 6.0], [9.0, 9.0], [6.0, 4.0]):
        again.add_trial(optuna.trial.create_trial(values=values))
    assert front(again) == [0, 1, 3] == [t.number for t in again.best_trials]
    engine.dispose()
