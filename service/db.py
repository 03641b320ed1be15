"""The service's own tables (SQLAlchemy 2.x), in the same database as the Optuna studies.

``hpo_tokens`` holds API tokens (a SHA-256 hash only, never the token) and
``hpo_studies`` the lifecycle of each study::

    CREATING -> QUEUED -> RUNNING -> COMPLETED | STOPPED | FAILED
                   \\-> STOPPED (stopped before it ran)     any ended -> DELETING -> (gone)

``CREATING`` and ``DELETING`` are internal: a row in them is invisible to the
API, and the dispatcher finishes or undoes them at start-up (a crash between
the two writes of a create or a delete leaves nothing half-stored).
``hpo_study_summaries`` holds each study's summary (``hpo.summary.StudySummary``: trial
counts, best trial or Pareto front, device-seconds), written by the study's driver as its
trials change; the API's reads of studies read it instead of Optuna's tables.
The table names carry the ``hpo_`` prefix because Optuna owns ``studies``.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import enum

import sqlalchemy as sa
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

from hpo.engines import (
    autocommit_engine,
    engine_kwargs,
    ping_when_idle,
    prepare_sqlite,
    sqlite_path,
    sync_normal,
)


class Status(enum.StrEnum):
    CREATING = "CREATING"
    QUEUED = "QUEUED"
    RUNNING = "RUNNING"
    COMPLETED = "COMPLETED"
    STOPPED = "STOPPED"
    FAILED = "FAILED"
    DELETING = "DELETING"


VISIBLE = (Status.QUEUED, Status.RUNNING, Status.COMPLETED, Status.STOPPED, Status.FAILED)
# the statuses people see and filter by (a list's ``?status=``): the internal ones are not
VisibleStatus = enum.StrEnum("VisibleStatus", {s.name: s.value for s in VISIBLE})
ENDED = (Status.COMPLETED, Status.STOPPED, Status.FAILED)


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


class UTCDateTime(sa.TypeDecorator):
    """A timezone-aware UTC datetime on every backend (SQLite stores it naive)."""

    impl = sa.DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value, dialect):
        if value is not None and value.tzinfo is not None:
            value = value.astimezone(dt.UTC)
            if dialect.name == "sqlite":
                value = value.replace(tzinfo=None)
        return value

    def process_result_value(self, value, dialect):
        if value is not None and value.tzinfo is None:
            value = value.replace(tzinfo=dt.UTC)
        return value


class Base(DeclarativeBase):
    pass


class Role(enum.StrEnum):
    """A token's role: ``admin`` (everything, every owner's studies), ``member`` (creates and
    controls its own studies) or ``viewer`` (reads only)."""

    ADMIN = "admin"
    MEMBER = "member"
    VIEWER = "viewer"


class TokenRow(Base):
    """An API token (its hash). ``is_admin`` is kept equal to ``role == "admin"`` for
    readers of the schema before revision 0004; ``role`` is what the service reads. A
    revoked token keeps its row (its studies name it as their owner)."""

    __tablename__ = "hpo_tokens"
    # names differ by more than case (migration 0006)
    __table_args__ = (sa.Index("ix_hpo_tokens_name_lower", sa.text("lower(name)"),
                               unique=True),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    token_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    is_admin: Mapped[bool] = mapped_column(default=False)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    role: Mapped[str] = mapped_column(sa.String(16), default=Role.MEMBER)
    expires_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    last_used_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    revoked_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)


class StudyRow(Base):
    __tablename__ = "hpo_studies"
    # names differ by more than case: one result folder each (migration 0008)
    __table_args__ = (sa.Index("ix_hpo_studies_name_lower", sa.text("lower(name)"),
                               unique=True),)

    id: Mapped[int] = mapped_column(primary_key=True)
    name: Mapped[str] = mapped_column(sa.String(64), unique=True)
    owner_id: Mapped[int | None] = mapped_column(sa.ForeignKey("hpo_tokens.id"), index=True)
    status: Mapped[str] = mapped_column(sa.String(16), index=True)
    spec: Mapped[dict] = mapped_column(sa.JSON)
    n_trials: Mapped[int]
    stop_requested: Mapped[bool] = mapped_column(default=False)
    claimed_by: Mapped[str | None] = mapped_column(sa.String(200))
    worker_pid: Mapped[int | None]
    heartbeat_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    attempts: Mapped[int] = mapped_column(default=0)
    error: Mapped[str | None] = mapped_column(sa.Text)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    started_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    ended_at: Mapped[dt.datetime | None] = mapped_column(UTCDateTime)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow,
                                                    onupdate=utcnow)
    waiting_for: Mapped[str | None] = mapped_column(sa.String(200))
    # the budget.stop_when rule that ended a COMPLETED study before its budget (hpo.stopping)
    stop_reason: Mapped[str | None] = mapped_column(sa.Text)


class SummaryRow(Base):
    """A study's summary (``hpo.summary.StudySummary.to_json``), one row per study; a table
    of its own, so that databases made before it get it from ``create_tables``."""

    __tablename__ = "hpo_study_summaries"

    study_id: Mapped[int] = mapped_column(sa.ForeignKey("hpo_studies.id", ondelete="CASCADE"),
                                          primary_key=True)
    summary: Mapped[str] = mapped_column(sa.Text)
    updated_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow,
                                                    onupdate=utcnow)


class UsageRow(Base):
    """Device-seconds of deleted studies, by owner: what ``hpo_device_seconds_total``
    (``service.metrics``) adds to the stored studies' so that it never goes down."""

    __tablename__ = "hpo_owner_usage"

    owner_id: Mapped[int] = mapped_column(sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                                          primary_key=True)
    device_seconds: Mapped[float] = mapped_column(sa.Float, default=0.0)


