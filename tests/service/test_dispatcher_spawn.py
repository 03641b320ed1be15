"""A claimed study whose driver cannot start (``Dispatcher._spawn``), without Ray: its own
folder's failure ends it FAILED; a process that could not start puts it back in the queue.

Found by an operations tester: with ``HPO_RESULTS_DIR`` a regular file, a study stayed
RUNNING 0/2 with no error, taken over again every 30 s (``NotADirectoryError`` in the
dispatcher's round, each counted in ``hpo_study_takeovers_total``), holding a running slot.
"""

from __future__ import annotations

import errno
import subprocess
import sys

import pytest
import sqlalchemy as sa

from service import dispatcher as dispatcher_module
from service.app import create_app
from service.auth import create_token
from service.db import StudyRow
from service.dispatcher import Dispatcher
from service.driver_process import DriverProcess
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec

FOLDER_FAILED = "the study driver cannot start: its folder in HPO_RESULTS_DIR cannot be used"


class SleepingPool:
    """Starts a sleeping process instead of a study driver; ``fail_next`` raises instead."""

    def __init__(self) -> None:
        self.fail_next: OSError | None = None
        self.started: list[DriverProcess] = []

    def start(self, name: str, claim: str, log_path) -> DriverProcess:
        if self.fail_next is not None:
            e, self.fail_next = self.fail_next, None
            raise e
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.started.append(DriverProcess(name, claim, proc, log_path))
        return self.started[-1]

    def keep_warm(self) -> None:
        pass

    def close(self, grace_s: float) -> None:
        pass


@pytest.fixture
def world(db_url, tmp_path):
    """An app on ``db_url`` (one running study at most), a member's token, a dispatcher
    whose drivers sleep, and ``submit``."""
    settings = Settings(database_url=db_url, results_dir=tmp_path / "results",
                        run_dispatcher=False, max_running_studies=1, warm_drivers=False)
    app = create_app(settings)
    c = app.state.components
    token = create_token(c.sessions, "alice")
    d = Dispatcher(settings, c.sessions, c.studies)
    d.pool = SleepingPool()
    with TestClient(app) as client:
        def submit(*names: str) -> None:
            for name in names:
                assert client.post("/v1/studies", json=tiny_spec(name),
                                   headers=bearer(token)).status_code == 201

        def shown(name: str) -> dict:
            return client.get(f"/v1/studies/{name}", headers=bearer(token)).json()

        yield app, d, submit, shown
    for driver in d.pool.started:
        driver.proc.kill()
        driver.proc.wait()


def _row(app, name: str) -> StudyRow:
    with app.state.components.sessions() as session:
        return session.execute(sa.select(StudyRow).where(StudyRow.name == name)).scalar_one()


def test_a_study_whose_folder_is_a_file_ends_failed_and_the_next_takes_its_slot(world):
    app, d, submit, shown = world
    submit("rostudy", "next")
    (d.settings.results_dir / "rostudy").parent.mkdir(parents=True)
    (d.settings.results_dir / "rostudy").touch()
    d.run_once()
    row = _row(app, "rostudy")
    reason = f"{FOLDER_FAILED} (Not a directory)"
    assert (row.status, row.error, row.ended_at is not None) == ("FAILED", reason, True)
    assert shown("rostudy")["error"] == reason  # one line, no path, to its member owner
    assert _row(app, "next").status == "RUNNING" and list(d.drivers) == ["next"]
    assert (d.takeovers, d.restarts) == (0, 0)


def test_a_results_dir_that_became_a_file_fails_the_study_once_without_takeovers(world):
    app, d, submit, shown = world
    submit("s")
    d.settings.results_dir.touch()  # the tester's HPO_RESULTS_DIR=afile
    d.run_once()
    d.run_once()  # before: a takeover each round (every heartbeat_timeout_s)
    row = _row(app, "s")
    assert (row.status, row.error) == ("FAILED", f"{FOLDER_FAILED} (Not a directory)")
    assert (d.drivers, d.takeovers, d.restarts) == ({}, 0, 0)


def test_a_folder_failing_for_want_of_file_descriptors_queues_the_study_again(
        world, monkeypatch):
    """EMFILE, ENFILE, ENOMEM, EAGAIN...: the service's trouble of the moment, not the
    folder's: the study goes back to the queue, its start undone, and starts later."""
    app, d, submit, shown = world
    submit("s")

    def no_descriptors(*args, **kwargs):
        raise OSError(errno.EMFILE, "Too many open files")

    monkeypatch.setattr(dispatcher_module, "open", no_descriptors, raising=False)
    d.run_once()
    row = _row(app, "s")
    assert (row.status, row.claimed_by, row.attempts, row.started_at, row.error) == (
        "QUEUED", None, 0, None, None)
    monkeypatch.undo()
    d.run_once()
    row = _row(app, "s")
    assert (row.status, row.attempts, list(d.drivers)) == ("RUNNING", 1, ["s"])


def test_a_driver_process_that_cannot_be_started_queues_its_study_again(world):
    """fork's EAGAIN (the process limit): the next round starts it; no takeover counted."""
    app, d, submit, shown = world
    submit("s")
    d.pool.fail_next = BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    d.run_once()
    row = _row(app, "s")
    assert (row.status, row.claimed_by, row.attempts, row.error, d.drivers) == (
        "QUEUED", None, 0, None, {})
    assert shown("s")["status"] == "QUEUED"
    d.run_once()
    assert (_row(app, "s").status, list(d.drivers), d.takeovers, d.restarts) == (
        "RUNNING", ["s"], 0, 0)


def test_a_taken_over_study_queued_again_keeps_its_first_start(world):
    """A study that ran before keeps its ``started_at`` and earlier attempts."""
    app, d, submit, shown = world
    submit("s")
    d.run_once()
    first = _row(app, "s")
    d.drivers.pop("s").proc.kill()
    with app.state.components.sessions.begin() as session:  # its driver vanished
        session.execute(sa.update(StudyRow).where(StudyRow.name == "s").values(
            heartbeat_at=None))
    d.pool.fail_next = BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    d.run_once()
    row = _row(app, "s")
    assert (row.status, row.attempts, row.started_at) == ("QUEUED", 1, first.started_at)
    assert (d.takeovers, d.restarts) == (0, 0)
