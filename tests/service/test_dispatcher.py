"""The dispatcher without Ray: claims, limits, take-overs, reaping, recovery, worker claims."""

from __future__ import annotations

import datetime as dt
import itertools
import os
import signal
import subprocess
import sys
import threading
import time

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from service import dispatcher as dispatcher_module
from service.app import create_app
from service.auth import create_token
from service.db import Status, StudyRow, utcnow
from service.dispatcher import Dispatcher
from service.driver_process import DriverProcess
from service.process import child_env
from service.settings import Settings
from tests.service.conftest import REPO, TestClient, bearer, record_summary, tiny_spec


class RecordingDispatcher(Dispatcher):
    """Starts a sleeping process instead of a study driver, and records what it started."""

    started: list[str]

    def _spawn(self, name: str, claim: str) -> None:
        self.started = getattr(self, "started", []) + [name]
        proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        self.drivers[name] = DriverProcess(name, claim, proc,
                                           self.settings.results_dir / "none.log")
        with self.sessions.begin() as session:
            session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(
                worker_pid=proc.pid))

    def kill_all(self) -> None:
        for driver in self.drivers.values():
            driver.proc.kill()
            driver.proc.wait()


def dispatcher_settings(db_url: str, tmp_path) -> Settings:
    """Settings of an app whose dispatchers the test makes and runs itself (two drivers at
    most, no warm spare)."""
    return Settings(database_url=db_url, results_dir=tmp_path / "results",
                    run_dispatcher=False, max_running_studies=2, warm_drivers=False)


@pytest.fixture
def world(db_url, tmp_path):
    """An app on ``db_url`` (SQLite and PostgreSQL) with a token and a dispatcher factory."""
    settings = dispatcher_settings(db_url, tmp_path)
    app = create_app(settings)
    c = app.state.components
    token = create_token(c.sessions, "alice")
    made: list[RecordingDispatcher] = []

    def dispatcher(**changes) -> RecordingDispatcher:
        d = RecordingDispatcher(Settings(**{**settings.__dict__, **changes}), c.sessions,
                                c.studies)
        made.append(d)
        return d

    with TestClient(app) as client:
        def submit(*names: str) -> None:
            for name in names:
                assert client.post("/v1/studies", json=tiny_spec(name),
                                   headers=bearer(token)).status_code == 201
        yield app, submit, dispatcher
    for d in made:
        d.kill_all()


def _rows(app) -> dict[str, StudyRow]:
    with app.state.components.sessions() as session:
        return {r.name: r for r in session.execute(sa.select(StudyRow)).scalars()}


def test_claims_oldest_queued_first_up_to_the_running_limit(world):
    app, submit, dispatcher = world
    submit("s1", "s2", "s3")
    d = dispatcher()
    d.run_once()
    assert d.started == ["s1", "s2"]
    rows = _rows(app)
    assert [rows[n].status for n in ("s1", "s2", "s3")] == ["RUNNING", "RUNNING", "QUEUED"]
    assert rows["s1"].claimed_by.startswith(d.id) and rows["s1"].attempts == 1
    assert rows["s1"].worker_pid == d.drivers["s1"].proc.pid
    d.run_once()
    assert d.started == ["s1", "s2"]


def test_two_dispatchers_racing_never_claim_one_study_twice(world):
    app, submit, dispatcher = world
    names = [f"r{i}" for i in range(8)]
    submit(*names)
    ds = [dispatcher(max_running_studies=8) for _ in range(4)]
    barrier = threading.Barrier(len(ds))

    def claim_all(d):
        barrier.wait()
        while d.claim_queued():
            pass

    threads = [threading.Thread(target=claim_all, args=(d,)) for d in ds]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    started = [name for d in ds for name in getattr(d, "started", [])]
    assert sorted(started) == names  # each once
    assert {r.status for r in _rows(app).values()} == {"RUNNING"}


def _set(app, name: str, **values) -> None:
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(**values))