def build_engine(url: str, pool_size: int = 10) -> sa.Engine:
    """An engine for ``url`` with the options of the Optuna storage (SQLite: WAL, busy timeout).

    Args:
        pool_size: connections a server database's pool keeps (>= 1; 10 more may open at
            once, and close as they come back). A process whose threads use the engine
            concurrently needs one per thread: beyond it, each checkout opens a new
            connection (a PostgreSQL backend started and authenticated, 350 in 20 s under
            ``bench/load.py`` with the API's 20 threads on a pool of 10).

    Raises:
        hpo.errors.StorageError: the SQLite file cannot be switched to WAL.
        sqlalchemy.exc.ArgumentError: ``url`` is not a database URL.
    """
    sqlite = sa.engine.make_url(url).get_backend_name() == "sqlite"
    path = sqlite_path(url)  # None in memory (tests): SQLAlchemy's own pool, no WAL
    if path is not None:
        prepare_sqlite(path)
    kwargs = engine_kwargs(url, pre_ping=False)  # checked by ping_when_idle below
    if not sqlite:
        kwargs.update(pool_size=pool_size, max_overflow=10)
    engine = sa.create_engine(url, **kwargs)
    if sqlite:
        sync_normal(engine)
    ping_when_idle(engine)
    return engine


def create_tables(engine: sa.Engine) -> None:
    """Create the service's tables, or upgrade them, to the newest revision
    (:func:`service.migrate.upgrade`: idempotent, under a lock, safe to race)."""
    from service.migrate import upgrade

    upgrade(engine)


def session_factory(engine: sa.Engine) -> sessionmaker:
    return sessionmaker(engine, expire_on_commit=False)


def autocommit(sessions: sessionmaker) -> Session:
    """A session of ``sessions`` for reads and for writes of one statement, whose
    statements need no transaction of their own: on PostgreSQL its connection is in
    autocommit (:func:`hpo.engines.autocommit_engine`), elsewhere it is a plain session.
    A request that reads its token, then its study with the study's summary and quota in
    one session, so makes 4 round trips instead of 8. ``session.commit()`` and
    ``rollback()`` work as usual (on PostgreSQL they have nothing to send)."""
    return sessions(bind=autocommit_engine(sessions.kw["bind"]))


