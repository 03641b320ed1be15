"""The dispatcher: claims QUEUED studies and runs each one's driver in its own process.

One thread in the service process, every ``dispatch_interval_s``:

1. reaps finished drivers; a driver that died without writing its study's end
   (a crash, an out-of-memory kill) marks the study FAILED with its log's tail;
2. takes over RUNNING studies whose driver is gone: no heartbeat for
   ``heartbeat_timeout_s``, or a driver process on this machine that no longer
   exists (the service was killed, then started again). ``run_study`` then
   continues the study to exactly its ``n_trials``;
3. gives back the trial slots (``service.quotas``) of studies that no longer run;
4. claims QUEUED studies while fewer than ``max_running_studies`` drivers run here, by
   fair share (``service.quotas.pick_fair``): the study of the owner holding the fewest
   trial slots, then with the fewest device-seconds in the last 24 h, then with the fewest
   running studies, then the oldest;
   a study whose owner is over a quota stays QUEUED with ``waiting_for`` set;
5. when every driver is taken and a queued study may start, requeues (``interrupt``) one
   study driven here that has waited for its quota for ``PREEMPT_AFTER_S`` holding no
   trial slot: a study waiting for its owner's device-seconds would otherwise hold a driver
   for up to a day while other owners queue.

A claim is a lease (``hpo.lease``) kept in the study's row: taken by one guarded
update (``... WHERE status = 'QUEUED' AND claimed_by = <what was read>``, or ``WHERE
status = 'RUNNING' AND claimed_by = <the old claim>``), after a ``SELECT ... FOR
UPDATE SKIP LOCKED`` on PostgreSQL, so that two dispatchers never run one study. A
driver renews its claim at every heartbeat and exits if it lost it.

A claimed study whose driver cannot start ends FAILED when its own folder
(``<HPO_RESULTS_DIR>/NAME``) cannot be made or its log opened, and goes back to the queue
when the process could not be started (fork's EAGAIN, out of memory): ``Dispatcher._spawn``.

Drivers are :class:`service.driver_process.DriverProcess` objects started by a
:class:`~service.driver_process.DriverPool` (which keeps the warm spare); that
module says why one thread, this one's, must start and stop them all.
"""

from __future__ import annotations

import datetime as dt
import errno
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from hpo.errors import StorageError
from hpo.lease import holder_gone, take, while_held
from hpo.space import distributions
from hpo.spec import load_stored
from hpo.stopping import STOP_REASON_ATTR
from hpo.study import fail_running_trials
from hpo.summary import StudySummary, devices_held
from service import quotas
from service.db import Status, StudyRow, SummaryRow, TrialSlotRow, utcnow
from service.driver_process import CLAIMS, DriverPool, DriverProcess, HangWatch
from service.process import describe_exit
from service.settings import Settings
from service.studies import StudyService
from service.summaries import compute_summary, replace_failed_summary

log = logging.getLogger(__name__)

LOG_NAME = "service-driver.log"
SHUTDOWN_GRACE_S = 30.0
CREATING_GRACE_S = 60.0
# a driver of this process silent this long (no heartbeat), or still running a study this
# long after its stop was asked, is killed and its study taken over (helper-39: a hung
# driver, SIGSTOP standing in for a deadlock, held its study RUNNING and its slot for good,
# and its stop was ignored): at least this, and 3 x HPO_HEARTBEAT_TIMEOUT_S, so that a
# driver merely starved of CPU (2 cores, a test suite beside it) is never taken for hung
LOCAL_PATIENCE_MIN_S = 60.0
# rounds start at least this far apart (or dispatch_interval_s, if shorter): each create
# wakes the dispatcher, and under bench/load.py's creates a round per create was a fifth
# of the API process's CPU; a study waits at most this long more for its round
MIN_ROUND_GAP_S = 0.2
PREEMPT_AFTER_S = 10.0  # a study driven here that waits this long with no slot may be requeued
STALE_CREATES_EVERY_S = 30.0  # how often a running dispatcher undoes creates a crash left
# a study's folder that fails with one of these is the machine's trouble of the moment (out of
# memory, of processes or of file descriptors), not the folder's: the study is queued again
TRANSIENT_ERRNOS = frozenset({errno.EAGAIN, errno.EINTR, errno.ENOMEM, errno.EMFILE,
                              errno.ENFILE, errno.ENOBUFS})


