"""The aggregate reads over Optuna's tables agree with Optuna's own API (SQLite, PostgreSQL)."""

from __future__ import annotations

import datetime as dt

import optuna
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
    assert counts["one"] == optuna_sql.TrialCounts(complete=3, pruned=2, failed=1)
    assert counts["one"].budget_used == 6
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
