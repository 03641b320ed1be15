"""A study driver process: ``python -m service.worker NAME CLAIM``, started by the dispatcher.

The dispatcher keeps one driver warm (``--warm``): a process that has already
imported Ray, torch and the driver (about 4 s) and waits on stdin for its study
(``service.driver_process``, which also describes the pipes).

It runs ``hpo.tune.driver.run_study`` on the study (joining the service's
Ray cluster), and meanwhile, every ``HPO_HEARTBEAT_S`` seconds, renews its claim
``CLAIM`` (a lease, ``hpo.lease``, kept in the study's row) and reads the study's
stop request in the same guarded update, and checks that the service is still
its parent. It
writes the study's end itself:

* COMPLETED: the study reached its budget; STOPPED: a user asked it to stop;
* FAILED: the spec cannot run here or the driver raised (one line of the error is kept,
  without traceback or paths; the traceback is in this driver's log);
* QUEUED again: the service shut down (``interrupt`` on stdin): ``run_study`` was interrupted,
  leaving its running trials RUNNING with their checkpoints, and the next start
  resumes them.

Exit status: 0 the study's end was written; 75 the claim was lost (another
dispatcher took the study over); 70 the service is gone.
"""

from __future__ import annotations

import logging
import os
import sys
import threading

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker

from hpo.errors import public_message
from hpo.lease import while_held
from hpo.spec import load_stored
from service import logs, optuna_sql
from service.db import Status, StudyRow, TokenRow, build_engine, session_factory, utcnow
from service.driver_process import CLAIMS, wait_for_study, watch_for_interrupt
from service.process import die_with_parent, parent_gone
from service.quotas import QuotaGate
from service.settings import Settings
from service.summaries import summary_tracker

log = logging.getLogger("service.worker")

EXIT_LOST_CLAIM = 75
EXIT_PARENT_GONE = 70


class Heartbeat(threading.Thread):
    """Writes the study's heartbeat and reads its stop request, every ``interval_s`` seconds."""

    def __init__(self, sessions: sessionmaker, name: str, claim: str, interval_s: float) -> None:
        super().__init__(name="hpo-heartbeat", daemon=True)
        self.sessions = sessions
        self.study = name
        self.claim = claim
        self.interval_s = interval_s
        self.stop_requested = threading.Event()
        self.shutdown_requested = threading.Event()
        self._done = threading.Event()
        self._fresh_read = False  # should_stop's first call beats at once

    def should_stop(self) -> bool:
        """Polled by ``run_study``: a user asked to stop the study. The first call (made
        once the driver is set up, before its first trial starts) beats at once, so a
        stop that came during the set-up starts no trial; later calls read what the
        last heartbeat saw."""
        if not self._fresh_read:
            self._fresh_read = True
            try:
                self.beat()
            except sa.exc.SQLAlchemyError as e:  # transient: the heartbeat thread reads on
                log.warning("heartbeat failed: %s", e)
        return self.stop_requested.is_set()

    def should_interrupt(self) -> bool:
        """Polled by ``run_study``: the service is shutting down (its trials stay resumable)."""
        return self.shutdown_requested.is_set()

    def run(self) -> None:
        while not self._done.wait(self.interval_s):
            if parent_gone():
                os._exit(EXIT_PARENT_GONE)
            try:
                self.beat()
            except sa.exc.SQLAlchemyError as e:  # transient; a long outage loses the claim
                log.warning("heartbeat failed: %s", e)

    def beat(self) -> None:
        """One heartbeat; exits the process if the claim was lost."""
        with self.sessions.begin() as session:
            row = while_held(session, CLAIMS, self.study, self.claim,
                             guards=[StudyRow.status == Status.RUNNING],
                             values={StudyRow.heartbeat_at: utcnow()},
                             returning=[StudyRow.stop_requested])
        if row is None:
            log.error("study %s: claim %s lost; exiting", self.study, self.claim)
            os._exit(EXIT_LOST_CLAIM)
        if row.stop_requested:
            self.stop_requested.set()

    def close(self) -> None:
        self._done.set()