def test_takes_over_a_running_study_whose_heartbeat_is_stale(world):
    app, submit, dispatcher = world
    submit("stale", "fresh")
    old = utcnow() - dt.timedelta(seconds=120)
    _set(app, "stale", status=Status.RUNNING, claimed_by="otherhost:1:x:y", heartbeat_at=old,
         attempts=1)
    _set(app, "fresh", status=Status.RUNNING, claimed_by="otherhost:1:x:z",
         heartbeat_at=utcnow(), attempts=1)
    d = dispatcher()
    d.run_once()
    assert d.started == ["stale"]
    rows = _rows(app)
    assert rows["stale"].claimed_by.startswith(d.id) and rows["stale"].attempts == 2
    assert rows["fresh"].claimed_by == "otherhost:1:x:z"


def test_takes_over_at_once_a_study_whose_driver_process_on_this_host_is_gone(world):
    app, submit, dispatcher = world
    submit("orphan", "alive")
    d = dispatcher()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    living = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for name, pid in (("orphan", dead.pid), ("alive", living.pid)):
            _set(app, name, status=Status.RUNNING, heartbeat_at=utcnow(), worker_pid=pid,
                 claimed_by=f"{d.host}:1:dead:beef")
        d.run_once()
        assert d.started == ["orphan"]
    finally:
        living.kill()
        living.wait()


def test_a_driver_that_dies_without_ending_its_study_fails_it_with_its_log(world):
    app, submit, dispatcher = world
    submit("crash")
    d = dispatcher()
    d.run_once()
    log_path = d.settings.results_dir / "crash.log"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_path.write_text("line one\nTraceback (most recent call last):\n"
                        '  File "/srv/hpo/hpo/tune/driver.py", line 3, in run_study\n'
                        "    boom()\nRuntimeError: boom in /srv/hpo/hpo-runs/crash\n")
    driver = d.drivers["crash"]
    driver.log_path = log_path
    driver.proc.kill()
    driver.proc.wait()
    d.reap()
    row = _rows(app)["crash"]
    # one line, no traceback, no path (issue 11); the service's log has the tail
    assert row.status == "FAILED" and row.error == (
        "the study driver ended with signal SIGKILL without a result; its log ends with: "
        "RuntimeError: boom in <path>")
    assert "crash" not in d.drivers


