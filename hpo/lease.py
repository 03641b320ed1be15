"""One lease primitive: a guarded UPDATE, atomic on SQLite and PostgreSQL.

A lease says who holds a named thing (``holder``), kept alive by a heartbeat.
Taking, renewing and releasing it are each one ``UPDATE ... WHERE`` whose
condition is the rule itself, so the database decides between two takers
without any sleep or read-back: on SQLite writes are serialized, and on
PostgreSQL the second ``UPDATE`` waits for the first's row lock and then
evaluates its condition against the row the first one wrote.

- take: ``SET holder = :me, heartbeat_at = :now WHERE key = :k AND (holder IS
  NULL OR holder = :me OR heartbeat_at < :stale_before)``, or, to take over a
  holder known to be gone, ``WHERE key = :k AND holder = :previous`` (a
  compare-and-set);
- renew and release: ``... WHERE key = :k AND holder = :me``.

:class:`LeaseColumns` says where one kind of lease is kept, so the same
functions keep two of them:

- ``hpo_leases`` (this module's table, in the storage database): one driver per
  study, for ``hpo run`` and the service's drivers alike (:class:`DriverLease`);
- the service's claim of a study (``hpo_studies.claimed_by``/``heartbeat_at``,
  ``service.dispatcher``, ``service.worker``), whose guards add the study's status.

A lease is stale, and may be taken, when its heartbeat is older than
``STALE_AFTER_S`` or its process is gone from this host (:func:`holder_gone`: a
driver killed with SIGKILL and started again on the same machine goes on at
once). Whether a process is gone is asked of :func:`trainers.process.process_alive`,
the project's one pid check.

A database that an earlier version used may still hold the old lease, a
``driver`` user attribute of the Optuna study: it is ignored (at worst stale).
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Sequence
from typing import Any

import sqlalchemy as sa

from hpo.errors import StudyBusyError

log = logging.getLogger(__name__)

HEARTBEAT_S = 5.0
STALE_AFTER_S = 30.0

_metadata = sa.MetaData()
LEASES = sa.Table(
    "hpo_leases", _metadata,
    sa.Column("name", sa.String(512), primary_key=True),
    sa.Column("holder", sa.String(64)),
    sa.Column("host", sa.String(255)),
    sa.Column("pid", sa.Integer),
    sa.Column("heartbeat_at", sa.Float),  # seconds since the epoch
)


@dataclasses.dataclass(frozen=True)
class LeaseColumns:
    """Where one kind of lease is kept: its table and its key, holder and heartbeat columns
    (Core columns or ORM attributes)."""

    table: Any
    key: Any
    holder: Any
    heartbeat_at: Any


DRIVER_LEASES = LeaseColumns(LEASES, LEASES.c.name, LEASES.c.holder, LEASES.c.heartbeat_at)

_FREE = object()  # take(): any holder that is absent, oneself or stale


def take(conn: sa.Connection | Any, cols: LeaseColumns, key: Any, me: str, *, now: Any,
         stale_before: Any = None, previous: Any = _FREE, guards: Sequence[Any] = (),
         values: dict | None = None, returning: Sequence[Any] = ()) -> Any:
    """Take the lease ``key`` for ``me`` in one guarded UPDATE; the updated row or ``None``.

    Args:
        conn: a connection or session inside a transaction (the caller commits).
        now: the heartbeat to write (the column's type: seconds or a datetime).
        stale_before: a heartbeat older than this is stale (same type as ``now``);
            ``None``: only a free lease or one's own is taken.
        previous: take over exactly this holder (compare-and-set; ``None`` matches a
            free lease), instead of any free, own or stale one.
        guards: further conditions (a study's status).
        values: further columns to set.
        returning: columns of the row to return (the key when empty).
    """
    if previous is _FREE:
        free = [cols.holder.is_(None), cols.holder == me]
        if stale_before is not None:
            free += [cols.heartbeat_at.is_(None), cols.heartbeat_at < stale_before]
        held_by = sa.or_(*free)
    else:
        held_by = cols.holder.is_(None) if previous is None else cols.holder == previous
    return _update(conn, cols, key, [held_by, *guards],
                   {cols.holder: me, cols.heartbeat_at: now, **(values or {})}, returning)


def while_held(conn: sa.Connection | Any, cols: LeaseColumns, key: Any, me: str, *,
               guards: Sequence[Any] = (), values: dict,
               returning: Sequence[Any] = ()) -> Any:
    """Set ``values`` on the lease's row only while ``me`` holds it (renew: a new heartbeat;
    release: ``holder`` to ``None``; a study's end); the updated row or ``None`` when
    ``me`` no longer holds it."""
    return _update(conn, cols, key, [cols.holder == me, *guards], values, returning)


def _update(conn, cols: LeaseColumns, key, where: list, values: dict, returning) -> Any:
    stmt = (sa.update(cols.table).where(cols.key == key, *where).values(values)
            .returning(*(returning or [cols.key])))
    return conn.execute(stmt).first()


def holder_gone(host: str | None, pid: int | None) -> bool:
    """Whether a holder's process, on this host, no longer runs (``False`` when the holder
    is on another host or its pid is unknown: only its heartbeat can tell)."""
    # imported here: the package ``trainers`` imports torch (1.5 s of CPU), which a study
    # driver that ends before it trains (service.worker: stopped while it started) skips
    from trainers.process import process_alive

    return host == socket.gethostname() and pid is not None and not process_alive(int(pid))


# -- one driver per study ----------------------------------------------------------------

_HAS_LEASES: set[str] = set()  # databases (URLs) where hpo_leases is known to exist


def create_table(engine: sa.Engine) -> None:
    """Make ``hpo_leases`` unless it exists (two processes may race to make it); after it,
    :func:`forget` in this process no longer asks the database whether it exists."""
    try:
        _metadata.create_all(engine, checkfirst=True)
    except sa.exc.DBAPIError:  # another process made it between the check and the CREATE
        if not sa.inspect(engine).has_table(LEASES.name):
            raise
    _HAS_LEASES.add(engine.url.render_as_string())


def read(engine: sa.Engine, name: str) -> sa.Row | None:
    """The stored lease ``name`` (holder, host, pid, heartbeat_at), or ``None``."""
    with engine.connect() as conn:
        return conn.execute(sa.select(LEASES).where(LEASES.c.name == name)).first()


def acquire(engine: sa.Engine, name: str, holder: str, *, host: str, pid: int,
            now: float | None = None, stale_after_s: float = STALE_AFTER_S) -> bool:
    """Take the lease ``name`` for ``holder`` (running as ``pid`` on ``host``): True when
    taken, False when another live holder keeps it. Makes the lease's row if missing."""
    now = time.time() if now is None else now
    try:
        with engine.begin() as conn:
            conn.execute(sa.insert(LEASES).values(name=name))
    except sa.exc.IntegrityError:
        pass  # it exists already
    current = read(engine, name)
    previous = _FREE
    if (current is not None and current.holder not in (None, holder)
            and holder_gone(current.host, current.pid)):
        previous = current.holder
    with engine.begin() as conn:
        return take(conn, DRIVER_LEASES, name, holder, now=now,
                    stale_before=now - stale_after_s, previous=previous,
                    values={LEASES.c.host: host, LEASES.c.pid: pid}) is not None


def renew(engine: sa.Engine, name: str, holder: str, now: float | None = None) -> bool:
    """A new heartbeat for ``holder``'s lease; False when ``holder`` no longer holds it."""
    with engine.begin() as conn:
        return while_held(conn, DRIVER_LEASES, name, holder, values={
            LEASES.c.heartbeat_at: time.time() if now is None else now}) is not None


def release(engine: sa.Engine, name: str, holder: str) -> bool:
    """Free ``holder``'s lease; False when ``holder`` did not hold it."""
    with engine.begin() as conn:
        return while_held(conn, DRIVER_LEASES, name, holder, values={
            LEASES.c.holder: None, LEASES.c.pid: None}) is not None


def forget(conn: sa.Connection, name: str) -> None:
    """Remove the lease ``name`` if no one holds it (its study was deleted); a held one
    stays until released or stale. Nothing when ``hpo_leases`` was never made (the service
    makes it at start-up, so that this needs no look at the schema per delete)."""
    statement = forget_statement(conn, name)
    if statement is not None:
        conn.execute(statement)


def forget_statement(conn: sa.Connection, name: str) -> sa.Delete | None:
    """:func:`forget`'s DELETE (to run alone or in a statement of the caller's), or None when
    ``hpo_leases`` was never made."""
    url = conn.engine.url.render_as_string()
    if url not in _HAS_LEASES and sa.inspect(conn).has_table(LEASES.name):
        _HAS_LEASES.add(url)  # tables are never dropped under a running process
    if url not in _HAS_LEASES:
        return None
    return sa.delete(LEASES).where(LEASES.c.name == name, LEASES.c.holder.is_(None))


class DriverLease:
    """Context manager holding a study's driver lease (see module doc), renewed every
    ``HEARTBEAT_S`` seconds by a thread while held.

    Args:
        storage: the study's Optuna ``RDBStorage`` (its engine keeps ``hpo_leases``).
        study_name: the study.

    Raises:
        StudyBusyError: on entry, when a live driver holds the study.
    """

    def __init__(self, storage: Any, study_name: str) -> None:
        self.engine: sa.Engine = storage.engine
        self.name = study_name
        self.holder = uuid.uuid4().hex
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="hpo-lease", daemon=True)

    def __enter__(self) -> DriverLease:
        create_table(self.engine)
        if not acquire(self.engine, self.name, self.holder, host=socket.gethostname(),
                       pid=os.getpid()):
            other = read(self.engine, self.name)
            age = time.time() - float(other.heartbeat_at or 0) if other else 0.0
            raise StudyBusyError(
                f"study {self.name!r} is being run by another driver (pid "
                f"{other.pid if other else None} on {other.host if other else None}, heartbeat "
                f"{age:.0f} s ago); it is free again {STALE_AFTER_S:.0f} s after that driver "
                f"stops")
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._done.wait(HEARTBEAT_S):
            try:
                if not renew(self.engine, self.name, self.holder):
                    log.error("study %s: driver lease %s lost", self.name, self.holder)
                    return
            except sa.exc.SQLAlchemyError as e:  # a missed beat is retried; staleness is 30 s
                log.warning("study %s: lease renewal failed: %s", self.name, e)

    def held(self) -> bool:
        """Whether this driver still holds the study (renewing the lease): one that lost
        it (a stall past ``STALE_AFTER_S``) must not end what the new holder runs.

        Raises:
            sqlalchemy.exc.SQLAlchemyError: the database cannot be reached.
        """
        return renew(self.engine, self.name, self.holder)

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=HEARTBEAT_S)
        with contextlib.suppress(sa.exc.SQLAlchemyError):  # unreleased, it goes stale
            release(self.engine, self.name, self.holder)
