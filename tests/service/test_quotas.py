"""Per-owner quotas (issue 15.2): trial slots taken and given back, limits, waiting studies,
the dispatcher, the study read, ``hpo status``, /metrics, and a real study under a quota."""

from __future__ import annotations

import datetime as dt
import threading
import time

import pytest
import sqlalchemy as sa

from hpo.gate import TrialResources
from service import quotas
from service.app import create_app
from service.auth import create_token
from service.db import QuotaRow, Status, StudyRow, TokenRow, TrialSlotRow, UsageEventRow, utcnow
from service.quotas import Limits, QuotaGate, Use, refusal
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec
from tests.service.test_dispatcher import RecordingDispatcher, dispatcher_settings

CPU = TrialResources(gpus=0.0, devices=1.0)
GPU = TrialResources(gpus=1.0, devices=1.0)


@pytest.fixture
def world(db_url, tmp_path):
    """An app on ``db_url`` (SQLite and PostgreSQL), tokens alice and bob, and helpers."""
    settings = dispatcher_settings(db_url, tmp_path)
    app = create_app(settings)
    c = app.state.components
    tokens = {n: create_token(c.sessions, n) for n in ("alice", "bob")}
    with TestClient(app) as client:
        yield World(app, client, tokens, settings)


class World:
    def __init__(self, app, client, tokens, settings) -> None:
        self.app, self.client, self.tokens, self.settings = app, client, tokens, settings
        self.sessions = app.state.components.sessions
        self.dispatchers: list[RecordingDispatcher] = []

    def owner(self, name: str) -> int:
        with self.sessions() as s:
            return s.execute(sa.select(TokenRow.id).where(TokenRow.name == name)).scalar_one()

    def quota(self, name: str, **limits) -> None:
        with self.sessions.begin() as s:
            s.merge(QuotaRow(owner_id=self.owner(name), **limits))

    def submit(self, owner: str, name: str, **changes) -> None:
        r = self.client.post("/v1/studies", json=tiny_spec(name, **changes),
                             headers=bearer(self.tokens[owner]))
        assert r.status_code == 201, r.text

    def running(self, owner: str, name: str, **changes) -> QuotaGate:
        """A study of ``owner`` made RUNNING under a claim, as a driver holds it; its gate."""
        self.submit(owner, name, **changes)
        with self.sessions.begin() as s:
            row = s.execute(sa.select(StudyRow).where(StudyRow.name == name)).scalar_one()
            row.status, row.claimed_by = Status.RUNNING, f"claim-{name}"
            row.heartbeat_at = utcnow()  # its driver is alive
            return QuotaGate(self.sessions, row.id, row.claimed_by)

    def row(self, name: str) -> StudyRow:
        with self.sessions() as s:
            return s.execute(sa.select(StudyRow).where(StudyRow.name == name)).scalar_one()

    def n_slots(self) -> int:
        with self.sessions() as s:
            return s.execute(sa.select(sa.func.count()).select_from(TrialSlotRow)).scalar_one()

    def events(self) -> list[float]:
        with self.sessions() as s:
            return sorted(s.execute(sa.select(UsageEventRow.device_seconds)).scalars())

    def use_event(self, name: str, seconds: float, hours_ago: float) -> None:
        with self.sessions.begin() as s:
            s.add(UsageEventRow(owner_id=self.owner(name), device_seconds=seconds,
                                ended_at=utcnow() - dt.timedelta(hours=hours_ago)))

    def dispatcher(self, **changes) -> RecordingDispatcher:
        d = RecordingDispatcher(Settings(**{**self.settings.__dict__, **changes}),
                                self.sessions, self.app.state.components.studies)
        self.dispatchers.append(d)
        return d


@pytest.fixture
def w(world):
    yield world
    for d in world.dispatchers:
        d.kill_all()


