"""Fair share (issue 15.3): the dispatcher starts next the queued study of the owner who
holds the least (fewest running trials, then fewest device-seconds in the last 24 h, then
the oldest study), not the oldest study."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa

from hpo.gate import TrialResources
from service.db import Status, StudyRow, UsageEventRow, utcnow
from service.quotas import QuotaGate
from tests.service.test_quotas import World, world  # noqa: F401 - the fixture

CPU = TrialResources(gpus=0.0, devices=1.0)


@pytest.fixture
def w(world):  # noqa: F811 - the fixture imported above
    yield world
    for d in world.dispatchers:
        d.kill_all()


def driver_of(w: World, name: str) -> QuotaGate:
    """The gate the study's driver uses, under the claim the dispatcher gave it."""
    row = w.row(name)
    return QuotaGate(w.sessions, row.id, row.claimed_by)


def end(w: World, d, name: str) -> None:
    """The study's driver writes its end and exits, as a real one does."""
    with w.sessions.begin() as s:
        s.execute(sa.update(StudyRow).where(StudyRow.name == name)
                  .values(status=Status.COMPLETED, ended_at=utcnow()))
    proc = d.drivers[name].proc
    proc.kill()
    proc.wait()


def test_with_one_running_study_a_second_owners_study_runs_second_not_fifth(w):
    d = w.dispatcher(max_running_studies=1)
    for i in range(1, 5):
        w.submit("alice", f"a{i}")
    d.run_once()  # the dispatcher is running: alice's first study starts at once
    w.submit("bob", "b1")
    for _ in range(4):
        name = d.started[-1]
        gate = driver_of(w, name)  # its one trial runs and ends: 3 device-seconds
        assert gate.acquire("t1", CPU)
        d.run_once()  # a full dispatcher: nothing else starts
        assert len(d.started) == len(set(d.started))
        gate.release("t1", 3.0)
        end(w, d, name)
        d.run_once()
    assert d.started == ["a1", "b1", "a2", "a3", "a4"]


def test_the_owner_holding_fewer_running_trials_goes_first_whatever_its_use(w):
    d = w.dispatcher(max_running_studies=2)
    w.submit("alice", "a-running")
    d.run_once()
    assert driver_of(w, "a-running").acquire("t1", CPU)
    with w.sessions.begin() as s:  # bob used far more device-seconds today, but holds none
        s.add(UsageEventRow(owner_id=w.owner("bob"), device_seconds=10_000.0,
                            ended_at=utcnow() - dt.timedelta(hours=1)))
    w.submit("alice", "a-queued")
    w.submit("bob", "b-queued")
    d.run_once()
    assert d.started == ["a-running", "b-queued"]


def test_with_equal_running_trials_fewer_device_seconds_in_24_hours_go_first(w):
    d = w.dispatcher(max_running_studies=1)
    with w.sessions.begin() as s:
        s.add(UsageEventRow(owner_id=w.owner("alice"), device_seconds=50.0,
                            ended_at=utcnow() - dt.timedelta(hours=3)))
        s.add(UsageEventRow(owner_id=w.owner("bob"), device_seconds=900.0,
                            ended_at=utcnow() - dt.timedelta(hours=25)))  # out of the window
        s.add(UsageEventRow(owner_id=w.owner("bob"), device_seconds=40.0,
                            ended_at=utcnow() - dt.timedelta(hours=1)))
    w.submit("alice", "a-old")
    w.submit("bob", "b-new")
    d.run_once()
    assert d.started == ["b-new"]


def test_with_nothing_held_or_used_the_oldest_study_goes_first(w):
    d = w.dispatcher(max_running_studies=1)
    w.submit("bob", "b-old")
    w.submit("alice", "a-new")
    d.run_once()
    assert d.started == ["b-old"]


def test_in_one_round_an_owner_with_a_study_just_started_waits_for_the_others(w):
    d = w.dispatcher(max_running_studies=3)
    w.submit("alice", "a1")
    w.submit("alice", "a2")
    w.submit("bob", "b1")
    w.submit("alice", "a3")
    d.run_once()  # a1 holds no slot yet when the round picks again
    assert d.started == ["a1", "b1", "a2"]
