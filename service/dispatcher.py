"""The dispatcher: claims QUEUED studies and runs each one's driver in its own process.

One thread in the service process, every ``dispatch_interval_s``:

1. reaps finished drivers; a driver that died without writing its study's end
   (a crash, an out-of-memory kill) marks the study FAILED with its log's tail;
2. takes over RUNNING studies whose driver is gone: no heartbeat for
   ``heartbeat_timeout_s``, or a driver process on this machine that no longer
   exists (the service was killed, then started again). ``run_study`` then
   continues the study to exactly its ``n_trials``;
3. claims QUEUED studies, oldest first, while fewer than
   ``max_running_studies`` drivers run here.

Claims are guarded updates (``... WHERE status = 'QUEUED'``, or ``WHERE
claimed_by = <the old claim>``), after a ``SELECT ... FOR UPDATE SKIP LOCKED``
on PostgreSQL, so that two dispatchers never run one study. A driver checks its
claim at every heartbeat and exits if it lost it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections import deque
from pathlib import Path

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from hpo.errors import public_message
from service.db import Status, StudyRow, utcnow
from service.process import child_env, describe_exit, stop_process
from service.settings import Settings
from service.studies import StudyService

log = logging.getLogger(__name__)

LOG_NAME = "service-driver.log"
SHUTDOWN_GRACE_S = 30.0
CREATING_GRACE_S = 60.0


@dataclasses.dataclass
class Driver:
    name: str
    claim: str
    proc: subprocess.Popen
    log_path: Path


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
        self.drivers: dict[str, Driver] = {}
        self._stop = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.spare: subprocess.Popen | None = None
        self.spare_said = Announcement()  # what the current warm driver said
        self._grace_s = SHUTDOWN_GRACE_S

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
        if self.spare is not None:
            stop_process(self.spare, grace_s)
        for driver in list(self.drivers.values()):
            _interrupt(driver.proc)
        deadline = time.monotonic() + grace_s
        for driver in list(self.drivers.values()):
            with contextlib.suppress(subprocess.TimeoutExpired):
                driver.proc.wait(max(0.0, deadline - time.monotonic()))
            stop_process(driver.proc, timeout_s=5)

    def _loop(self) -> None:
        """Dispatch until ``shutdown``, then stop the drivers from this same thread: Linux
        sends a child's parent-death signal (``die_with_parent``) when the *thread* that
        started it exits (prctl(2), PR_SET_PDEATHSIG), so leaving this thread first would
        SIGKILL every driver it started before it could requeue its study."""
        try:
            while not self._stop.is_set():
                try:
                    self.run_once()
                except Exception:  # the loop must outlive a database hiccup
                    log.exception("dispatcher round failed")
                self._wake.wait(self.settings.dispatch_interval_s)
                self._wake.clear()
        finally:
            self._stop_children(self._grace_s)

    def run_once(self) -> None:
        """One round: reap drivers, take over abandoned studies, claim queued ones."""
        self.reap()
        for row_id, old_claim in self.abandoned():
            if len(self.drivers) >= self.settings.max_running_studies:
                return
            self._claim(StudyRow.id == row_id, StudyRow.status == Status.RUNNING,
                        StudyRow.claimed_by == old_claim)
        while len(self.drivers) < self.settings.max_running_studies:
            if not self.claim_queued():
                break
        if not self.drivers:  # warm the next driver only while idle: its imports take
            self._start_spare()  # CPU seconds that running trials would miss

    # -- claiming ----------------------------------------------------------------------

    def claim_queued(self) -> bool:
        """Claim the oldest QUEUED study and start its driver; False if none was queued."""
        with self.sessions() as session:
            row_id = session.execute(
                sa.select(StudyRow.id).where(StudyRow.status == Status.QUEUED)
                .order_by(StudyRow.created_at, StudyRow.id).limit(1)
                .with_for_update(skip_locked=True)).scalar_one_or_none()
            session.rollback()
        if row_id is None:
            return False
        self._claim(StudyRow.id == row_id, StudyRow.status == Status.QUEUED)
        return True

    def abandoned(self) -> list[tuple[int, str | None]]:
        """RUNNING studies not driven from here whose driver is gone: ``(id, claim)`` pairs."""
        cutoff = utcnow().timestamp() - self.settings.heartbeat_timeout_s
        with self.sessions() as session:
            rows = session.execute(sa.select(
                StudyRow.id, StudyRow.name, StudyRow.claimed_by, StudyRow.worker_pid,
                StudyRow.heartbeat_at).where(StudyRow.status == Status.RUNNING)).all()
        out = []
        for row_id, name, claim, pid, beat in rows:
            if name in self.drivers:
                continue
            stale = beat is None or beat.timestamp() < cutoff
            if stale or self._driver_gone(claim, pid, beat):
                out.append((row_id, claim))
        return out

    def _driver_gone(self, claim: str | None, pid: int | None, beat) -> bool:
        """A driver of this machine whose process no longer exists (or is a zombie)."""
        if not claim or claim.split(":", 1)[0] != self.host or pid is None:
            return False
        if claim.startswith(self.id):  # ours but not in self.drivers: reaped already
            return True
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return _is_zombie(pid)

    def _claim(self, *where) -> None:
        """Mark the matching study RUNNING under a new claim and start its driver."""
        claim = f"{self.id}:{uuid.uuid4().hex[:8]}"
        now = utcnow()
        with self.sessions.begin() as session:
            name = session.execute(
                sa.update(StudyRow).where(*where).values(
                    status=Status.RUNNING, claimed_by=claim, heartbeat_at=now,
                    started_at=sa.func.coalesce(StudyRow.started_at, now),
                    attempts=StudyRow.attempts + 1, worker_pid=None, updated_at=now)
                .returning(StudyRow.name)).scalar_one_or_none()
        if name is not None:
            self._spawn(name, claim)

    def _spawn(self, name: str, claim: str) -> None:
        log_path = (Path(self.settings.results_dir) / name / LOG_NAME).resolve()
        log_path.parent.mkdir(parents=True, exist_ok=True)
        proc = self._take_spare(f"{name} {claim} {log_path}\n")
        if proc is None:
            with open(log_path, "ab") as log_file:
                proc = subprocess.Popen(
                    [sys.executable, "-m", "service.worker", name, claim],
                    stdin=subprocess.PIPE, stdout=log_file, stderr=subprocess.STDOUT,
                    env=child_env(self.settings.worker_env()), start_new_session=True)
        self.drivers[name] = Driver(name, claim, proc, log_path)
        with self.sessions.begin() as session:
            session.execute(sa.update(StudyRow).where(
                StudyRow.name == name, StudyRow.claimed_by == claim).values(worker_pid=proc.pid))
        log.info("study %s: driver started (pid %d, log %s)", name, proc.pid, log_path)

    def _start_spare(self) -> None:
        """Keep a warm driver process ready: it imports Ray and torch, joins the cluster,
        says ``ready`` on its stdout, then waits for a study on its stdin."""
        if self.settings.warm_drivers and (self.spare is None or self.spare.poll() is not None):
            said = Announcement()
            self.spare = subprocess.Popen(
                [sys.executable, "-m", "service.worker", "--warm"], stdin=subprocess.PIPE,
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                env=child_env(self.settings.worker_env()), start_new_session=True)
            self.spare_said = said
            threading.Thread(target=said.read, args=(self.spare,), daemon=True,
                             name="hpo-warm-driver").start()

    def warm_driver(self) -> str:
        """The warm driver's state: ``ready`` (imports done, cluster joined), ``unjoined``
        (imports done, the cluster could not be joined: a study handed to it tries again),
        ``starting``, or ``none`` (none is kept while studies run here, or it exited)."""
        spare, said = self.spare, self.spare_said
        if spare is None or spare.poll() is not None:
            return "none"
        return said.state if said.done.is_set() else "starting"

    def _take_spare(self, assignment: str) -> subprocess.Popen | None:
        """Hand a study to the warm driver; ``None`` if there is none alive."""
        spare, self.spare = self.spare, None
        if spare is None or spare.poll() is not None:
            return None
        try:
            spare.stdin.write(assignment.encode())
            spare.stdin.flush()
        except OSError:
            spare.kill()
            return None
        return spare

    # -- reaping -----------------------------------------------------------------------

    def reap(self) -> None:
        """Forget drivers that exited; fail the study of one that exited without ending it."""
        for name, driver in list(self.drivers.items()):
            code = driver.proc.poll()
            if code is None:
                continue
            del self.drivers[name]
            with contextlib.suppress(OSError, AttributeError):
                driver.proc.stdin.close()
            tail = _tail(driver.log_path)
            reason = (f"the study driver ended with {describe_exit(code)} without a result; "
                      f"its log ends with: {public_message(tail, from_end=True)}")
            with self.sessions.begin() as session:
                failed = session.execute(sa.update(StudyRow).where(
                    StudyRow.name == name, StudyRow.claimed_by == driver.claim,
                    StudyRow.status == Status.RUNNING).values(
                    status=Status.FAILED, error=reason, ended_at=utcnow(),
                    updated_at=utcnow())).rowcount
            if failed:  # the service's log keeps the whole tail
                log.error("study %s: %s; last lines of %s:\n%s", name, reason, driver.log_path,
                          tail)

    def recover_interrupted_writes(self) -> None:
        """Finish deletes and undo creates that a crash interrupted (rows DELETING/CREATING)."""
        cutoff = utcnow().timestamp() - CREATING_GRACE_S
        with self.sessions() as session:
            rows = session.execute(sa.select(StudyRow.name, StudyRow.status, StudyRow.created_at)
                                   .where(StudyRow.status.in_([Status.CREATING,
                                                               Status.DELETING]))).all()
        for name, status, created_at in rows:
            if status == Status.DELETING:
                self.studies.purge(name)
            elif created_at.timestamp() < cutoff:
                self.studies.undo_create(name, delete_optuna=True)


class Announcement:
    """The one line a warm driver writes on its stdout: ``ready`` or ``unjoined`` (see
    ``service.worker.wait_for_study``); ``done`` is set once it came."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.state = "starting"

    def read(self, spare: subprocess.Popen) -> None:
        """Read the line (in a thread of its own); the pipe then reaches end of file."""
        with contextlib.suppress(OSError, ValueError), spare.stdout:
            said = spare.stdout.readline().strip().decode(errors="replace")
            if said in ("ready", "unjoined"):
                self.state = said
                self.done.set()
            spare.stdout.read()


def _interrupt(proc: subprocess.Popen) -> None:
    """Tell a driver to interrupt its study (see ``service.worker.watch_for_interrupt``)."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        proc.stdin.write(b"interrupt\n")
        proc.stdin.close()


def _tail(path: Path, n_lines: int = 20) -> str:
    try:
        with open(path, errors="replace") as f:
            return "".join(deque(f, maxlen=n_lines))[-4000:]
    except OSError:
        return "(no log)"


def _is_zombie(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return False