def test_refusal_names_the_limit_and_the_numbers():
    use = Use(running_trials=1, gpus=1.0, device_seconds_24h=3600.0, device_seconds_total=7200)
    assert refusal(Limits(), use, 1.0) is None
    assert refusal(Limits(max_running_trials=1), use, 0.0) == \
        "quota max_running_trials: 1 of 1 trials running"
    assert refusal(Limits(max_running_trials=2), use, 0.0) is None
    assert refusal(Limits(max_gpus=1.5), use, 1.0) == \
        "quota max_gpus: 1 of 1.5 GPUs held, a trial needs 1"
    assert refusal(Limits(max_gpus=1.5), use, 0.5) is None
    assert refusal(Limits(max_gpus=1.5), use, 0.0) is None  # a CPU trial holds no GPU
    assert refusal(Limits(device_seconds_per_day=3600), use, 0.0) == \
        "quota device_seconds_per_day: 3600 of 3600 used in the last 24 h"
    assert refusal(Limits(device_seconds_total=7201), use, 0.0) is None
    assert refusal(Limits(device_seconds_total=7200), use, 0.0) == \
        "quota device_seconds_total: 7200 of 7200 used"


def test_running_trials_quota_waits_then_starts_as_the_other_trial_ends(w):
    w.quota("alice", max_running_trials=1)
    one, two = w.running("alice", "one"), w.running("alice", "two")
    assert one.acquire("t1", CPU) is True
    assert two.acquire("t2", CPU) is False
    assert w.row("two").waiting_for == "quota max_running_trials: 1 of 1 trials running"
    assert w.row("two").status == Status.RUNNING and w.n_slots() == 1
    one.release("t1", 12.5)
    assert w.events() == [12.5] and w.n_slots() == 0
    assert two.acquire("t2", CPU) is True
    assert w.row("two").waiting_for is None and w.n_slots() == 1


def test_another_owner_is_not_held_by_alices_quota(w):
    w.quota("alice", max_running_trials=1)
    a, b = w.running("alice", "a"), w.running("bob", "b")
    assert a.acquire("t1", CPU) is True
    assert b.acquire("t1", CPU) is True and b.acquire("t2", CPU) is True
    assert a.acquire("t2", CPU) is False


def test_gpu_quota_sums_the_gpus_of_running_trials(w):
    w.quota("alice", max_gpus=2.0)
    g = w.running("alice", "g")
    assert g.acquire("t1", GPU) and g.acquire("t2", GPU)
    assert g.acquire("t3", GPU) is False
    assert w.row("g").waiting_for == "quota max_gpus: 2 of 2 GPUs held, a trial needs 1"
    assert g.acquire("cpu-trial", CPU) is True  # holds no GPU
    g.release("t1", 1.0)
    assert g.acquire("t3", GPU) is True


def test_device_seconds_per_day_count_only_the_last_24_hours(w):
    w.quota("alice", device_seconds_per_day=100.0)
    w.use_event("alice", 500.0, hours_ago=25)  # out of the window
    w.use_event("alice", 60.0, hours_ago=2)
    d = w.running("alice", "d")
    assert d.acquire("t1", CPU) is True
    d.release("t1", 40.0)  # 60 + 40 = the limit
    assert d.acquire("t2", CPU) is False
    assert w.row("d").waiting_for == \
        "quota device_seconds_per_day: 100 of 100 used in the last 24 h"
    with w.sessions.begin() as s:  # time passes: the 60 s fall out of the window
        s.execute(sa.update(UsageEventRow).where(UsageEventRow.device_seconds == 60.0)
                  .values(ended_at=utcnow() - dt.timedelta(hours=24, seconds=1)))
    assert d.acquire("t2", CPU) is True


def test_device_seconds_total_counts_everything_and_running_trials_so_far(w):
    w.quota("alice", device_seconds_total=1000.0)
    w.use_event("alice", 990.0, hours_ago=100)
    d = w.running("alice", "d")
    assert d.acquire("t1", CPU) is True
    with w.sessions.begin() as s:  # t1 has run for 20 s: 990 + 20 >= 1000
        s.execute(sa.update(TrialSlotRow).values(started_at=utcnow() - dt.timedelta(
            seconds=20)))
    assert d.acquire("t2", CPU) is False
    with w.sessions() as s:
        use = quotas.use_of(s, [w.owner("alice")])[w.owner("alice")]
    assert use.running_trials == 1 and 1010 <= use.device_seconds_total < 1020
    assert 20 <= use.device_seconds_24h < 30