def test_the_trials_a_dead_driver_left_running_end_failed_with_its_reason_and_usage(world):
    """Found by the breaker: after ``kill -9`` of a driver its study ended FAILED, but the
    trial it ran stayed RUNNING for ever (its counts said running: 1 on a FAILED study)."""
    app, submit, dispatcher = world
    submit("orphaned")
    d = dispatcher()
    d.run_once()
    c = app.state.components
    study = optuna.load_study(study_name="orphaned", storage=c.studies.storage)
    lr = {"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)}
    done = study.ask(lr)
    done.set_user_attr("device_seconds", 2.5)
    study.tell(done, 0.5)
    running = [study.ask(lr) for _ in range(2)]  # as the driver's two trials in flight
    running[0].report(0.4, 1)
    study.enqueue_trial({"lr": 0.01})  # a point no driver will ask for now (helper-39)
    record_summary(app, "orphaned")  # the driver's last summary: 2 RUNNING
    time.sleep(0.2)
    d.drivers["orphaned"].proc.kill()
    d.drivers["orphaned"].proc.wait()
    d.reap()
    row = _rows(app)["orphaned"]
    assert row.status == "FAILED"
    trials = optuna.load_study(study_name="orphaned", storage=c.studies.storage).trials
    assert [t.state for t in trials] == [TrialState.COMPLETE] + [TrialState.FAIL] * 3
    for t in trials[1:]:
        assert t.user_attrs["fail_reason"] == row.error  # one line, no path
    for t in trials[1:3]:
        assert t.user_attrs["device_seconds"] == t.user_attrs["wall_time_s"] >= 0.2
    assert trials[3].user_attrs["device_seconds"] == trials[3].user_attrs["wall_time_s"] == 0
    assert trials[3].params == {"lr": 0.01}  # its point, as its parameters (helper-40)
    assert trials[1].intermediate_values == {1: 0.4}  # its curve kept
    answer = TestClient(app).get("/v1/studies/orphaned", headers=bearer(
        create_token(c.sessions, "reader", admin=True))).json()
    assert answer["counts"] == {"complete": 1, "pruned": 0, "failed": 3, "running": 0,
                                "waiting": 0, "requeued": 0}
    assert answer["device_seconds"] == pytest.approx(
        2.5 + sum(t.user_attrs["device_seconds"] for t in trials[1:]), abs=1e-6)


def test_a_driver_killed_after_its_stop_rule_fired_keeps_the_rule_in_its_study(world):
    """Found by the breaker: ``kill -9`` of a driver after ``stop_when`` fired (a trial
    still running) left the study FAILED with ``stop_reason`` null over REST, while the
    Optuna study kept the rule that fired."""
    app, submit, dispatcher = world
    submit("fired")
    d = dispatcher()
    d.run_once()
    c = app.state.components
    study = optuna.load_study(study_name="fired", storage=c.studies.storage)
    reason = "stop_when.target: trial 0's val_accuracy 0.9 reached the target 0.5"
    study.set_user_attr("stop_reason", reason)
    study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
    d.drivers["fired"].proc.kill()
    d.drivers["fired"].proc.wait()
    d.reap()
    answer = TestClient(app).get("/v1/studies/fired", headers=bearer(
        create_token(c.sessions, "reader", admin=True))).json()
    assert (answer["status"], answer["stop_reason"]) == ("FAILED", reason)
    assert answer["error"].startswith("the study driver ended with signal SIGKILL")


def test_start_up_ends_the_trials_left_running_in_studies_that_failed_before(world):
    """A study that ended FAILED with RUNNING trials under an earlier version (the breaker's
    ``k-a`` kept its trial RUNNING across restarts): the next start ends them FAIL."""
    app, submit, dispatcher = world
    submit("old-failure", "fine")
    c = app.state.components
    study = optuna.load_study(study_name="old-failure", storage=c.studies.storage)
    started = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
    record_summary(app, "old-failure")  # running: 1
    start = study.trials[started.number].datetime_start  # naive local time, as Optuna's
    failed_at = start.astimezone(dt.UTC) + dt.timedelta(seconds=5)  # 5 s after its start
    with c.sessions.begin() as session:  # no claim: the summary is written all the same
        session.execute(sa.update(StudyRow).where(StudyRow.name == "old-failure").values(
            status=Status.FAILED, claimed_by=None, error="the driver died",
            ended_at=failed_at))
        session.execute(sa.update(StudyRow).where(StudyRow.name == "fine").values(
            claimed_by="gone:1:abc"))
    fine = optuna.load_study(study_name="fine", storage=c.studies.storage)
    fine.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
    dispatcher().recover_interrupted_writes()
    (trial,) = optuna.load_study(study_name="old-failure", storage=c.studies.storage).trials
    assert trial.state == TrialState.FAIL and trial.user_attrs["fail_reason"] == \
        "the driver died"
    # counted to the study's end, not to this start (days later, found by the review)
    assert trial.user_attrs["device_seconds"] == pytest.approx(5.0, abs=0.01)
    assert fine.trials[0].state == TrialState.RUNNING  # a QUEUED study's: left alone
    answer = TestClient(app).get("/v1/studies/old-failure", headers=bearer(
        create_token(c.sessions, "reader", admin=True))).json()
    assert answer["counts"]["running"] == 0 and answer["counts"]["failed"] == 1
    assert answer["device_seconds"] == trial.user_attrs["device_seconds"]


def test_a_driver_that_raises_fails_its_study_with_one_line_without_traceback_or_path(
        world, monkeypatch, caplog):
    """The study's ``error`` is part of API answers: the exception's line, paths masked;
    the traceback goes to the driver's log."""
    import types

    from service import worker

    def run_study(*args, **kwargs):
        try:
            open("/srv/hpo/missing/results.json")  # noqa: SIM115 - raises
        except OSError as e:
            raise OverflowError(f"int too large in {e.filename}\n  File \"/srv/x.py\"") from e

    monkeypatch.setitem(sys.modules, "hpo.tune.driver", types.SimpleNamespace(
        run_study=run_study))
    monkeypatch.setattr(worker, "watch_for_interrupt", lambda event: None)
    app, submit, dispatcher = world
    submit("raises")
    d = dispatcher()
    d.run_once()
    worker.drive(d.settings, app.state.components.sessions, "raises", d.drivers["raises"].claim)
    row = _rows(app)["raises"]
    assert row.status == "FAILED" and row.error == "OverflowError: int too large in <path>"
    assert "Traceback (most recent call last)" in caplog.text  # in the driver's log
    with TestClient(app) as client:
        token = create_token(app.state.components.sessions, "root", admin=True)
        answer = client.get("/v1/studies/raises", headers=bearer(token)).json()
    assert answer["error"] == "OverflowError: int too large in <path>"


def test_a_stop_during_the_drivers_set_up_is_seen_before_its_first_trial(world, monkeypatch):
    """The driver's heartbeat reads the stop request every 2 s; the first poll of
    ``should_stop`` (made before the first trial starts) reads it at once."""
    import types

    from service import worker

    app, submit, dispatcher = world
    seen = []

    def run_study(*args, should_stop, **kwargs):
        with TestClient(app) as client:  # the stop arrives while the driver sets up
            token = create_token(app.state.components.sessions, "root", admin=True)
            answer = client.post("/v1/studies/late-stop/stop", headers=bearer(token))
            assert answer.status_code == 202 and answer.json()["status"] == "RUNNING"
        seen.append(should_stop())
        return types.SimpleNamespace(interrupted=False, stopped=seen[-1], stop_reason=None)

    monkeypatch.setitem(sys.modules, "hpo.tune.driver", types.SimpleNamespace(
        run_study=run_study))
    monkeypatch.setattr(worker, "watch_for_interrupt", lambda event: None)
    submit("late-stop")
    d = dispatcher(heartbeat_s=600.0, heartbeat_timeout_s=1800.0)
    d.run_once()
    worker.drive(d.settings, app.state.components.sessions, "late-stop",
                 d.drivers["late-stop"].claim)
    assert seen == [True]
    assert _rows(app)["late-stop"].status == "STOPPED"


@pytest.mark.parametrize("trials", [0, 1])
def test_a_study_stopped_before_its_driver_started_ends_without_the_study_driver(
        world, monkeypatch, db_url, trials):
    """A stop that came before the driver's first heartbeat, on a study with no trial in
    its record, ends the study STOPPED without importing ``hpo.tune.driver`` (Ray, torch)
    or running it; a study with a trial (a driver before this one started it) still goes
    through ``run_study``, which ends that trial."""
    import types

    from service import worker

    called = []

    def run_study(*args, should_stop, **kwargs):
        called.append(should_stop())
        return types.SimpleNamespace(interrupted=False, stopped=True, stop_reason=None)

    monkeypatch.setitem(sys.modules, "hpo.tune.driver", types.SimpleNamespace(
        run_study=run_study))
    monkeypatch.setattr(worker, "watch_for_interrupt", lambda event: None)
    app, submit, dispatcher = world
    submit("early-stop")
    d = dispatcher(heartbeat_s=600.0, heartbeat_timeout_s=1800.0)
    d.run_once()
    for _ in range(trials):
        optuna.load_study(study_name="early-stop", storage=db_url).ask()
    with TestClient(app) as client:
        token = create_token(app.state.components.sessions, "root", admin=True)
        answer = client.post("/v1/studies/early-stop/stop", headers=bearer(token))
        assert answer.status_code == 202 and answer.json()["status"] == "RUNNING"
    worker.drive(d.settings, app.state.components.sessions, "early-stop",
                 d.drivers["early-stop"].claim)
    assert called == ([True] if trials else [])
    row = _rows(app)["early-stop"]
    assert row.status == "STOPPED" and row.error is None and row.ended_at is not None


def test_a_cold_driver_imports_neither_torch_nor_ray_before_its_first_heartbeat():
    """What ``service.worker`` imports before it knows its study was not stopped: no torch
    (``hpo.lease`` imports the package ``trainers`` only when it asks about a pid), no Ray."""
    code = ("import sys, service.worker; "
            "print(sorted(m for m in ('torch', 'ray', 'trainers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                         text=True, check=True).stdout
    assert out.strip() == "[]"


def test_a_driver_that_ended_its_study_is_reaped_without_changing_it(world):
    app, submit, dispatcher = world
    submit("done")
    d = dispatcher()
    d.run_once()
    _set(app, "done", status=Status.COMPLETED)
    d.drivers["done"].proc.kill()
    d.drivers["done"].proc.wait()
    d.reap()
    assert _rows(app)["done"].status == "COMPLETED" and d.drivers == {}


def test_start_up_finishes_interrupted_deletes_and_undoes_old_creates(world):
    app, submit, dispatcher = world
    submit("deleting", "creating", "young")
    _set(app, "deleting", status=Status.DELETING)
    _set(app, "creating", status=Status.CREATING,
         created_at=utcnow() - dt.timedelta(seconds=600))
    _set(app, "young", status=Status.CREATING)  # another server may be creating it now
    dispatcher().recover_interrupted_writes()
    assert sorted(_rows(app)) == ["young"]
    storage = app.state.components.studies.storage
    assert [s.study_name for s in storage.get_all_studies()] == ["young"]


def test_a_running_dispatcher_undoes_old_creates_every_interval(world):
    """A service started again within the grace of a crash found the crash's CREATING row
    young and kept it; its name stayed taken (409) until a later start. The running
    dispatcher undoes such creates too, at most every ``STALE_CREATES_EVERY_S``."""
    app, d = _left_young_and_queued(world, Status.CREATING, "created_at")
    d.undo_stale_creates = _counting(d.undo_stale_creates)
    d.run_once()
    assert d.undo_stale_creates.calls == 1
    assert sorted(_rows(app)) == ["queued", "young"]
    storage = app.state.components.studies.storage
    assert sorted(s.study_name for s in storage.get_all_studies()) == ["queued", "young"]
    d.run_once()  # within the interval: no second sweep
    assert d.undo_stale_creates.calls == 1


def test_a_running_dispatcher_finishes_old_deletes_every_interval(world):
    """A delete whose Optuna study kept gaining rows answers 503 and leaves its row
    DELETING, which reads and deletes no longer see: the running dispatcher finishes such
    deletes once they are ``CREATING_GRACE_S`` old, at its sweep; a young one it leaves."""
    app, d = _left_young_and_queued(world, Status.DELETING, "updated_at")
    d.run_once()
    assert sorted(_rows(app)) == ["queued", "young"]
    storage = app.state.components.studies.storage
    assert sorted(s.study_name for s in storage.get_all_studies()) == ["queued", "young"]


def _left_young_and_queued(world, status: Status, since: str):
    """Studies ``left`` (in ``status`` past the grace, by its column ``since``), ``young``
    (in ``status`` just now) and ``queued`` (QUEUED, ``since`` as old as ``left``'s), and a
    dispatcher whose sweep interval has passed."""
    import service.dispatcher

    app, submit, dispatcher = world
    submit("left", "young", "queued")
    old = utcnow() - dt.timedelta(seconds=service.dispatcher.CREATING_GRACE_S + 5)
    _set(app, "left", status=status, **{since: old})
    _set(app, "young", status=status)
    _set(app, "queued", **{since: old})
    d = dispatcher(max_running_studies=1)
    d._creates_swept_at = -1e9  # the interval has passed
    return app, d


def _counting(fn):
    def counted(*args, **kwargs):
        counted.calls += 1
        return fn(*args, **kwargs)
    counted.calls = 0
    return counted


def test_a_worker_without_its_claim_exits_75_and_leaves_the_study_alone(world, tmp_path):
    app, submit, dispatcher = world
    submit("claimed")
    _set(app, "claimed", status=Status.RUNNING, claimed_by="someone:1:else:x",
         heartbeat_at=utcnow())
    settings = app.state.components.settings
    env = {**os.environ, **settings.worker_env(), "HPO_PARENT_PID": str(os.getpid())}
    proc = subprocess.run([sys.executable, "-m", "service.worker", "claimed", "mine:1:2:3"],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 75, proc.stderr[-2000:]
    assert "claim mine:1:2:3 lost" in proc.stderr
    row = _rows(app)["claimed"]
    assert row.status == "RUNNING" and row.claimed_by == "someone:1:else:x"
    assert optuna.load_study(study_name="claimed",
                             storage=app.state.components.studies.storage).trials == []


@pytest.mark.slow  # 4.2-4.7 s here (2 idle cores)
def test_a_warm_driver_is_kept_while_idle_and_handed_the_next_study(world):
    app, submit, dispatcher = world
    d = Dispatcher(Settings(**{**dispatcher().settings.__dict__, "warm_drivers": True}),
                   app.state.components.sessions, app.state.components.studies)
    d.run_once()
    spare = d.pool.spare
    assert spare is not None and spare.poll() is None
    assert d.pool.wait_ready(180), "the warm driver never said ready"
    assert d.warm_driver() == "ready"
    submit("warm")
    # a claim the row does not hold: the warm driver must say so in the study's log and exit
    _set(app, "warm", status=Status.RUNNING, claimed_by="someone:else")
    d._spawn("warm", f"{d.id}:x")
    assert d.drivers["warm"].proc is spare and d.pool.spare is None  # no new import while busy
    assert d.warm_driver() == "none"
    assert spare.wait(180) == 75
    assert f"claim {d.id}:x lost" in d.drivers["warm"].log_path.read_text()
    d.drivers.clear()
    _set(app, "warm", status=Status.FAILED)
    d.run_once()  # idle again: a new warm driver
    assert d.pool.spare is not None and d.pool.spare is not spare
    assert d.warm_driver() in ("starting", "ready")
    d.shutdown(grace_s=5)
    assert d.pool.spare.poll() is not None


# a stand-in driver: dies with its parent as real drivers do, says so, and exits 0 when told
# to interrupt (what a real driver does after requeuing its study)
_INTERRUPTIBLE = ("from service.process import die_with_parent; die_with_parent(); "
                  "print('armed', flush=True); import sys; sys.stdin.readline()")


class InterruptibleDispatcher(Dispatcher):
    def _spawn(self, name: str, claim: str) -> None:
        proc = subprocess.Popen([sys.executable, "-c", _INTERRUPTIBLE], cwd=REPO,
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                env=child_env({}), start_new_session=True)
        self.drivers[name] = DriverProcess(name, claim, proc,
                                           self.settings.results_dir / "none.log")


def test_shutdown_interrupts_the_drivers_its_thread_started_instead_of_killing_them(world):
    """Linux sends the parent-death signal when the parent *thread* exits: the dispatcher's
    thread must outlive its drivers' interruption (all but the first warm driver were
    SIGKILLed at shutdown, their studies ending FAILED instead of QUEUED)."""
    app, submit, dispatcher = world
    d = InterruptibleDispatcher(Settings(**{**dispatcher().settings.__dict__,
                                            "dispatch_interval_s": 0.1}),
                                app.state.components.sessions, app.state.components.studies)
    submit("t1")
    d.start()
    deadline = time.monotonic() + 60
    while "t1" not in d.drivers and time.monotonic() < deadline:
        time.sleep(0.05)
    proc = d.drivers["t1"].proc
    assert proc.stdout.readline() == b"armed\n"  # its parent-death signal is set
    d.shutdown(grace_s=20)
    assert proc.returncode == 0, f"the driver ended with {proc.returncode}"


@pytest.mark.ray
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_warm_driver_whose_cluster_went_away_starts_afresh_and_fails_the_study_clearly(
        world):
    """The warm driver joined a cluster that then went away (stopped, or restarted: Ray
    aborts a stale connection at its first query): handed a study, it becomes a cold driver,
    which fails the study naming the cluster, instead of a Ray abort or a 60 s wait."""
    from service.server import LocalRay

    app, submit, dispatcher = world
    head = LocalRay(num_cpus=1)
    try:
        d = Dispatcher(Settings(**{**dispatcher().settings.__dict__, "warm_drivers": True,
                                   "ray_address": head.address,
                                   "ray_auth_mode": head.auth_mode}),
                       app.state.components.sessions, app.state.components.studies)
        d.run_once()
        assert d.pool.wait_ready(180) and d.warm_driver() == "ready"
    finally:
        head.stop()
    spare = d.pool.spare
    submit("gone")
    d.run_once()
    driver = d.drivers["gone"]
    driver.proc.wait(240)
    d.reap()
    row = _rows(app)["gone"]
    assert row.status == "FAILED"
    assert "ClusterError: cannot reach the Ray cluster" in row.error, row.error
    if driver.proc is spare:  # (Ray may also end a driver whose cluster died: then a cold one)
        assert "is stale" in driver.log_path.read_text()
    d.shutdown(grace_s=5)


@pytest.mark.slow  # 5.3 s here (2 idle cores)
@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_a_burst_of_wakes_gets_one_round_per_gap_and_every_study_is_claimed(world):
    """Each create wakes the dispatcher; a burst of wakes within ``MIN_ROUND_GAP_S`` runs
    one more round, not one each, and the round after the burst claims what it queued."""
    from service import dispatcher as dispatcher_module

    app, submit, dispatcher = world
    d = dispatcher(dispatch_interval_s=30.0, max_running_studies=5)
    rounds: list[float] = []  # when each round started
    run_once = d.run_once
    d.run_once = lambda: (rounds.append(time.monotonic()), run_once())
    d.start()
    try:
        while not rounds:
            time.sleep(0.01)
        t0 = time.monotonic()
        for i in range(4):  # 4 creates, each waking it, within about 0.1 s
            submit(f"b{i}")
            d.wake()
        deadline = time.monotonic() + 30
        while len(d.drivers) < 4 and time.monotonic() < deadline:
            time.sleep(0.01)
        elapsed = time.monotonic() - t0
        assert sorted(d.drivers) == ["b0", "b1", "b2", "b3"]
        gaps = [b - a for a, b in itertools.pairwise(rounds)]
        assert all(g >= dispatcher_module.MIN_ROUND_GAP_S for g in gaps), gaps
        assert len(rounds) - 1 <= elapsed / dispatcher_module.MIN_ROUND_GAP_S + 1
    finally:
        d.shutdown(grace_s=5)


def test_drivers_stopped_at_shutdown_before_they_requeue_put_their_studies_back(world):
    """A driver that does not requeue its study within the grace (still importing, on a
    loaded machine) is stopped; its study goes back to QUEUED with its stop request, never
    FAILED, and the next round claims it again."""
    app, submit, dispatcher = world
    submit("s1", "s2")
    d = dispatcher()
    d.run_once()  # the sleeping "drivers" ignore the interrupt
    assert sorted(d.drivers) == ["s1", "s2"]
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == "s2")
                        .values(stop_requested=True, waiting_for="quota max_gpus"))
    procs = [driver.proc for driver in d.drivers.values()]
    d.shutdown(grace_s=0.2)
    assert all(p.returncode is not None for p in procs) and not d.drivers
    rows = _rows(app)
    assert {n: (r.status, r.claimed_by, r.error, r.ended_at, r.stop_requested, r.waiting_for)
            for n, r in rows.items()} == {
        "s1": (Status.QUEUED, None, None, None, False, None),
        "s2": (Status.QUEUED, None, None, None, True, None)}
    again = dispatcher()
    again.run_once()
    assert sorted(again.started) == ["s1", "s2"]


@pytest.mark.slow  # 5.1 s here (2 idle cores)
def test_a_spare_whose_preload_fails_still_says_ready(tmp_path):
    """The spare's preload (the dashboard's libraries, Optuna's migrations) is a head start
    only: an install whose optuna-dashboard does not import leaves the spare ready, and the
    study that needs it fails later with the error in its log, instead of a spare that died
    before its log existed (found by a review)."""
    broken = tmp_path / "site" / "optuna_dashboard"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('a broken optuna-dashboard')\n")
    env = {**os.environ, "PYTHONPATH": f"{broken.parent}{os.pathsep}{REPO}",
           "HPO_DATABASE_URL": f"sqlite:///{tmp_path / 'hpo.db'}"}
    env.pop("RAY_ADDRESS", None)
    done = subprocess.run([sys.executable, "-m", "service.worker", "--warm"], input="",
                          capture_output=True, text=True, env=env, cwd=REPO, timeout=180)
    assert (done.returncode, done.stdout) == (0, "ready\n"), done.stderr


@pytest.mark.parametrize("how", ["silent", "deaf-to-its-stop"])
def test_a_hung_local_driver_is_killed_and_its_study_taken_over(world, monkeypatch, how):
    """helper-39: a driver of this process that hung (SIGSTOP for a deadlock) was trusted as
    long as its process lived: its study stayed RUNNING, its slot taken, its stop ignored."""
    app, submit, dispatcher = world
    monkeypatch.setattr(dispatcher_module, "LOCAL_PATIENCE_MIN_S", 0.0)
    submit("hung")
    d = dispatcher(heartbeat_s=0.1, heartbeat_timeout_s=0.5)  # patience: 1.5 s
    d.run_once()
    first = d.drivers["hung"]
    if how == "silent":
        _set(app, "hung", heartbeat_at=utcnow() - dt.timedelta(seconds=10))
    else:
        _set(app, "hung", heartbeat_at=utcnow(), stop_requested=True)
    d.run_once()  # not yet: younger than its patience
    assert d.started == ["hung"] and first.exit_code() is None
    time.sleep(1.6)
    if how != "silent":
        _set(app, "hung", heartbeat_at=utcnow())  # it beats, but never stops
    d.run_once()
    assert first.exit_code() == -signal.SIGKILL
    assert d.started == ["hung", "hung"]  # a new driver took the study over
    row = _rows(app)["hung"]
    assert row.status == "RUNNING" and row.attempts == 2
    assert row.claimed_by == d.drivers["hung"].claim != first.claim


def test_a_driver_beating_and_not_asked_to_stop_is_left_alone(world, monkeypatch):
    app, submit, dispatcher = world
    monkeypatch.setattr(dispatcher_module, "LOCAL_PATIENCE_MIN_S", 0.0)
    submit("busy")
    d = dispatcher(heartbeat_s=0.1, heartbeat_timeout_s=0.5)
    d.run_once()
    for _ in range(4):
        time.sleep(0.5)
        _set(app, "busy", heartbeat_at=utcnow())
        d.run_once()
    assert d.started == ["busy"] and d.drivers["busy"].exit_code() is None


def test_a_heartbeat_stale_after_a_database_outage_is_not_taken_for_a_hang(world, monkeypatch):
    """helper-40: after an outage every local driver's heartbeat was old at once; the
    patience counts from what the dispatcher saw, so one that beats again is left alone."""
    app, submit, dispatcher = world
    monkeypatch.setattr(dispatcher_module, "LOCAL_PATIENCE_MIN_S", 0.0)
    submit("outage")
    d = dispatcher(heartbeat_s=0.1, heartbeat_timeout_s=0.5)  # patience: 1.5 s
    d.run_once()
    _set(app, "outage", heartbeat_at=utcnow() - dt.timedelta(minutes=10))
    d.run_once()
    time.sleep(1.0)
    _set(app, "outage", heartbeat_at=utcnow())  # the database is back: it beats
    d.run_once()
    time.sleep(0.7)
    d.run_once()
    assert d.started == ["outage"] and d.drivers["outage"].exit_code() is None
