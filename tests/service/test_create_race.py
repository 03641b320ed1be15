"""A create that loses the race for a name answers 409 only once the winner's create has
finished, so a read right after the 409 finds the study; if the winner's create was
undone, the loser's goes on. On SQLite and PostgreSQL (where the create's first statement
inserts the row and the Optuna study together)."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
import sqlalchemy as sa

from service.auth import resolve
from service.db import Status, StudyRow
from service.settings import Settings
from tests.service.conftest import bearer, tiny_spec


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(database_url=db_url, results_dir=tmp_path / "results", run_dispatcher=False)


def _creating_row(app, name: str) -> None:
    with app.state.components.sessions.begin() as session:
        session.add(StudyRow(name=name, owner_id=None, status=Status.CREATING, spec={},
                             n_trials=1))


def _later(seconds: float, fn) -> threading.Thread:
    thread = threading.Thread(target=lambda: (time.sleep(seconds), fn()), daemon=True)
    thread.start()
    return thread


def test_a_409_waits_for_the_create_that_holds_the_name(client, tokens, app):
    _creating_row(app, "raced")
    sessions = app.state.components.sessions

    def finish() -> None:  # the winner's create ends: its row leaves CREATING
        with sessions.begin() as session:
            session.execute(sa.update(StudyRow).where(StudyRow.name == "raced")
                            .values(status=Status.QUEUED))

    _later(0.5, finish)
    started = time.monotonic()
    r = client.post("/v1/studies", json=tiny_spec("raced"), headers=bearer(tokens["alice"]))
    assert r.status_code == 409 and time.monotonic() - started >= 0.5
    with sessions() as session:
        assert session.execute(sa.select(StudyRow.status)
                               .where(StudyRow.name == "raced")).scalar() == Status.QUEUED


def test_a_create_goes_on_when_the_one_holding_the_name_is_undone(client, tokens, app):
    _creating_row(app, "undone")
    sessions = app.state.components.sessions

    def undo() -> None:
        with sessions.begin() as session:
            session.execute(sa.delete(StudyRow).where(StudyRow.name == "undone"))

    _later(0.3, undo)
    h = bearer(tokens["alice"])
    assert client.post("/v1/studies", json=tiny_spec("undone"), headers=h).status_code == 201
    assert client.get("/v1/studies/undone", headers=h).status_code == 200


def test_concurrent_creates_of_a_name_made_outside_all_say_so_and_leave_it_intact(
        client, tokens, app):
    """Each of 16 concurrent creates of a name an Optuna study made outside the service
    holds answers 409 "made outside" (on SQLite some answered "exists already" once their
    tries ran out behind the others' undone creates), and the study is left as it was."""
    storage = app.state.components.studies.storage
    study = optuna.create_study(study_name="theirs", storage=storage, direction="maximize")
    study.set_user_attr("owner", "them")
    study.enqueue_trial({"x": 1.0})
    h, answers = bearer(tokens["alice"]), []

    def create() -> None:
        r = client.post("/v1/studies", json=tiny_spec("theirs"), headers=h)
        answers.append((r.status_code, r.json()["error"]["message"]))

    threads = [threading.Thread(target=create) for _ in range(16)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    made_outside = ("a study named 'theirs' exists already in the Optuna storage, made "
                    "outside the service (directly with Optuna): choose another name")
    assert answers == [(409, made_outside)] * 16
    kept = optuna.load_study(study_name="theirs", storage=storage)
    assert kept.user_attrs == {"owner": "them"} and len(kept.trials) == 1
    assert kept.direction == optuna.study.StudyDirection.MAXIMIZE
    with app.state.components.sessions() as session:
        assert session.execute(sa.select(StudyRow)).first() is None


class _Crash(BaseException):
    """The process dying inside the create (what kill -9 does to its transaction)."""


def test_a_create_that_dies_midway_leaves_neither_its_row_nor_its_optuna_study(
        tokens, app, monkeypatch):
    """The CREATING row and the Optuna study are written together (one statement on
    PostgreSQL, one transaction elsewhere): a create that dies between them leaves
    nothing, so no later clean-up has to guess whose Optuna study a CREATING row's is."""
    from service import studies

    def dies(*args, **kwargs):
        raise _Crash

    monkeypatch.setattr(studies, "insert_study", dies)  # SQLite: after the row's INSERT
    monkeypatch.setattr(studies, "with_creating_row", dies)  # PostgreSQL: before its one
    c = app.state.components
    with pytest.raises(_Crash):
        c.studies.create(tiny_spec("cut"), resolve(c.sessions, tokens["alice"]))
    storage = c.studies.storage
    assert [s.study_name for s in storage.get_all_studies()] == []
    with app.state.components.sessions() as session:
        assert session.execute(sa.select(StudyRow)).first() is None