class Dispatcher:
    """Runs queued studies; ``start()`` and ``shutdown()`` follow the app's lifespan.

    Args:
        settings: limits, intervals, database, Ray address and results directory.
        sessions: a session factory on the service's engine.
        studies: used to finish creates and deletes a crash interrupted.
    """

    def __init__(self, settings: Settings, sessions: sessionmaker,
                 studies: StudyService) -> None:
        self.settings = settings
        self.sessions = sessions
        self.studies = studies
        self.host = socket.gethostname()
        self.id = f"{self.host}:{os.getpid()}:{uuid.uuid4().hex[:8]}"
        self.drivers: dict[str, DriverProcess] = {}
        self.pool = DriverPool(settings)
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._grace_s = SHUTDOWN_GRACE_S
        # for service.metrics: when the last round ended (time.monotonic), drivers started
        # for a study that had run before (requeued or taken over), and of those, takeovers
        self.last_round_at: float | None = None
        self._waiting_since: dict[str, float] = {}  # studies driven here waiting for a quota
        self.hang_watch = HangWatch()  # the drivers started here that may have hung
        self.restarts = 0
        self.takeovers = 0
        self._creates_swept_at = time.monotonic()  # start-up's recovery sweeps them first
        self._requeued = False  # a driver that could not start queued its study this round
        # after each round: service.api_processes publishes the state to the other processes
        self.on_round: Callable[[], None] = lambda: None

    # -- lifecycle ---------------------------------------------------------------------

    def start(self) -> None:
        """Finish interrupted creates/deletes, then dispatch in a background thread (which
        starts every driver and warm driver, see ``_loop``)."""
        self.recover_interrupted_writes()
        self._thread = threading.Thread(target=self._loop, name="hpo-dispatcher", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """Dispatch now rather than at the next interval (a study was just queued)."""
        self._wake.set()

    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def shutdown(self, grace_s: float = SHUTDOWN_GRACE_S) -> None:
        """Stop dispatching; ask every driver to requeue its study and wait ``grace_s`` seconds.

        A driver told ``interrupt`` (on its stdin) interrupts its study (its running trials stay
        resumable from their checkpoints) and puts it back to QUEUED, so the next
        start continues it.
        """
        self._grace_s = grace_s
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()  # the thread stops the drivers it started (see _loop)
        else:
            self._stop_children(grace_s)
        self.reap()

    def _stop_children(self, grace_s: float) -> None:
        self.pool.close(grace_s)
        for driver in list(self.drivers.values()):
            driver.interrupt()
        deadline = time.monotonic() + grace_s
        for driver in list(self.drivers.values()):
            driver.wait(deadline - time.monotonic())

    def _loop(self) -> None:
        """Dispatch until ``shutdown``, then stop the drivers from this same thread, which
        started them (``service.driver_process`` says why it must be this one)."""
        gap_s = min(MIN_ROUND_GAP_S, self.settings.dispatch_interval_s)
        try:
            while not self._stop.is_set():
                started = time.monotonic()
                try:
                    self.run_once()
                    self.last_round_at = time.monotonic()
                except Exception:  # the loop must outlive a database hiccup
                    log.exception("dispatcher round failed")
                self.on_round()
                self._wake.wait(self.settings.dispatch_interval_s)
                # creates in a burst wake it once each: the wakes until the gap has passed
                # get one round (which sees every study they queued)
                if (rest := started + gap_s - time.monotonic()) > 0:
                    self._stop.wait(rest)
                self._wake.clear()
        finally:
            self._stop_children(self._grace_s)

    def run_once(self) -> None:
        """One round: reap drivers, take over abandoned studies, claim queued ones (until a
        driver cannot start: its study, queued again, waits for the next round)."""
        self.reap()
        self.kill_hung_drivers()
        self._requeued = False
        if time.monotonic() - self._creates_swept_at >= STALE_CREATES_EVERY_S:
            self.undo_stale_creates()
            self.finish_stale_deletes()
        for name, old_claim in self.abandoned():
            if len(self.drivers) >= self.settings.max_running_studies or self._requeued:
                return
            self._claim(name, old_claim, Status.RUNNING)
        with self.sessions.begin() as session:
            quotas.sweep(session)
        while len(self.drivers) < self.settings.max_running_studies and not self._requeued:
            if not self.claim_queued():
                break
        if len(self.drivers) >= self.settings.max_running_studies:
            self.preempt_waiting()
        if not self.drivers:  # warm the next driver only while idle: its imports take
            self.pool.keep_warm()  # CPU seconds that running trials would miss

    # -- claiming ----------------------------------------------------------------------

    def claim_queued(self) -> bool:
        """Claim the next QUEUED study by fair share (``quotas.pick_fair``) and start its
        driver; False if none was queued or none may start now. Sets ``waiting_for`` on
        the queued studies whose owner is over a quota (and clears it when no longer)."""
        with self.sessions() as session:
            rows = quotas.queued_candidates(session, StudyRow.name, StudyRow.claimed_by,
                                            StudyRow.waiting_for)
            row, reasons = quotas.pick_fair(session, rows)
            session.rollback()
        changed = [(r.id, reasons[r.id]) for r in rows if reasons[r.id] != r.waiting_for]
        if changed:
            with self.sessions.begin() as session:
                for study_id, reason in changed:
                    session.execute(sa.update(StudyRow).where(
                        StudyRow.id == study_id, StudyRow.status == Status.QUEUED)
                        .values(waiting_for=reason))
        if row is None:
            return False
        self._claim(row.name, row.claimed_by, Status.QUEUED)
        return True

    def preempt_waiting(self) -> str | None:
        """Requeue (``interrupt``) the study driven here that has waited longest for its
        quota holding no trial slot, once it has waited ``PREEMPT_AFTER_S`` seconds and a
        queued study may start (``quotas.pick_fair``); its name, or ``None``."""
        with self.sessions() as session:
            held = sa.select(TrialSlotRow.study_id)
            waiting = dict(session.execute(sa.select(StudyRow.name, StudyRow.owner_id).where(
                StudyRow.name.in_(list(self.drivers)), StudyRow.status == Status.RUNNING,
                StudyRow.waiting_for.is_not(None), ~StudyRow.id.in_(held))).all())
        now = time.monotonic()
        self._waiting_since = {n: self._waiting_since.get(n, now) for n in waiting}
        ripe = sorted((since, n) for n, since in self._waiting_since.items()
                      if now - since >= PREEMPT_AFTER_S)
        if not ripe:
            return None
        with self.sessions() as session:
            pick, _ = quotas.pick_fair(session, quotas.queued_candidates(session))
        if pick is None:
            return None
        name = ripe[0][1]
        del self._waiting_since[name]
        with self.sessions.begin() as session:
            study_id = session.execute(sa.select(StudyRow.id).where(StudyRow.name == name)
                                       ).scalar()
            if study_id is None or not quotas.mark_requeue(session, study_id):
                return None  # it took a slot meanwhile: it runs a trial now
        log.info("study %s: requeued, it waits for its quota while a queued study may start",
                 name)
        self.drivers[name].interrupt()
        return name

    def kill_hung_drivers(self) -> list[str]:
        """Kill the drivers of this process that ``HangWatch`` finds silent or deaf to
        their study's stop for ``LOCAL_PATIENCE_MIN_S`` or 3 x ``heartbeat_timeout_s``,
        whichever is longer: :meth:`abandoned` then hands their studies to new drivers,
        which resume the trials (or end them, when stopped). The names of the studies
        whose driver was killed."""
        if not self.drivers:
            self.hang_watch.hung([], 0.0)  # forgets every study
            return []
        patience = max(LOCAL_PATIENCE_MIN_S, 3 * self.settings.heartbeat_timeout_s)
        with self.sessions() as session:
            rows = session.execute(sa.select(
                StudyRow.name, StudyRow.heartbeat_at, StudyRow.stop_requested).where(
                StudyRow.name.in_(list(self.drivers)), StudyRow.status == Status.RUNNING)).all()
        killed = self.hang_watch.hung(rows, patience)
        for name, why in killed.items():
            driver = self.drivers.pop(name)
            log.error("study %s: its driver (pid %d) %s for %.0f s: killed, the study is "
                      "taken over", name, driver.pid, why, patience)
            self.hang_watch.kill(driver)
        return list(killed)

    def abandoned(self) -> list[tuple[str, str | None]]:
        """RUNNING studies not driven from here whose driver is gone: ``(name, claim)``
        pairs."""
        cutoff = utcnow().timestamp() - self.settings.heartbeat_timeout_s
        with self.sessions() as session:
            rows = session.execute(sa.select(
                StudyRow.name, StudyRow.claimed_by, StudyRow.worker_pid,
                StudyRow.heartbeat_at).where(StudyRow.status == Status.RUNNING)).all()
        out = []
        for name, claim, pid, beat in rows:
            if name in self.drivers:
                continue
            stale = beat is None or beat.timestamp() < cutoff
            if stale or self._driver_gone(claim, pid):
                out.append((name, claim))
        return out

    def _driver_gone(self, claim: str | None, pid: int | None) -> bool:
        """A driver of this machine whose process no longer exists (or is a zombie)."""
        if not claim or claim.split(":", 1)[0] != self.host or pid is None:
            return False
        if claim.startswith(self.id):  # ours but not in self.drivers: reaped already
            return True
        return holder_gone(self.host, pid)

    def _claim(self, name: str, previous: str | None, status: Status) -> None:
        """Take study ``name`` from claim ``previous`` while it is ``status``: RUNNING under a
        new claim; then start its driver."""
        claim = f"{self.id}:{uuid.uuid4().hex[:8]}"
        now = utcnow()
        with self.sessions.begin() as session:
            taken = take(session, CLAIMS, name, claim, now=now, previous=previous,
                         guards=[StudyRow.status == status], values={
                             StudyRow.status: Status.RUNNING, StudyRow.worker_pid: None,
                             StudyRow.started_at: sa.func.coalesce(StudyRow.started_at, now),
                             StudyRow.attempts: StudyRow.attempts + 1,
                             StudyRow.waiting_for: None, StudyRow.updated_at: now},
                         returning=[StudyRow.id])
            if taken is not None and status == Status.RUNNING:  # the gone driver's slots
                quotas.sweep(session, [taken.id], now)
        if taken is None:
            return
        self._spawn(name, claim)
        if name in self.drivers:  # else _spawn ended the study or queued it again
            if status == Status.RUNNING:
                self.takeovers += 1
            if status == Status.RUNNING or self._ran_before(name):
                self.restarts += 1

    def _ran_before(self, name: str) -> bool:
        with self.sessions() as session:
            return (session.execute(sa.select(StudyRow.attempts).where(StudyRow.name == name))
                    .scalar() or 0) > 1

    def _spawn(self, name: str, claim: str) -> None:
        """Start the driver of study ``name``, just claimed under ``claim``, into
        ``self.drivers``. Its folder ``<HPO_RESULTS_DIR>/NAME`` and log are made first, here:
        where they cannot be, the study ends FAILED (:meth:`_not_started`); a driver that
        cannot be started puts the study back in the queue. Before, either left the study
        RUNNING with no driver, taken over again every ``heartbeat_timeout_s``."""
        folder = Path(self.settings.results_dir) / name
        try:
            log_path = (folder / LOG_NAME).resolve()
            log_path.parent.mkdir(parents=True, exist_ok=True)
            with open(log_path, "ab"):  # a spare opens it itself, and would die on it unlogged
                pass
        except OSError as e:  # mkdir says "File exists" of a file where the folder should be
            why = os.strerror(errno.ENOTDIR) if isinstance(e, FileExistsError) else (
                e.strerror or type(e).__name__)
            where = f"its folder in HPO_RESULTS_DIR cannot be used ({why})"
            log.error("study %s: %s cannot be used: %s", name, folder, e)
            self._not_started(name, claim, where, permanent=e.errno not in TRANSIENT_ERRNOS)
            return
        try:
            driver = self.pool.start(name, claim, log_path)
        except Exception as e:  # noqa: BLE001 - the study must not stay RUNNING driverless
            log.error("study %s: its driver process cannot be started", name, exc_info=e)
            self._not_started(name, claim, f"its process cannot be started ({e})",
                              permanent=False)
            return
        self.drivers[name] = driver
        with self.sessions.begin() as session:
            while_held(session, CLAIMS, name, claim, values={StudyRow.worker_pid: driver.pid})
        log.info("study %s: driver started (pid %d, log %s)", name, driver.pid, log_path)

    def _not_started(self, name: str, claim: str, why: str, *, permanent: bool) -> None:
        """The study ``name`` claimed under ``claim`` whose driver could not start: one of
        its own (its folder, made or opened, failed but for ``TRANSIENT_ERRNOS``) ends it
        FAILED with ``why`` as its one-line ``error`` (no path: it is in API answers; the
        service's log has it), its trials left RUNNING by an earlier driver FAIL too; any
        other goes back to the queue with its start undone (``attempts``, ``started_at``),
        and the next round (not this one) tries again."""
        reason = f"the study driver cannot start: {why}"
        now = utcnow()
        values = ({StudyRow.status: Status.FAILED, StudyRow.error: reason,
                   StudyRow.ended_at: now} if permanent else
                  {StudyRow.status: Status.QUEUED, StudyRow.claimed_by: None,
                   StudyRow.attempts: StudyRow.attempts - 1,
                   StudyRow.started_at: sa.case((StudyRow.attempts <= 1, None),
                                                else_=StudyRow.started_at)})
        with self.sessions.begin() as session:
            ended = while_held(session, CLAIMS, name, claim,
                               guards=[StudyRow.status == Status.RUNNING],
                               values={**values, StudyRow.updated_at: now},
                               returning=[StudyRow.name, StudyRow.spec, StudyRow.ended_at])
        self._requeued = self._requeued or not permanent
        if ended is not None and permanent:
            log.error("study %s: FAILED: %s", name, reason)
            self._fail_orphaned_trials(ended, reason)
        elif ended is not None:
            log.warning("study %s: queued again: %s", name, reason)

    def warm_driver(self) -> str:
        """The warm spare's state (``DriverPool.state``)."""
        return self.pool.state()

    # -- reaping -----------------------------------------------------------------------

    def reap(self) -> None:
        """Forget drivers that exited; fail the study of one that exited without ending it,
        except at shutdown: a driver stopped then (one still importing when the grace ran
        out) puts its study back in the queue, as an interrupted one does, keeping its stop
        request, and the next start resumes its trials (or stops them, if asked)."""
        shutting_down = self._stop.is_set()
        self.hang_watch.reap()
        for name, driver in list(self.drivers.items()):
            if driver.exit_code() is None:
                continue
            del self.drivers[name]
            driver.close()
            reason = driver.exit_reason()
            values = ({StudyRow.status: Status.QUEUED, StudyRow.claimed_by: None,
                       StudyRow.waiting_for: None} if shutting_down else
                      {StudyRow.status: Status.FAILED, StudyRow.error: reason,
                       StudyRow.ended_at: utcnow()})
            with self.sessions.begin() as session:
                ended = while_held(session, CLAIMS, name, driver.claim,
                                   guards=[StudyRow.status == Status.RUNNING],
                                   values={**values, StudyRow.updated_at: utcnow()},
                                   returning=[StudyRow.name, StudyRow.spec,
                                              StudyRow.ended_at])
            if ended is not None and shutting_down:
                log.warning("study %s: its driver was stopped at shutdown before it requeued "
                            "the study (%s): queued again", name,
                            describe_exit(driver.proc.returncode))
            elif ended is not None:  # the service's log keeps the whole tail
                self._fail_orphaned_trials(ended, reason)
                log.error("study %s: %s; last lines of %s:\n%s", name, reason, driver.log_path,
                          driver.log_tail())

    def _fail_orphaned_trials(self, row, reason: str) -> None:
        """The trials a dead driver left RUNNING in its FAILED study ``row`` end FAIL with
        ``reason`` (nothing would ever end them: found by the breaker, ``kill -9`` of a
        driver), their device-seconds counted to the study's end (``row.ended_at``), and the
        study's summary is computed again from Optuna. A failure here is logged; the
        dispatcher goes on."""
        storage = self.studies.storage
        try:
            spec = load_stored(row.spec)
            fail_running_trials(storage, row.name, reason, devices_held(spec.resources),
                                row.ended_at.astimezone().replace(tzinfo=None),  # as Optuna's
                                distributions(spec))
            fired = storage.get_study_user_attrs(storage.get_study_id_from_name(row.name)
                                                 ).get(STOP_REASON_ATTR)
            replace_failed_summary(self.sessions, row.name, compute_summary(storage, row),
                                   fired if isinstance(fired, str) else None)
        except Exception:  # noqa: BLE001 - a storage outage: the trials stay RUNNING
            log.exception("study %s: cannot end the trials its driver left running", row.name)

    def recover_interrupted_writes(self) -> None:
        """Finish deletes and undo creates that a crash interrupted (rows DELETING/CREATING)."""
        with self.sessions() as session:
            deleting = session.execute(sa.select(StudyRow.name).where(
                StudyRow.status == Status.DELETING)).scalars().all()
        for name in deleting:
            self.studies.purge(name)
        self.undo_stale_creates()
        self._fail_trials_of_failed_studies()

    def _fail_trials_of_failed_studies(self) -> None:
        """FAILED studies whose summary still counts RUNNING trials (their driver died
        under a version before :meth:`_fail_orphaned_trials`, or the storage was down at
        the reap): those trials end FAIL now, with the study's error."""
        with self.sessions() as session:
            rows = session.execute(
                sa.select(StudyRow.name, StudyRow.spec, StudyRow.error, SummaryRow.summary,
                          sa.func.coalesce(StudyRow.ended_at, StudyRow.updated_at)
                          .label("ended_at"))
                .join(SummaryRow, SummaryRow.study_id == StudyRow.id)
                .where(StudyRow.status == Status.FAILED)).all()
        for row in rows:
            if StudySummary.from_json(row.summary).counts.running:
                self._fail_orphaned_trials(row, row.error or "the study ended FAILED")

    def undo_stale_creates(self) -> None:
        """Undo the creates left CREATING for over ``CREATING_GRACE_S`` (a crash interrupted
        them): their Optuna study and row. At start-up, and every ``STALE_CREATES_EVERY_S``
        while the service runs: a service started again within the grace of a crash found
        them young, and their names stayed taken (409) until a later start."""
        self._creates_swept_at = time.monotonic()
        for name in self._past_grace(Status.CREATING, StudyRow.created_at):
            self.studies.undo_create(name)

    def finish_stale_deletes(self) -> None:
        """Finish the deletes left DELETING for over ``CREATING_GRACE_S`` while the service
        runs, every ``STALE_CREATES_EVERY_S``: a delete whose Optuna study kept gaining rows
        answered 503 and left its row DELETING, which reads and deletes no longer see. One
        that fails again is logged and tried at the next sweep."""
        for name in self._past_grace(Status.DELETING, StudyRow.updated_at):
            try:
                self.studies.purge(name)
            except (StorageError, sa.exc.SQLAlchemyError) as e:
                log.warning("study %s: its delete could not be finished yet: %s", name, e)

    def _past_grace(self, status: Status, since: sa.orm.InstrumentedAttribute) -> list[str]:
        """The names of the studies in ``status`` whose ``since`` is over
        ``CREATING_GRACE_S`` old."""
        cutoff = utcnow() - dt.timedelta(seconds=CREATING_GRACE_S)
        with self.sessions() as session:
            return list(session.execute(sa.select(StudyRow.name).where(
                StudyRow.status == status, since < cutoff)).scalars())
