"""Study summaries in the service's own table (``hpo_study_summaries``).

A study's driver keeps its summary current (:func:`summary_tracker`: a
``hpo.summary.SummaryTracker`` listening to the driver's record, writing through
:func:`summary_writer`, guarded by the driver's claim). The API's reads of studies read
the table (:func:`read_summaries`); a study with no summary yet (queued, or made by a
version before the table) has one computed from Optuna's public API
(:func:`compute_summary`), stored once the study has ended (:func:`store_summary`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable

import optuna
import sqlalchemy as sa
import sqlalchemy.dialects.postgresql
import sqlalchemy.dialects.sqlite
from sqlalchemy.orm import Session, sessionmaker

from hpo import lease
from hpo.spec import StudySpec, load_stored
from hpo.storage import open_storage
from hpo.summary import StudySummary, SummaryTracker, devices_held
from service.audit import Change, insert_for
from service.db import Status, StudyRow, SummaryRow, UsageRow, autocommit, one_statement, utcnow

_INSERTS = {"sqlite": sa.dialects.sqlite.insert, "postgresql": sa.dialects.postgresql.insert}


def summary_writer(sessions: sessionmaker, name: str,
                   claim: str) -> Callable[[StudySummary], None]:
    """A ``SummaryTracker.write`` for the driver of study ``name``: upserts its summary
    in one statement, only while the study is claimed by ``claim`` (a driver that lost
    its claim writes nothing)."""

    def write(summary: StudySummary) -> None:
        _upsert(sessions, summary, StudyRow.name == name, StudyRow.claimed_by == claim)

    return write


def replace_failed_summary(sessions: sessionmaker, name: str, summary: StudySummary,
                           stop_reason: str | None = None) -> None:
    """Write ``summary`` as the FAILED study ``name``'s, whatever it had (its driver is gone),
    and ``stop_reason`` (the ``budget.stop_when`` rule that fired before it died, as the
    Optuna study keeps it), if any; nothing once the study is no longer FAILED (a delete
    marked it DELETING meanwhile)."""
    where = (StudyRow.name == name, StudyRow.status == Status.FAILED)
    _upsert(sessions, summary, *where)
    if stop_reason is not None:
        with sessions.begin() as session:
            session.execute(sa.update(StudyRow).where(*where).values(stop_reason=stop_reason))


def _upsert(sessions: sessionmaker, summary: StudySummary, *where) -> None:
    """Insert or update the summary of the study row matching ``where``, in one statement."""
    matched = (sa.select(StudyRow.id, sa.literal(summary.to_json(), sa.Text),
                         sa.literal(utcnow(), SummaryRow.updated_at.type)).where(*where))
    with sessions.begin() as session:
        statement = _insert(session)(SummaryRow).from_select(
            [SummaryRow.study_id, SummaryRow.summary, SummaryRow.updated_at], matched)
        session.execute(statement.on_conflict_do_update(
            index_elements=[SummaryRow.study_id],
            set_={"summary": statement.excluded.summary,
                  "updated_at": statement.excluded.updated_at}))


def summary_tracker(storage_url: str, sessions: sessionmaker, spec: StudySpec,
                    claim: str) -> SummaryTracker:
    """The tracker a driver passes as its record's listener (``run_study(listener=...)``):
    it reads the stored study once and writes its summary now, then as its trials change
    (at most once a second) and at :meth:`~hpo.summary.SummaryTracker.flush`.

    Raises:
        hpo.errors.StorageError: the storage cannot be opened.
    """
    write = summary_writer(sessions, spec.name, claim)
    devices = devices_held(spec.resources)
    storage = open_storage(storage_url)
    try:
        return SummaryTracker.from_storage(storage, spec.name, devices, write=write)
    except KeyError:  # not stored yet: run_study stores it
        return SummaryTracker([o.direction for o in spec.objectives], devices, write=write)
    finally:
        storage.engine.dispose()


def read_summaries(session: Session, study_ids: Iterable[int]) -> dict[int, StudySummary]:
    """The stored summaries of the studies ``study_ids`` (by ``hpo_studies.id``) that have one.
    One statement on the service's own table."""
    ids = list(study_ids)
    if not ids:
        return {}
    rows = session.connection().execute(_SUMMARIES_OF, {"ids": ids})
    return {study_id: StudySummary.from_json(text) for study_id, text in rows}


# in Core and built once (each study read runs it)
_SUMMARIES = SummaryRow.__table__
_SUMMARIES_OF = sa.select(_SUMMARIES.c.study_id, _SUMMARIES.c.summary).where(
    _SUMMARIES.c.study_id.in_(sa.bindparam("ids", expanding=True)))


