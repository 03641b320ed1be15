"""One driver per study, and nothing stored for a study that cannot run."""

from __future__ import annotations

import socket
import time

import optuna
import pytest
import sqlalchemy as sa

from hpo.errors import SpecError, StudyBusyError
from hpo.lease import LEASES, STALE_AFTER_S, DriverLease, create_table, read
from hpo.storage import open_storage
from hpo.tune.driver import run_study
from tests.hpo.test_driver import toy_spec


def _storage(url: str) -> optuna.storages.RDBStorage:
    storage = open_storage(url)
    optuna.create_study(study_name="leased", storage=storage)
    return storage


def test_a_second_driver_is_refused_while_the_first_lives(sqlite_url):
    storage = _storage(sqlite_url)
    with DriverLease(storage, "leased") as first:
        other = DriverLease(open_storage(sqlite_url), "leased")
        with pytest.raises(StudyBusyError, match="being run by another driver"):
            other.__enter__()
        assert read(storage.engine, "leased").heartbeat_at > time.time() - 10
        assert read(storage.engine, "leased").holder == first.holder
    assert read(storage.engine, "leased").holder is None  # released
    with DriverLease(storage, "leased"):  # and free again
        pass


def _hold(engine, name: str, holder: str, host: str, pid: int, heartbeat_at: float) -> None:
    create_table(engine)
    with engine.begin() as conn:
        conn.execute(sa.delete(LEASES).where(LEASES.c.name == name))
        conn.execute(sa.insert(LEASES).values(name=name, holder=holder, host=host, pid=pid,
                                              heartbeat_at=heartbeat_at))


@pytest.mark.parametrize("lease", [
    {"host": socket.gethostname(), "pid": 2**22 + 12345},  # its process is gone
    {"host": "elsewhere", "pid": 1, "heartbeat_age": STALE_AFTER_S + 5},  # silent too long
], ids=["dead-process", "stale-heartbeat"])
def test_a_dead_drivers_lease_is_taken_over(sqlite_url, lease):
    storage = _storage(sqlite_url)
    age = lease.pop("heartbeat_age", 0)
    _hold(storage.engine, "leased", "old", lease["host"], lease["pid"], time.time() - age)
    with DriverLease(storage, "leased") as taken:
        assert read(storage.engine, "leased").holder == taken.holder


@pytest.mark.ray
def test_run_study_refuses_a_busy_study(sqlite_url, tmp_path):
    spec = toy_spec("busy", budget={"n_trials": 1})
    run_study(spec, sqlite_url, results_dir=tmp_path)  # creates the study
    _hold(open_storage(sqlite_url).engine, "busy", "x", "elsewhere", 1, time.time())
    with pytest.raises(StudyBusyError):
        run_study(spec, sqlite_url, results_dir=tmp_path)


@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("changes, loc", [
    ({"resources": {"cpus": 1, "gpus": 2}}, "resources.gpus"),
    ({"resources": {"cpus": 1, "custom": {"tpu": 1}}}, "resources.custom.tpu"),
    ({"warm_start": [{"study": "missing"}]}, "warm_start.0.study"),
    ({"scheduler": {"name": "asha", "grace_period": 20}}, "scheduler.grace_period"),
], ids=["gpus", "custom", "warm-start", "grace-period"])
def test_a_study_that_cannot_run_is_not_stored(changes, loc, sqlite_url, tmp_path):
    spec = toy_spec("cannot-run", **changes)
    with pytest.raises(SpecError) as info:
        run_study(spec, sqlite_url, results_dir=tmp_path)
    assert info.value.errors[0]["loc"] == loc
    assert not open_storage(sqlite_url).get_all_studies()


def test_a_driver_that_lost_its_lease_knows_it(sqlite_url):
    """helper-40: a driver that lost its lease (a stall) must not end the WAITING trials
    of the driver that took the study over."""
    storage = open_storage(sqlite_url)
    with DriverLease(storage, "held") as lease:
        assert lease.held()
        with storage.engine.begin() as conn:  # another driver took it over
            conn.execute(LEASES.update().where(LEASES.c.name == "held")
                         .values(holder="someone-else"))
        assert not lease.held()


def test_a_database_that_does_not_answer_at_the_end_counts_as_not_holding():
    from hpo.tune.driver import _holds

    class Unreachable:
        def held(self):
            raise sa.exc.OperationalError("SELECT 1", {}, Exception("gone"))

    assert _holds(Unreachable()) is False
