"""One driver per study, and nothing stored for a study that cannot run."""

from __future__ import annotations

import socket
import time

import optuna
import pytest

from hpo.errors import SpecError, StudyBusyError
from hpo.lease import LEASE_ATTR, STALE_AFTER_S, DriverLease
from hpo.storage import open_storage
from hpo.tune.driver import run_study
from tests.hpo.test_driver import toy_spec


def _study(url: str) -> optuna.Study:
    return optuna.create_study(study_name="leased", storage=open_storage(url))


def test_a_second_driver_is_refused_while_the_first_lives(sqlite_url):
    study = _study(sqlite_url)
    with DriverLease(study):
        other = DriverLease(optuna.load_study(study_name="leased", storage=sqlite_url))
        with pytest.raises(StudyBusyError, match="being run by another driver"):
            other.__enter__()
        assert study.user_attrs[LEASE_ATTR]["heartbeat"] > time.time() - 10
    assert study.user_attrs[LEASE_ATTR] == {}  # released
    with DriverLease(study):  # and free again
        pass


@pytest.mark.parametrize("lease", [
    {"host": socket.gethostname(), "pid": 2**22 + 12345},  # its process is gone
    {"host": "elsewhere", "pid": 1, "heartbeat_age": STALE_AFTER_S + 5},  # silent too long
], ids=["dead-process", "stale-heartbeat"])
def test_a_dead_drivers_lease_is_taken_over(sqlite_url, lease):
    study = _study(sqlite_url)
    age = lease.pop("heartbeat_age", 0)
    study.set_user_attr(LEASE_ATTR, {"id": "old", "heartbeat": time.time() - age, **lease})
    with DriverLease(study) as taken:
        assert study.user_attrs[LEASE_ATTR]["id"] == taken.lease["id"]


@pytest.mark.ray
def test_run_study_refuses_a_busy_study(sqlite_url, tmp_path):
    spec = toy_spec("busy", budget={"n_trials": 1})
    run_study(spec, sqlite_url, results_dir=tmp_path)  # creates the study
    study = optuna.load_study(study_name="busy", storage=sqlite_url)
    study.set_user_attr(LEASE_ATTR, {"id": "x", "host": "elsewhere", "pid": 1,
                                     "heartbeat": time.time()})
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