def compute_summary(storage: optuna.storages.BaseStorage, row: StudyRow) -> StudySummary:
    """A study's summary from Optuna's public API (reads every trial of the study): for a
    study whose driver has written none. No Optuna study yet: zero counts."""
    spec = load_stored(row.spec)
    try:
        tracker = SummaryTracker.from_storage(storage, row.name, devices_held(spec.resources))
    except KeyError:
        return StudySummary(optuna_study_id=None, n_objectives=len(spec.objectives),
                            devices_held=devices_held(spec.resources))
    return tracker.summary()


def store_summary(session: Session, study_id: int, summary: StudySummary) -> None:
    """Store ``summary`` for the study unless it has one (the driver's wins) or its row is
    gone (deleted meanwhile: nothing stored).

    Raises:
        sqlalchemy.exc.IntegrityError: the row was deleted between the statement's read
            and its insert (PostgreSQL); the transaction is then to be rolled back.
    """
    exists = (sa.select(StudyRow.id, sa.literal(summary.to_json(), sa.Text),
                        sa.literal(utcnow(), SummaryRow.updated_at.type))
              .where(StudyRow.id == study_id))
    table = SummaryRow.__table__  # Core: the ORM's bulk INSERT path costs more than the trip
    statement = _insert(session)(table).from_select(
        [table.c.study_id, table.c.summary, table.c.updated_at], exists)
    session.connection().execute(statement.on_conflict_do_nothing())


def queue_created(sessions: sessionmaker, name: str, summary: StudySummary,
                  change: Change | None = None) -> StudyRow | None:
    """The CREATING study ``name`` made QUEUED, with its first ``summary`` stored and the
    audit row ``change`` written, all or none; the row as stored then, or None if no
    CREATING study has that name.

    On PostgreSQL one statement in autocommit (:func:`_queue_statements`): 1 round trip
    instead of 5. Elsewhere the UPDATE, :func:`store_summary` and the audit row in one
    transaction."""
    queue, queue_and_store, queue_store_and_audit = _queue_statements()
    params = {"study_name": name, "queued_at": utcnow(), "summary_json": summary.to_json()}
    if sessions.kw["bind"].dialect.name != "postgresql":
        with sessions.begin() as session:
            row = session.connection().execute(queue, params).first()
            if row is not None:
                store_summary(session, row.id, summary)
                if change is not None:
                    change.record(session)
        return row
    with one_statement(sessions) as conn:
        if change is None:
            return conn.execute(queue_and_store, params).first()
        row = conn.execute(queue_store_and_audit, {**params, **change.params()}).first()
    if row is not None:
        change.log()
    return row


@functools.cache
def _queue_statements() -> tuple[sa.Update, sa.Select, sa.Select]:
    """:func:`queue_created`'s statements, bound by ``study_name``, ``queued_at`` and
    ``summary_json`` (built once): the guarded UPDATE returning the row; and (PostgreSQL)
    that UPDATE as a data-modifying ``WITH`` with the summary's INSERT reading its
    ``RETURNING``, without and with the audit row's INSERT (:func:`service.audit.insert_for`,
    bound by its parameters too)."""
    studies, summaries = StudyRow.__table__, SummaryRow.__table__
    now = sa.bindparam("queued_at", type_=studies.c.updated_at.type)
    update = (sa.update(studies).where(studies.c.name == sa.bindparam("study_name"),
                                       studies.c.status == Status.CREATING)
              .values(status=Status.QUEUED, updated_at=now).returning(*studies.c))
    queued = update.cte("queued")
    store = (sa.dialects.postgresql.insert(summaries).from_select(
        [summaries.c.study_id, summaries.c.summary, summaries.c.updated_at],
        sa.select(queued.c.id, sa.bindparam("summary_json", type_=sa.Text), now))
        .on_conflict_do_nothing().cte("stored"))
    # in Core: rows of columns, read as StudyRow's attributes (an ORM entity load was a
    # third of the statement's CPU)
    queue_and_store = sa.select(*queued.c).add_cte(store)
    return update, queue_and_store, queue_and_store.add_cte(insert_for(queued))


def _insert(session: Session):
    """The upserting INSERT of the session's database (the service runs on SQLite and
    PostgreSQL only: its heartbeat needs ``UPDATE ... RETURNING`` too)."""
    return _INSERTS[session.get_bind().dialect.name]


@functools.cache
def _removal_statements() -> tuple[sa.Delete, sa.Delete]:
    """:func:`remove_deleting`'s DELETEs of the summary and of the row of the DELETING study
    ``:name``, in Core (built once)."""
    studies, summaries = StudyRow.__table__, SummaryRow.__table__
    name = sa.bindparam("name")
    deleting = sa.select(studies.c.id).where(studies.c.name == name,
                                             studies.c.status == Status.DELETING)
    return (sa.delete(summaries).where(summaries.c.study_id.in_(deleting))
            .returning(summaries.c.summary),
            sa.delete(studies).where(studies.c.name == name,
                                     studies.c.status == Status.DELETING)
            .returning(studies.c.owner_id))