def finish(sessions: sessionmaker, name: str, claim: str, status: Status,
           error: str | None = None, stop_reason: str | None = None) -> None:
    """Write the study's end (guarded by the claim)."""
    ended = utcnow() if status != Status.QUEUED else None
    with sessions.begin() as session:
        while_held(session, CLAIMS, name, claim, guards=[StudyRow.status == Status.RUNNING],
                   values={StudyRow.status: status, StudyRow.error: error,
                           StudyRow.stop_reason: stop_reason,
                           StudyRow.ended_at: ended, StudyRow.waiting_for: None,
                           StudyRow.updated_at: utcnow(),
                           StudyRow.claimed_by: None if status == Status.QUEUED else claim})
    log.info("study %s: %s%s", name, status, f" ({error})" if error else "")


def _has_trials(sessions: sessionmaker, name: str) -> bool:
    """Whether the Optuna study ``name`` has any trial, of any state (two statements)."""
    with sessions() as session:
        conn = session.connection()
        found = optuna_sql.study_ids(conn, [name]).get(name)
        return found is not None and optuna_sql.n_trials(conn, found) > 0


def drive(settings: Settings, sessions: sessionmaker, name: str, claim: str) -> None:
    """Run the study to its end and write that end. Its trials take their owner's quota
    slots (``service.quotas.QuotaGate``) and wait while the owner is over a quota."""
    with sessions() as session:
        row, owner = session.execute(sa.select(StudyRow, TokenRow.name).outerjoin(TokenRow)
                                     .where(StudyRow.name == name)).one()
    beat = Heartbeat(sessions, name, claim, settings.heartbeat_s)
    beat.beat()
    if beat.stop_requested.is_set() and not _has_trials(sessions, name):
        # stopped while its driver started (before any trial): nothing of the record to
        # end, so it ends now, without importing Ray and torch or joining the cluster (about
        # 5 s of CPU per study under bench/load.py, where most studies are stopped so)
        finish(sessions, name, claim, Status.STOPPED)
        return
    beat.start()
    watch_for_interrupt(beat.shutdown_requested)
    try:
        from hpo.tune.driver import run_study  # imports Ray: only in this process

        spec = load_stored(row.spec)  # validated at create: only read back
        tracker = summary_tracker(settings.database_url, sessions, spec, claim)
        gate = QuotaGate(sessions, row.id, claim)
        gate.sweep_own()  # slots an earlier driver of this study died holding
        try:
            outcome = run_study(spec, settings.database_url, ray_address=settings.ray_address,
                                results_dir=settings.results_dir, listener=tracker,
                                artifact_dir=settings.artifacts_path,
                                compare_spec=False,  # the stored spec itself
                                should_stop=beat.should_stop,
                                should_interrupt=beat.should_interrupt, gate=gate,
                                owner=owner,  # for the study's dashboard note
                                final=True)  # an ended study is not run again
        finally:
            tracker.flush()  # the last summary, before finish() writes the study's end
    except Exception as e:  # the traceback goes to this driver's log, one line to the row
        log.exception("study %s failed", name)
        finish(sessions, name, claim, Status.FAILED, public_message(f"{type(e).__name__}: {e}"))
        return
    finally:
        beat.close()
    if outcome.interrupted:  # the service is shutting down: the next start continues it
        finish(sessions, name, claim, Status.QUEUED)
    else:
        finish(sessions, name, claim, Status.STOPPED if outcome.stopped else Status.COMPLETED,
               stop_reason=outcome.stop_reason)


def main(argv: list[str] | None = None) -> int:
    """``python -m service.worker NAME CLAIM``, or ``--warm`` to wait for a study on stdin."""
    args = sys.argv[1:] if argv is None else argv
    die_with_parent()  # its priority: lowered by the dispatcher (service.process.start_batch)
    if args == ["--warm"]:
        args = wait_for_study()
        if args is None:
            return 0
    if len(args) != 2:
        print("usage: python -m service.worker STUDY_NAME CLAIM | --warm", file=sys.stderr)
        return 2
    settings = Settings.from_env()
    logs.configure(settings.log_format)
    logs.bind(study=args[0])  # every line of this driver's log names its study
    logging.getLogger("optuna").setLevel(logging.WARNING)
    engine = build_engine(settings.database_url)
    try:
        drive(settings, session_factory(engine), *args)
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())