def one_statement(sessions: sessionmaker) -> contextlib.AbstractContextManager[sa.Connection]:
    """A connection of ``sessions``' engine for one write statement (or reads), committed
    when the block ends and rolled back if it raises: on PostgreSQL in autocommit (no BEGIN
    or COMMIT is sent, :func:`autocommit`), elsewhere a transaction. Without a session: the
    ORM session's set-up, connection and commit were a third of a Core INSERT's CPU."""
    return autocommit_engine(sessions.kw["bind"]).begin()


class QuotaRow(Base):
    """An owner's quota (issue 15.2); a limit that is ``None`` is not set. A study over its
    owner's quota waits (``hpo_studies.waiting_for``), never fails."""

    __tablename__ = "hpo_quotas"

    owner_id: Mapped[int] = mapped_column(sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                                          primary_key=True)
    max_running_trials: Mapped[int | None]
    max_gpus: Mapped[float | None] = mapped_column(sa.Float)
    device_seconds_per_day: Mapped[float | None] = mapped_column(sa.Float)
    device_seconds_total: Mapped[float | None] = mapped_column(sa.Float)


class TrialSlotRow(Base):
    """A running trial's hold on its owner's quota: taken before the trial starts, given back
    as it ends; slots of a study whose driver is gone are swept by the dispatcher."""

    __tablename__ = "hpo_trial_slots"

    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int | None] = mapped_column(sa.ForeignKey("hpo_tokens.id",
                                                               ondelete="CASCADE"), index=True)
    study_id: Mapped[int] = mapped_column(sa.ForeignKey("hpo_studies.id", ondelete="CASCADE"),
                                          index=True)
    trial: Mapped[str] = mapped_column(sa.String(200))
    gpus: Mapped[float] = mapped_column(sa.Float, default=0.0)
    devices: Mapped[float] = mapped_column(sa.Float, default=1.0)
    started_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)


class UsageEventRow(Base):
    """Device-seconds of one finished trial, by owner and end time: the rolling 24 h and
    total use that quotas and fair share read."""

    __tablename__ = "hpo_usage_events"

    id: Mapped[int] = mapped_column(primary_key=True)
    owner_id: Mapped[int | None] = mapped_column(sa.ForeignKey("hpo_tokens.id",
                                                               ondelete="CASCADE"), index=True)
    ended_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    device_seconds: Mapped[float] = mapped_column(sa.Float)


class DashboardSessionRow(Base):
    """A dashboard login (``service.dashboard_login``): the ``hpo_session`` cookie holds a
    random session id, stored here as its SHA-256 (as tokens are), never the token. It
    acts for its token while both are valid: until ``expires_at``
    (``HPO_DASHBOARD_SESSION_HOURS`` after the login), its logout, or the token's
    revocation or expiry. Deleting the token deletes its sessions."""

    __tablename__ = "hpo_dashboard_sessions"

    id: Mapped[int] = mapped_column(primary_key=True)
    session_hash: Mapped[str] = mapped_column(sa.String(64), unique=True)
    token_id: Mapped[int] = mapped_column(sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                                          index=True)
    created_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow)
    expires_at: Mapped[dt.datetime] = mapped_column(UTCDateTime, index=True)


class AuditRow(Base):
    """Who did what, when, from where (issue 15.5): creates, stops, deletes, token and quota
    changes. ``actor`` is the token's name (kept after the token is revoked)."""

    __tablename__ = "hpo_audit"

    id: Mapped[int] = mapped_column(primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(UTCDateTime, default=utcnow, index=True)
    actor: Mapped[str] = mapped_column(sa.String(64))
    action: Mapped[str] = mapped_column(sa.String(32))
    target: Mapped[str] = mapped_column(sa.String(200))
    address: Mapped[str | None] = mapped_column(sa.String(64))
    detail: Mapped[dict | None] = mapped_column(sa.JSON)
