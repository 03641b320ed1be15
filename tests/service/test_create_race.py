"""A create that loses the race for a name answers 409 only once the winner's create has
finished, so a read right after the 409 finds the study; if the winner's create was
undone, the loser's goes on. On SQLite and PostgreSQL (where the create's first statement
inserts the row and the Optuna study together)."""

from __future__ import annotations

import threading
import time

import pytest
import sqlalchemy as sa

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