def remove_deleting(session: Session, name: str) -> None:
    """Delete the DELETING study ``name``'s row and its summary, and add the summary's
    finished device-seconds to its owner's usage in ``hpo_owner_usage``: the per-owner
    counter of ``service.metrics`` keeps them. Three statements: the summary's and the
    row's ``DELETE ... RETURNING``, then one upsert, last, since it locks the owner's one
    usage row until the commit (none for a study without owner, summary or finished
    device-seconds: a study that never ran adds nothing, and concurrent deletes of one
    owner's studies then wait on no shared row). Nothing when no DELETING study has that
    name."""
    delete_summary, delete_row = _removal_statements()
    connection = session.connection()
    kept = connection.execute(delete_summary, {"name": name}).scalars().all()
    owners = connection.execute(delete_row, {"name": name}).scalars().all()
    _add_usage(session, owners[0] if owners else None, kept[0] if kept else None)


def remove_unused_deleting(sessions: sessionmaker, name: str, seen: str | None,
                           optuna_study: tuple[tuple[sa.Delete, ...], int] | None = None,
                           ) -> bool:
    """:func:`remove_deleting` with :func:`hpo.lease.forget` on PostgreSQL, for a study whose
    summary had no finished device-seconds when it was made DELETING (:func:`adds_usage`):
    one statement in autocommit, each DELETE a data-modifying ``WITH`` of it (1 round trip
    instead of 6: BEGIN, 3 DELETEs, COMMIT). The summary and the row go only if the summary
    is still ``seen`` (its JSON then, None if it had none), so nothing is owed to the
    owner's usage; one written meanwhile leaves both, and False says so. ``optuna_study``:
    its Optuna study's DELETEs (:func:`hpo.storage.delete_study_parts`) and id, to go in
    the same statement, whatever the row does (a writer adding rows to it meanwhile raises
    ``sqlalchemy.exc.IntegrityError``, nothing done). False, and nothing done, elsewhere
    than PostgreSQL: the caller then takes :func:`remove_deleting`'s transaction."""
    with autocommit(sessions) as session:
        connection = session.connection()
        if connection.dialect.name != "postgresql":
            return False
        summary, row = _unchanged_removal_statements()
        statement = sa.select(sa.func.count()).select_from(row).add_cte(summary)
        forget = lease.forget_statement(connection, name)  # None: no lease table to clear
        if forget is not None:
            statement = statement.add_cte(forget.cte("gone_lease"))
        params = {"name": name, "seen": seen}
        if optuna_study is not None:
            parts, params["study_id"] = optuna_study
            statement = statement.add_cte(*(part.cte(f"gone_optuna_{i}")
                                            for i, part in enumerate(parts)))
        return connection.execute(statement, params).scalar() == 1


@functools.cache
def _unchanged_removal_statements() -> tuple[sa.CTE, sa.CTE]:
    """:func:`remove_unused_deleting`'s DELETEs, as ``WITH``s (built once):
    :func:`_removal_statements`' summary and row of the DELETING study ``:name``, each
    only if its summary is still ``:seen``. The row goes only with the summary (or, seen
    none, where none is): a summary updated while the statement waited for its lock is
    left by the summary's DELETE, which reads it again, and so the row stays too (a
    condition on the summary in the row's DELETE would read the statement's snapshot, and
    the row's removal would then cascade to the new summary, its usage lost)."""
    studies, summaries = StudyRow.__table__, SummaryRow.__table__
    seen = sa.bindparam("seen", type_=sa.Text)
    delete_summary, delete_row = _removal_statements()
    gone_summary = delete_summary.where(summaries.c.summary.is_not_distinct_from(seen)
                                        ).cte("gone_summary")
    none_kept = sa.and_(seen.is_(None),
                        ~sa.exists().where(summaries.c.study_id == studies.c.id))
    return gone_summary, delete_row.where(sa.or_(sa.exists(gone_summary.select()),
                                                 none_kept)).cte("gone_row")


def adds_usage(owner_id: int | None, summary: str | None) -> bool:
    """Whether removing a study of owner ``owner_id`` with ``summary`` (its JSON, None if
    none) adds device-seconds to the owner's usage: it has both, and finished ones."""
    return (owner_id is not None and summary is not None
            and StudySummary.from_json(summary).device_seconds_finished > 0)


def _add_usage(session: Session, owner_id: int | None, summary: str | None) -> None:
    """Add the finished device-seconds of ``summary`` to owner ``owner_id``'s usage: one
    upsert, when :func:`adds_usage`."""
    if not adds_usage(owner_id, summary):
        return
    seconds = StudySummary.from_json(summary).device_seconds_finished
    statement = _insert(session)(UsageRow).values(owner_id=owner_id, device_seconds=seconds)
    session.execute(statement.on_conflict_do_update(
        index_elements=[UsageRow.owner_id],
        set_={"device_seconds": UsageRow.device_seconds + statement.excluded.device_seconds}))