def test_a_driver_that_lost_its_claim_takes_no_slot(w):
    g = w.running("alice", "lost")
    with w.sessions.begin() as s:
        s.execute(sa.update(StudyRow).values(claimed_by="someone-else"))
    assert g.acquire("t1", CPU) is False and w.n_slots() == 0


def test_concurrent_drivers_of_one_owner_never_take_more_than_its_quota(w):
    w.quota("alice", max_running_trials=2)
    gates = [w.running("alice", f"c{i}") for i in range(4)]
    barrier = threading.Barrier(8)
    got: list[bool] = []

    def take(gate: QuotaGate, trial: str) -> None:
        barrier.wait()
        got.append(gate.acquire(trial, CPU))

    threads = [threading.Thread(target=take, args=(g, f"t{k}")) for g in gates for k in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == [False] * 6 + [True] * 2 and w.n_slots() == 2


def test_sweep_gives_back_slots_of_studies_that_no_longer_run(w):
    a, b = w.running("alice", "ended"), w.running("alice", "alive")
    assert a.acquire("t1", CPU) and b.acquire("t1", CPU)
    with w.sessions.begin() as s:
        s.execute(sa.update(StudyRow).where(StudyRow.name == "ended")
                  .values(status=Status.FAILED))
        s.execute(sa.update(TrialSlotRow).values(started_at=utcnow() - dt.timedelta(
            seconds=30)))
    with w.sessions.begin() as s:
        assert quotas.sweep(s) == 1
    assert w.n_slots() == 1 and len(w.events()) == 1 and 30 <= w.events()[0] < 40
    a.release("t1", 5.0)  # the dead driver's late release records nothing twice
    assert len(w.events()) == 1


def test_dispatcher_leaves_an_over_quota_owners_study_queued_and_starts_anothers(w):
    w.quota("alice", max_running_trials=1)
    assert w.running("alice", "busy").acquire("t1", CPU)
    w.submit("alice", "a-waits")
    w.submit("bob", "b-runs")
    d = w.dispatcher()
    d.run_once()
    assert d.started == ["b-runs"]
    row = w.row("a-waits")
    assert row.status == Status.QUEUED
    assert row.waiting_for == "quota max_running_trials: 1 of 1 trials running"
    with w.sessions.begin() as s:  # alice's trial ends
        quotas.release(s, w.row("busy").id, "t1", 3.0)
    d.run_once()
    assert d.started == ["b-runs", "a-waits"]
    row = w.row("a-waits")
    assert row.status == Status.RUNNING and row.waiting_for is None


def test_a_waiting_study_stopped_before_it_ran_waits_for_nothing(w):
    w.quota("alice", max_running_trials=0)
    w.submit("alice", "a-stopped")
    w.dispatcher().run_once()
    assert w.row("a-stopped").waiting_for == "quota max_running_trials: 0 of 0 trials running"
    stopped = w.client.post("/v1/studies/a-stopped/stop", headers=bearer(w.tokens["alice"]))
    assert stopped.status_code == 202 and stopped.json()["status"] == "STOPPED"
    assert stopped.json()["waiting_for"] is None and w.row("a-stopped").waiting_for is None


def test_taking_over_a_study_gives_back_its_dead_drivers_slots(w):
    g = w.running("alice", "orphan")
    assert g.acquire("t1", CPU)
    with w.sessions.begin() as s:  # its driver stopped beating long ago
        s.execute(sa.update(StudyRow).values(heartbeat_at=utcnow() - dt.timedelta(hours=1)))
    d = w.dispatcher()
    d.run_once()
    assert d.started == ["orphan"] and w.n_slots() == 0 and len(w.events()) == 1


def test_study_read_shows_the_owners_quota_and_use_and_what_it_waits_for(w):
    w.quota("alice", max_running_trials=1, max_gpus=4.0)
    g, h = w.running("alice", "q1"), w.running("alice", "q2")
    assert g.acquire("t1", CPU) and not h.acquire("t1", CPU)
    body = w.client.get("/v1/studies/q2", headers=bearer(w.tokens["alice"])).json()
    assert body["waiting_for"] == "quota max_running_trials: 1 of 1 trials running"
    assert body["quota"]["limits"] == {"max_running_trials": 1, "max_gpus": 4.0,
                                       "device_seconds_per_day": None,
                                       "device_seconds_total": None}
    use = body["quota"]["use"]
    assert use["running_trials"] == 1 and use["gpus"] == 0.0
    assert 0 <= use["device_seconds_24h"] < 30
    assert w.client.get("/v1/studies/q2", headers=bearer(w.tokens["bob"])).status_code == 404


def test_metrics_show_limits_use_and_waiting_studies(w, monkeypatch):
    w.quota("alice", max_running_trials=1)
    g, h = w.running("alice", "m1"), w.running("alice", "m2")
    assert g.acquire("t1", GPU) and not h.acquire("t1", CPU)
    from service.metrics import StoreCollector

    families = {f.name: f for f in StoreCollector(w.sessions).collect()}
    samples = {(f, tuple(sorted(s.labels.items()))): s.value
               for f, fam in families.items() for s in fam.samples}
    assert samples[("hpo_quota_limit", (("limit", "max_running_trials"), ("owner", "alice")))
                   ] == 1
    assert samples[("hpo_owner_running_trials", (("owner", "alice"),))] == 1
    assert samples[("hpo_owner_gpus_held", (("owner", "alice"),))] == 1.0
    assert samples[("hpo_studies_waiting", ())] == 1


def test_hpo_status_prints_the_quota_and_what_the_study_waits_for(w, monkeypatch, capsys):
    from service import cli

    w.quota("alice", max_running_trials=1)
    g, h = w.running("alice", "s1"), w.running("alice", "s2")
    assert g.acquire("t1", CPU) and not h.acquire("t1", CPU)
    study = w.client.get("/v1/studies/s2", headers=bearer(w.tokens["alice"])).json()

    class Client:
        def study(self, name):
            return study

    monkeypatch.setattr(cli, "_client", lambda url, token: Client())
    monkeypatch.setattr(cli.out, "width", 200, raising=False)
    cli.status("s2")
    text = capsys.readouterr().out
    lines = {line.split(None, 1)[0] if not line.strip().startswith("waiting") else "waiting":
             " ".join(line.split()) for line in text.splitlines() if line.strip()}
    assert lines["waiting"] == "waiting for quota max_running_trials: 1 of 1 trials running"
    # the slot has been held a moment when the study is read: what the API said, rounded
    # (0 on an idle machine; a loaded one took 0.5 s or more between the two, and said 1)
    held = study["quota"]["use"]
    assert held["device_seconds_24h"] == held["device_seconds_total"] < 5
    assert lines["quota"] == (f"quota trials 1/1, GPUs 0/-, device-s 24h "
                              f"{held['device_seconds_24h']:.0f}/-, total "
                              f"{held['device_seconds_total']:.0f}/-")


@pytest.mark.usefixtures("ray_session")
def test_a_study_of_four_concurrent_trials_under_a_one_trial_quota_runs_one_at_a_time(
        sqlite_url, tmp_path, monkeypatch):
    from service import worker

    monkeypatch.setattr(worker, "watch_for_interrupt", lambda event: None)  # no stdin here
    settings = Settings(database_url=sqlite_url, results_dir=tmp_path / "results",
                        run_dispatcher=False, warm_drivers=False, heartbeat_s=1.0)
    app = create_app(settings)
    c = app.state.components
    token = create_token(c.sessions, "alice")
    with c.sessions.begin() as s:
        owner = s.execute(sa.select(TokenRow.id).where(TokenRow.name == "alice")).scalar_one()
        s.add(QuotaRow(owner_id=owner, max_running_trials=1))
    with TestClient(app) as client:
        spec = tiny_spec("one-at-a-time", n_trials=4,
                         budget={"n_trials": 4, "max_concurrent_trials": 4},
                         resources={"cpus": 0.5})
        assert client.post("/v1/studies", json=spec, headers=bearer(token)).status_code == 201
    with c.sessions.begin() as s:
        s.execute(sa.update(StudyRow).values(status=Status.RUNNING, claimed_by="c1"))
    seen = {"slots": 0, "waiting": set()}
    done = threading.Event()

    def watch() -> None:
        while not done.is_set():
            with c.sessions() as s:
                n = s.execute(sa.select(sa.func.count()).select_from(TrialSlotRow)).scalar_one()
                seen["waiting"].add(s.execute(sa.select(StudyRow.waiting_for)).scalar_one())
            seen["slots"] = max(seen["slots"], n)
            time.sleep(0.05)

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        worker.drive(settings, c.sessions, "one-at-a-time", "c1")
    finally:
        done.set()
        watcher.join()
    with c.sessions() as s:
        row = s.execute(sa.select(StudyRow)).scalar_one()
        events = s.execute(sa.select(UsageEventRow.device_seconds)).scalars().all()
        slots = s.execute(sa.select(sa.func.count()).select_from(TrialSlotRow)).scalar_one()
    assert row.status == Status.COMPLETED and row.waiting_for is None, row.error
    assert seen["slots"] == 1 and slots == 0
    assert "quota max_running_trials: 1 of 1 trials running" in seen["waiting"]
    assert len(events) == 4 and all(e > 0 for e in events)
    body = TestClient(app).get("/v1/studies/one-at-a-time", headers=bearer(token)).json()
    assert body["counts"]["complete"] == 4 and body["counts"]["failed"] == 0


def test_a_database_error_makes_the_trial_wait_not_fail(w, monkeypatch):
    g = w.running("alice", "outage")

    def down(*args, **kwargs):
        raise sa.exc.OperationalError("SELECT 1", {}, Exception("connection refused"))

    monkeypatch.setattr(quotas, "acquire", down)
    assert g.acquire("t1", CPU) is False
    monkeypatch.setattr(quotas, "release", down)
    g.release("t1", 1.0)  # logged, not raised
    monkeypatch.undo()
    assert g.acquire("t1", CPU) is True


@pytest.mark.slow
def test_kill_9_of_the_server_leaks_no_slot_and_the_study_finishes_under_its_quota(
        server_process, sqlite_url):
    import os
    import signal

    import httpx

    from service.db import build_engine, create_tables, session_factory
    from tests.service.conftest import wait_for

    engine = build_engine(sqlite_url)
    create_tables(engine)
    sessions = session_factory(engine)
    token = create_token(sessions, "alice")
    with sessions.begin() as s:
        owner = s.execute(sa.select(TokenRow.id).where(TokenRow.name == "alice")).scalar_one()
        s.add(QuotaRow(owner_id=owner, max_running_trials=1))

    def count(model) -> int:
        with sessions() as s:
            return s.execute(sa.select(sa.func.count()).select_from(model)).scalar_one()

    server = server_process(sqlite_url)
    server.start()
    spec = tiny_spec("quota-kill", n_trials=4, budget={"n_trials": 4, "max_concurrent_trials": 4},
                     config={"max_epochs": 4, "micro_batch_size": 64, "width": 16},
                     resources={"cpus": 0.5})
    url = f"{server.url}/v1/studies"
    assert httpx.post(url, json=spec, headers=bearer(token), timeout=30).status_code == 201

    def study() -> dict:
        return httpx.get(f"{url}/quota-kill", headers=bearer(token), timeout=30).json()

    waiting = wait_for(lambda: study()["waiting_for"], what="the study to wait for its quota")
    assert waiting == "quota max_running_trials: 1 of 1 trials running"
    assert study()["status"] == "RUNNING" and study()["quota"]["use"]["running_trials"] == 1
    wait_for(lambda: count(TrialSlotRow) == 1, interval_s=0.05, what="a trial holding its slot")
    os.kill(server.proc.pid, signal.SIGKILL)  # its driver dies with it (die_with_parent)
    server.proc.wait()
    assert count(TrialSlotRow) == 1  # the killed driver's slot, until the sweep
    server.start()
    body = wait_for(lambda: (lambda b: b if b["status"] in ("COMPLETED", "FAILED") else None)(
        study()), what="the study to finish")
    assert body["status"] == "COMPLETED", body["error"]
    assert body["progress"]["finished"] == 4 and body["waiting_for"] is None
    assert body["quota"]["use"]["running_trials"] == 0 and count(TrialSlotRow) == 0
    assert count(UsageEventRow) >= 4
    engine.dispose()


def test_a_study_marked_for_requeue_takes_no_slot_and_one_holding_a_slot_is_not_marked(w):
    """The requeue and a slot never cross: a driver interrupted for a queued study has no
    trial to lose (the breaker saw a trial started in between end FAIL)."""
    marked, busy = w.running("alice", "r-marked"), w.running("alice", "r-busy")
    with w.sessions.begin() as s:
        assert quotas.mark_requeue(s, w.row("r-marked").id)
    assert marked.acquire("t1", CPU) is False and w.n_slots() == 0
    assert w.row("r-marked").waiting_for == quotas.REQUEUING
    assert busy.acquire("t1", CPU)
    with w.sessions.begin() as s:
        assert not quotas.mark_requeue(s, w.row("r-busy").id)
    assert w.row("r-busy").waiting_for is None and w.n_slots() == 1


def test_a_study_waiting_for_its_quota_gives_its_driver_up_to_a_queued_study(w, monkeypatch):
    from service import dispatcher as dispatcher_module
    from service.worker import finish

    monkeypatch.setattr(dispatcher_module, "PREEMPT_AFTER_S", 0.0)
    d = w.dispatcher(max_running_studies=1)
    w.submit("alice", "a-wait")
    d.run_once()
    w.quota("alice", device_seconds_per_day=10.0)
    w.use_event("alice", 20.0, hours_ago=1)
    row = w.row("a-wait")
    assert QuotaGate(w.sessions, row.id, row.claimed_by).acquire("t1", CPU) is False
    interrupted: list[str] = []
    d.drivers["a-wait"].interrupt = lambda: interrupted.append("a-wait")
    d.run_once()
    assert interrupted == []  # nothing queued could use the driver
    w.submit("alice", "a-queued")  # alice's own: over the same quota, cannot start either
    d.run_once()
    assert interrupted == []
    w.submit("bob", "b1")
    d.run_once()
    assert interrupted == ["a-wait"]
    finish(w.sessions, "a-wait", row.claimed_by, Status.QUEUED)  # the driver requeues it
    d.drivers["a-wait"].proc.kill()
    d.drivers["a-wait"].proc.wait()
    d.run_once()
    assert d.started == ["a-wait", "b1"]
    row = w.row("a-wait")
    assert row.status == Status.QUEUED
    assert row.waiting_for == "quota device_seconds_per_day: 20 of 10 used in the last 24 h"


def test_one_owners_quota_in_one_statement_equals_the_grouped_reads(w):
    """``quota_of`` (one statement, for study reads) gives what ``limits_of`` and ``use_of``
    give, for an owner with a quota, slots and events, one with none, and no owner."""
    now = utcnow().replace(microsecond=0)
    w.quota("alice", max_running_trials=3, max_gpus=2.0, device_seconds_total=1e6)
    a = w.running("alice", "a")
    assert a.acquire("t1", GPU) and a.acquire("t2", CPU)
    w.use_event("alice", 500.0, hours_ago=25)
    w.use_event("alice", 60.0, hours_ago=2)
    with w.sessions.begin() as s:
        s.execute(sa.update(TrialSlotRow).where(TrialSlotRow.trial == "t1")
                  .values(started_at=now - dt.timedelta(seconds=20)))
        s.execute(sa.update(TrialSlotRow).where(TrialSlotRow.trial == "t2")
                  .values(started_at=now - dt.timedelta(seconds=7), devices=2.0))
        s.add(UsageEventRow(owner_id=None, device_seconds=9.0, ended_at=now))
    with w.sessions() as s:
        for owner in (w.owner("alice"), w.owner("bob"), None):
            expected = quotas.OwnerQuota(quotas.limits_of(s, [owner])[owner],
                                         quotas.use_of(s, [owner], now)[owner])
            assert quotas.quota_of(s, owner, now) == expected
        assert quotas.quota_of(s, w.owner("alice"), now) == quotas.OwnerQuota(
            Limits(max_running_trials=3, max_gpus=2.0, device_seconds_total=1e6),
            Use(running_trials=2, gpus=1.0, device_seconds_24h=60.0 + 20.0 + 14.0,
                device_seconds_total=560.0 + 34.0))
        assert quotas.quota_of(s, None, now) == quotas.OwnerQuota(
            Limits(), Use(device_seconds_24h=9.0, device_seconds_total=9.0))
        assert quotas.quota_of(s, w.owner("bob"), now) == quotas.OwnerQuota(Limits(), Use())


@pytest.mark.parametrize("db_url", ["postgresql"], indirect=True)
def test_a_sweep_racing_the_trials_own_release_records_the_slot_once(w):
    """The trial's release has deleted its slot and not committed yet when a sweep of its
    study runs: the sweep waits on the row, then finds it gone, and the slot's time is
    recorded once, by the release (a sweep that read the slots first recorded it again;
    found by a review)."""
    g = w.running("alice", "racing")
    assert g.acquire("t1", CPU)
    with w.sessions.begin() as releasing:
        assert quotas.release(releasing, g.study_id, "t1", 2.0)
        swept: list[int] = []

        def sweep() -> None:
            with w.sessions.begin() as s:
                swept.append(quotas.sweep(s, [g.study_id]))

        sweeper = threading.Thread(target=sweep)
        sweeper.start()
        sweeper.join(1.0)
        assert sweeper.is_alive()  # waiting on the release's row lock
    sweeper.join(30)
    assert swept == [0] and w.n_slots() == 0 and w.events() == [2.0]


def test_one_owners_many_queued_studies_never_hide_anothers(w):
    """helper-39: the dispatcher weighed the 500 oldest QUEUED studies of all owners, so
    505 of one member's (over its quota, or merely first) kept every later owner's study
    QUEUED with the cluster idle."""
    w.quota("alice", max_running_trials=0)
    w.submit("alice", "a-0")
    spec, t0, alice = w.row("a-0").spec, w.row("a-0").created_at, w.owner("alice")
    with w.sessions.begin() as s:
        s.add_all([StudyRow(name=f"a-{i}", owner_id=alice, status=Status.QUEUED, spec=spec,
                            n_trials=1, created_at=t0 + dt.timedelta(microseconds=i))
                   for i in range(1, 520)])
    w.submit("bob", "b-late")
    d = w.dispatcher()
    d.run_once()
    assert d.started == ["b-late"]
    assert w.row("a-0").waiting_for == "quota max_running_trials: 0 of 0 trials running"


def test_an_owners_cpu_study_is_not_hidden_behind_its_gpu_studies_over_its_quota(w):
    """helper-40: with each owner's 20 oldest weighed, 20 GPU studies over a ``max_gpus``
    quota hid the owner's CPU study behind them, which could start."""
    w.quota("alice", max_gpus=1.0)
    assert w.running("alice", "holds-the-gpu").acquire("t1", GPU)
    w.submit("alice", "a-0")
    row, alice = w.row("a-0"), w.owner("alice")
    gpu_spec = {**row.spec, "resources": {**row.spec.get("resources", {}), "gpus": 1}}
    with w.sessions.begin() as s:
        s.execute(sa.update(StudyRow).where(StudyRow.id == row.id).values(spec=gpu_spec))
        s.add_all([StudyRow(name=f"a-gpu-{i}", owner_id=alice, status=Status.QUEUED,
                            spec=gpu_spec, n_trials=1,
                            created_at=row.created_at + dt.timedelta(microseconds=i))
                   for i in range(1, 30)])
    w.submit("alice", "a-cpu")  # the newest: behind 30 GPU studies
    d = w.dispatcher()
    d.run_once()
    assert d.started == ["a-cpu"]
    assert w.row("a-0").waiting_for == "quota max_gpus: 1 of 1 GPUs held, a trial needs 1"
