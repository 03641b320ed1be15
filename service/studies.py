"""Study operations behind the REST API: create, read, stop and delete, scoped by owner.

No HTTP here: each operation takes a :class:`~service.auth.Principal` and raises
errors of :mod:`service.errors` or :mod:`hpo.errors`, which
:mod:`service.api_errors` maps to HTTP. No Ray either: these only write to the
database; the dispatcher acts on what they wrote.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import time
from collections.abc import Callable, Mapping
from typing import Any

import optuna
import sqlalchemy as sa
import sqlalchemy.exc
from optuna.trial import FrozenTrial
from sqlalchemy.orm import sessionmaker

from hpo.errors import SpecError
from hpo.models import study_dir_clash
from hpo.spec import StudySpec, WarmStartStudy
from hpo.storage import create_study_statement, insert_study
from hpo.study import new_study_rows
from hpo.summary import StudySummary, TrialCounts, devices_held
from hpo.warmstart import warm_start_points
from service import bounds, optuna_sql
from service.audit import Auditor, Change
from service.auth import Principal
from service.db import (
    ENDED,
    Status,
    StudyRow,
    autocommit,
    one_statement,
    utcnow,
)
from service.errors import StudyConflict, StudyNotFound, TrialNotFound
from service.quotas import OwnerQuota, quota_of
from service.settings import Settings
from service.study_purge import delete_optuna_study, purge
from service.study_rows import (
    STUDIES,
    mark_deleting_update,
    stop_update,
    study_page,
    visible_study,
    with_audit_row,
    with_creating_row,
)
from service.summaries import (
    compute_summary,
    queue_created,
    store_summary,
)

log = logging.getLogger(__name__)
CREATE_WAIT_S = 10.0  # a 409 for a name being created waits this long for that create
CREATE_RACE_TRIES = 3
_INSERT = sa.insert(STUDIES)


def _made_outside(name: str) -> StudyConflict:
    return StudyConflict(f"a study named {name!r} exists already in the Optuna storage, made "
                         "outside the service (directly with Optuna): choose another name")


@dataclasses.dataclass(frozen=True)
class StudyView:
    """One study as the API shows it: its row plus what the Optuna record says."""

    row: StudyRow
    owner: str | None
    counts: TrialCounts
    optuna_id: int | None
    best: list[FrozenTrial]
    device_seconds: float
    quota: OwnerQuota | None = None  # its owner's limits and use (a read of one study)


class StudyService:
    """The studies of one database, seen through tokens.

    Args:
        settings: the service settings (``open_reads``, ``results_dir``).
        sessions: a session factory on the service's engine.
        storage: the Optuna storage of the same database.
    """

    def __init__(self, settings: Settings, sessions: sessionmaker,
                 storage: optuna.storages.RDBStorage) -> None:
        self.settings = settings
        self.sessions = sessions
        self.storage = storage
        self.on_queued: Callable[[], None] = lambda: None  # the dispatcher's wake-up

    # -- create ----------------------------------------------------------------------

    def create(self, data: Mapping[str, Any], owner: Principal,
               auditor: Auditor | None = None) -> StudyView:
        """Validate ``data`` as a spec, store it QUEUED and create its Optuna study; with
        ``auditor``, its audit row ``study.create`` goes with the QUEUED row (both or
        neither). Nothing stays stored when this raises. The answer is built from what this
        call wrote, without reading the study back. On PostgreSQL 2 statements.

        Raises:
            hpo.errors.SpecError: the spec is invalid (each field named), over a
                bound of :mod:`service.bounds` (a non-admin owner), names a
                warm-start study the owner may not read, or its name is the model
                store's folder among the results (:func:`hpo.models.study_dir_clash`).
            StudyConflict: a study of that name exists (here or in Optuna).
        """
        # the one parse: fields that name the training machines' files, and options over
        # the bounds on costly options (service.bounds), are for admins
        spec = bounds.parse_bounded(data, owner, self.settings)
        clash = study_dir_clash(self.settings.results_dir, spec.name,
                                self.settings.artifacts_path)
        if clash is not None:
            raise SpecError.at("name", clash)
        warm_start = self._warm_start(spec, owner)
        change = auditor.change("study.create", spec.name) if auditor is not None else None
        optuna_id = self._insert_creating(spec, owner, warm_start)
        try:  # from here on, the Optuna study of this name is the one this call created
            row = self._queue(spec, optuna_id, change)
            self.on_queued()
        except BaseException:
            self.undo_create(spec.name)
            raise
        return StudyView(row, owner.name, TrialCounts(), optuna_id, [], 0.0)

    def _warm_start(self, spec: StudySpec, owner: Principal) -> list[tuple[dict, str]] | None:
        """The ``(params, source)`` points of ``warm_start`` (None: it has none), read now,
        when the earlier studies it names are checked to be ones ``owner`` may read, and
        stored with the study: its driver never looks those names up again (by then one
        may name another owner's study).

        Raises:
            SpecError: naming ``warm_start.I.study``.
        """
        if not spec.warm_start:
            return None
        for i, entry in enumerate(spec.warm_start):
            if isinstance(entry, WarmStartStudy):
                try:
                    self._get(owner, entry.study, read=True)
                except StudyNotFound:
                    raise SpecError.at(f"warm_start.{i}.study",
                                       f"no study named {entry.study!r}") from None
        return warm_start_points(spec, self.storage)

    def _insert_creating(self, spec: StudySpec, owner: Principal,
                         warm_start: list[tuple[dict, str]] | None = None) -> int:
        """Insert the CREATING row and create the Optuna study, both or neither (on
        PostgreSQL one statement, elsewhere one transaction): the Optuna study's id. A
        concurrent create of the same name is answered 409 only once that create has
        finished (its row is no longer CREATING), so that a read right after the 409 finds
        the study; if that create was undone, this one goes on. A crash leaves either
        nothing or a CREATING row with its own Optuna study, which a restart undoes.

        Raises:
            StudyConflict: a study of that name exists, here or in Optuna (made outside).
        """
        row = {"name": spec.name, "owner_id": owner.token_id, "status": Status.CREATING,
               "spec": spec.to_dict(), "n_trials": spec.budget.n_trials}
        postgresql = self.sessions.kw["bind"].dialect.name == "postgresql"
        self._refuse_case_variant(spec.name)
        for _ in range(CREATE_RACE_TRIES):
            try:
                with one_statement(self.sessions) as conn:  # Core statements, built once
                    if not postgresql:  # one transaction
                        conn.execute(_INSERT, row)
                        return insert_study(conn, spec.name,
                                            *new_study_rows(spec, warm_start))
                    statement, params = create_study_statement(
                        spec.name, *new_study_rows(spec, warm_start))
                    return conn.execute(with_creating_row(statement), {
                        **params, **{f"row_{k}": v for k, v in row.items()},
                        "row_at": utcnow()}).scalar_one()
            except sqlalchemy.exc.IntegrityError:  # the row's name (or its case), or Optuna's
                pass
            self._refuse_case_variant(spec.name)  # a concurrent create's
            if self._optuna_only(spec.name):
                raise _made_outside(spec.name)
            if self._wait_not_creating(spec.name):
                break
        else:
            if self._optuna_only(spec.name):  # its creates kept being undone: this one's too
                raise _made_outside(spec.name)
        raise StudyConflict(f"a study named {spec.name!r} exists already")

    def _refuse_case_variant(self, name: str) -> None:
        """Refuse ``name`` when a study's name differs from it only in case: on a
        case-insensitive file system (macOS, Windows, many network shares) the two would
        share one result folder, ``<HPO_RESULTS_DIR>/<name>``, and deleting one would
        delete the other's files. (The unique index on ``lower(name)``, migration 0008,
        settles concurrent creates.)

        Raises:
            StudyConflict: such a study exists.
        """
        with autocommit(self.sessions) as session:
            other = session.execute(sa.select(StudyRow.name).where(
                sa.func.lower(StudyRow.name) == name.lower(), StudyRow.name != name)).scalar()
        if other is not None:
            raise StudyConflict(f"a study named {other!r} exists already; study names must "
                                "differ by more than case (the two would share one result "
                                "folder on a case-insensitive file system)")

    def _wait_not_creating(self, name: str) -> bool:
        """Wait (at most ``CREATE_WAIT_S``) while the row ``name`` is CREATING; True if a
        row of that name remains, False if it is gone (that create was undone)."""
        deadline = time.monotonic() + CREATE_WAIT_S
        while True:
            with autocommit(self.sessions) as session:
                status = session.execute(sa.select(StudyRow.status)
                                         .where(StudyRow.name == name)).scalar()
            if status is None:
                return False
            if status != Status.CREATING or time.monotonic() >= deadline:
                return True
            time.sleep(0.05)

    def _queue(self, spec: StudySpec, optuna_id: int, change: Change | None) -> StudyRow:
        """CREATING -> QUEUED, with the new study's summary (no trials yet: no read of a
        queued study computes one) and the audit row ``change``; the row as stored then.

        Raises:
            StudyConflict: the row is gone (a start-up's clean-up of old creates took it).
        """
        row = queue_created(self.sessions, spec.name, StudySummary(
            optuna_study_id=optuna_id, n_objectives=len(spec.objectives),
            devices_held=devices_held(spec.resources)), change)
        if row is None:
            raise StudyConflict(f"study {spec.name!r} was removed while it was being created")
        return row

    def undo_create(self, name: str) -> None:
        """Remove a half-created study: its Optuna study (made with its CREATING row, so
        ours) and its row."""
        delete_optuna_study(self.storage, name, self.settings)  # no artifacts: one SELECT
        with autocommit(self.sessions) as session:
            session.execute(sa.delete(StudyRow).where(StudyRow.name == name,
                                                      StudyRow.status == Status.CREATING))
            session.commit()

    # -- read ------------------------------------------------------------------------

    def list(self, who: Principal, status: Status | None, offset: int,
             limit: int) -> tuple[list[StudyView], int]:
        """One page of the studies ``who`` may see, newest first, and their total count.

        Reads the service's own tables only: each study's trial counts come from its
        summary (:mod:`service.summaries`); a queued study without one shows zero counts,
        and an ended one (made before summaries were kept) has its summary computed once.
        """
        count, page = study_page(status is not None, bool(self._scope(who, True)))
        params = {"status": status, "owner": who.token_id, "offset": offset, "limit": limit}
        with autocommit(self.sessions) as session:
            conn = session.connection()
            total = conn.execute(count, params).scalar_one()
            # each row with its owner's name and its summary, if kept: one statement
            rows = conn.execute(page, params).all()
        views = []
        for row in rows:
            summary = (StudySummary.from_json(row.kept) if row.kept is not None
                       else self._summary_once(row) if row.status in ENDED else None)
            counts = summary.counts if summary else TrialCounts()
            views.append(StudyView(row, row.owner_name, counts, None, [], 0.0))
        return views, total

    def view(self, who: Principal, name: str) -> StudyView:
        """A study with its trial counts, best trial(s) and device-seconds so far.

        From the study's summary in the service's own table (:mod:`service.summaries`),
        whatever the study's size. A study without one (queued, or made before summaries
        were kept) has it computed from Optuna's public API, and kept once it has ended.

        Raises:
            StudyNotFound: no such study, or not one ``who`` may see.
        """
        return self._view(*self._get(who, name, read=True))

    def _view(self, row: sa.Row, owner: str | None) -> StudyView:
        """The view of ``row``, a row of :mod:`service.study_rows`' statements with the
        summary stored when it was read (``kept``)."""
        with autocommit(self.sessions) as session:
            quota = quota_of(session, row.owner_id)
        summary = StudySummary.from_json(row.kept) if row.kept is not None else None
        if summary is None:
            summary = (self._summary_once(row) if row.status in ENDED
                       else compute_summary(self.storage, row))
        return StudyView(row, owner, summary.counts, summary.optuna_study_id,
                         summary.best_trials(), summary.device_seconds(), quota)

    def _summary_once(self, row: StudyRow) -> StudySummary:
        """An ended study's summary computed from Optuna, and stored."""
        summary = compute_summary(self.storage, row)
        # a row deleted meanwhile (a concurrent DELETE) keeps no summary
        with contextlib.suppress(sqlalchemy.exc.IntegrityError), self.sessions.begin() as session:
            store_summary(session, row.id, summary)
        return summary

    def trials(self, who: Principal, name: str, offset: int, limit: int, *,
               intermediate: bool = True) -> tuple[list[FrozenTrial], int]:
        """One page of a study's trials by number, and the study's number of trials.

        A bounded number of SQL statements per page, whatever the study's size and the
        page's (:func:`service.optuna_sql.load_trials`: Optuna's public API reads a
        study's trials all at once, or one at a time with about six statements each);
        ``intermediate=False`` leaves the trials' ``intermediate_values`` empty and does
        not read them.

        Raises:
            StudyNotFound: no such study, or not one ``who`` may see.
        """
        self._get(who, name, read=True)
        try:
            optuna_id = self.storage.get_study_id_from_name(name)
        except KeyError:
            return [], 0
        with autocommit(self.sessions) as session:
            conn = session.connection()
            total = optuna_sql.n_trials(conn, optuna_id)
            ids = optuna_sql.trial_ids_page(conn, optuna_id, offset, limit)
            return optuna_sql.load_trials(conn, ids, intermediate=intermediate), total

    def trial(self, who: Principal, name: str, number: int) -> FrozenTrial:
        """One trial of a study by its number, as Optuna's storage reads it.

        Raises:
            StudyNotFound: no such study, or not one ``who`` may see.
            TrialNotFound: the study has no trial ``number``.
        """
        self._get(who, name, read=True)
        try:
            optuna_id = self.storage.get_study_id_from_name(name)
            trial_id = self.storage.get_trial_id_from_study_id_trial_number(optuna_id, number)
        except KeyError:
            raise TrialNotFound(f"study {name!r} has no trial {number}") from None
        return self.storage.get_trial(trial_id)

    # -- stop and delete -------------------------------------------------------------

    def stop(self, who: Principal, name: str, auditor: Auditor | None = None) -> StudyView:
        """Stop a study: a QUEUED one ends STOPPED now; a RUNNING one is asked to stop.

        The driver of a RUNNING study sees the request within its heartbeat
        interval; its running trials end within seconds, recorded PRUNED with
        ``stopped_by: user``, and the study ends STOPPED.

        Raises:
            StudyNotFound: no such study, or not one ``who`` controls.
            StudyConflict: the study has already ended.
        """
        # one guarded UPDATE, the owner's scope in it; it returns the owner's name too
        scoped = bool(self._scope(who, read=False))
        row = self._audited(stop_update(scoped), name, who, scoped,
                            auditor.change("study.stop", name) if auditor is not None else None)
        if row is None:
            row, _ = self._get(who, name, read=False)
            raise StudyConflict(f"study {name!r} has already ended ({row.status})")
        return self._view(row, row.owner_name)

    def delete(self, who: Principal, name: str, auditor: Auditor | None = None) -> None:
        """Delete a study that is not running: its row, its Optuna study and trials, its
        results. With ``auditor``, its audit row ``study.delete`` is written with the
        change that marks it DELETING (both or neither; what follows is finished by a
        restart if interrupted).

        Raises:
            StudyNotFound: no such study, or not one ``who`` controls.
            StudyConflict: the study is RUNNING (stop it first).
        """
        scoped = bool(self._scope(who, read=False))
        marked = self._audited(
            mark_deleting_update(scoped), name, who, scoped,
            auditor.change("study.delete", name) if auditor is not None else None)
        if marked is None:
            self._get(who, name, read=False)  # none that ``who`` controls: 404 (or 409)
            raise StudyConflict(f"study {name!r} is running: stop it first")
        self.purge(name, seen=tuple(marked))

    def purge(self, name: str, seen: tuple[int | None, str | None] | None = None) -> None:
        """Remove a DELETING study's kept models, Optuna study, result files and row
        (:func:`service.study_purge.purge`; ``seen``: its owner and summary when marked)."""
        purge(self.settings, self.sessions, self.storage, name, seen)

    # -- helpers ---------------------------------------------------------------------

    def _scope(self, who: Principal, read: bool) -> list:
        if who.is_admin or (read and (who.reads_all or self.settings.open_reads)):
            return []
        return [StudyRow.owner_id == who.token_id]

    def _get(self, who: Principal, name: str, *, read: bool) -> tuple[StudyRow, str | None]:
        scoped = bool(self._scope(who, read))
        with autocommit(self.sessions) as session:
            found = session.connection().execute(visible_study(scoped),
                                                 {"name": name, "owner": who.token_id}).first()
        if found is None:
            raise self._absent(who, name, read=read)
        return found, found.owner_name

    def _absent(self, who: Principal, name: str, *, read: bool) -> StudyNotFound | StudyConflict:
        """The error for ``name`` when ``who`` sees no study of the service by that name.

        A study made outside the service (an Optuna study of that name in the same database,
        with no row here: no owner, spec or status) is not one of ``/v1``'s studies; the
        dashboard shows it read-only (:mod:`service.dashboard`). To a caller who sees every
        study (admins; for reads also viewers and open reads) the error says so: a read is
        404 pointing to the dashboard, a stop or delete is 409 (the service neither stops
        nor deletes what it did not make). Anyone else gets the plain 404, as for another
        owner's study. Two statements more, on this path only.
        """
        sees = who.is_admin or (read and (who.reads_all or self.settings.open_reads))
        if not (sees and self._optuna_only(name)):
            return StudyNotFound(f"no study named {name!r}")
        made = f"study {name!r} was made outside the service, directly with Optuna"
        if read:
            return StudyNotFound(f"{made}: /v1 does not manage it; read it in the dashboard "
                                 "(/dashboard)")
        return StudyConflict(f"{made}: the service does not stop or delete it (Optuna's own "
                             "API or `optuna delete-study` does)")

    def _optuna_only(self, name: str) -> bool:
        """Whether Optuna's storage has a study ``name`` and the service has no row of it."""
        with autocommit(self.sessions) as session:
            if session.execute(sa.select(StudyRow.id).where(StudyRow.name == name)).first():
                return False
            return bool(optuna_sql.study_ids(session.connection(), [name]))

    def _audited(self, update: sa.Update, name: str, who: Principal, scoped: bool,
                 change: Change | None) -> sa.Row | None:
        """What ``update`` (:mod:`service.study_rows`', bound by ``study_name``, ``now``,
        ``owner``) returned, or None; a changed row's audit row ``change`` is written in
        the same statement (PostgreSQL, ``with_audit_row``) or transaction."""
        params = {"study_name": name, "now": utcnow(), "owner": who.token_id if scoped else None}
        with autocommit(self.sessions) as session:  # one statement, in Core (no row object)
            conn = session.connection()
            if change is not None and conn.dialect.name == "postgresql":
                row = conn.execute(with_audit_row(update), {**params, **change.params()}
                                   ).first()
                if row is not None:
                    change.log()
            else:
                row = conn.execute(update, params).first()
                if row is not None and change is not None:
                    change.record(session)
            session.commit()
            return row
