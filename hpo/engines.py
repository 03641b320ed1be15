"""SQLAlchemy engines of the databases: the Optuna storage's (``hpo.storage``) and the
service's own (``service.db``); server databases are checked before use only after
sitting idle (:func:`ping_when_idle`).

SQLite is opened in WAL mode with a busy timeout, so that concurrent trials'
writes and a dashboard reading the same file wait for each other instead of
failing with "database is locked" (optuna#820, optuna-dashboard#545). WAL is a
property of the database file and is set once, before an engine opens it;
the busy timeout (``connect_args``) and ``synchronous=NORMAL`` are per connection.
Tables are created and migrated under a lock across processes (:func:`database_lock`).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import re
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import sqlalchemy
import sqlalchemy.event
import sqlalchemy.exc
import sqlalchemy.pool
from sqlalchemy.engine import make_url

from hpo.errors import StorageError

_log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_S = 60.0


def sqlite_path(url: str) -> Path | None:
    """The database file of a ``sqlite:///`` URL, or ``None`` (other backends, in-memory)."""
    parsed = make_url(url)
    if parsed.get_backend_name() != "sqlite" or parsed.database in (None, "", ":memory:"):
        return None
    return Path(parsed.database)


def prepare_sqlite(path: Path) -> None:
    """Create the file's directory and switch the database to WAL mode."""
    path.parent.mkdir(parents=True, exist_ok=True)
    con = sqlite3.connect(path, timeout=SQLITE_BUSY_TIMEOUT_S)
    try:
        mode = con.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise StorageError(f"cannot switch {path} to WAL mode (got {mode})")
    finally:
        con.close()


def sync_normal(engine: sqlalchemy.engine.Engine) -> None:
    """On every connection of a SQLite ``engine`` (the Optuna storage's, the service's):

    * ``synchronous=NORMAL``: in WAL mode a commit then needs no fsync; a crashed process
      loses nothing, a power cut at most the last commits, and the file is never
      corrupted (SQLite's documentation of WAL). About 1/3 faster writes.
    * ``foreign_keys=ON``: SQLite enforces no foreign key unless asked, so a trial's
      write that raced the delete of its study (or trial) was kept as an orphan row,
      and SQLite gives a deleted study's or trial's id to the next one made (the
      largest id + 1): the orphans then belonged to another study, perhaps another
      owner's. Enforced, such a write fails, and ``ON DELETE CASCADE`` works, as on
      PostgreSQL. Optuna deletes children first (its models' cascades), as the
      service's own deletes do (``hpo.study_sql``); schema migrations turn it off for
      their connection (``service.migrate``: SQLite's table rebuilds need that).
    """
    def on_connect(con, _) -> None:
        con.execute("PRAGMA synchronous=NORMAL")
        con.execute("PRAGMA foreign_keys=ON")

    sqlalchemy.event.listen(engine, "connect", on_connect)
    engine.dispose()  # connections Optuna opened while creating its tables get it too


def engine_kwargs(url: str, pre_ping: bool = True) -> dict:
    """SQLAlchemy engine options for ``url``: the busy timeout on SQLite; on a server database
    ``pool_pre_ping`` unless ``pre_ping`` is false (then check connections with
    :func:`ping_when_idle`). Statement parameters are left out of error messages and logs
    (``hide_parameters``): they include token hashes and specs."""
    if make_url(url).get_backend_name() == "sqlite":
        return {"connect_args": {"timeout": SQLITE_BUSY_TIMEOUT_S}, "hide_parameters": True}
    return {"pool_pre_ping": pre_ping, "hide_parameters": True}


PING_AFTER_IDLE_S = 10.0


def ping_when_idle(engine: sqlalchemy.Engine, idle_s: float = PING_AFTER_IDLE_S) -> None:
    """Check a pooled connection of ``engine`` (not SQLite's) before use when it has been
    idle in the pool ``idle_s`` seconds or more; a dead one is replaced before the caller
    sees it. SQLAlchemy's ``pool_pre_ping`` pings at every checkout: a round trip to the
    server per transaction, about 15 % of the API's request time under bench/load.py on
    PostgreSQL. A connection lost while in busy use (the server restarted within
    ``idle_s``) fails its next statement instead, and SQLAlchemy then drops every pooled
    connection of that time (its disconnect handling), so that the next one is new. For the
    service's own engine and the API's Optuna storage (a request that fails so answers 503
    once); a study driver's Optuna storage keeps ``pool_pre_ping``, because a record write
    that failed once would fail a trial or the study.

    Args:
        engine: a SQLAlchemy engine.
        idle_s: seconds, >= 0 (0: ping at every checkout, as ``pool_pre_ping``).
    """
    if engine.dialect.name == "sqlite":
        return

    @sqlalchemy.event.listens_for(engine, "checkin")
    def _checked_in(dbapi_connection, record) -> None:
        record.info["hpo_idle_since"] = time.monotonic()

    @sqlalchemy.event.listens_for(engine, "checkout")
    def _checked_out(dbapi_connection, record, proxy) -> None:
        since = record.info.get("hpo_idle_since")
        if since is not None and time.monotonic() - since < idle_s:
            return
        try:
            alive = engine.dialect.do_ping(dbapi_connection)
        except Exception:  # noqa: BLE001 - any failure: the pool retries with a new one
            alive = False
        if not alive:
            raise sqlalchemy.exc.DisconnectionError("a pooled connection did not answer")


def redact(url: str) -> str:
    """``url`` for messages and logs, its user information hidden: everything between
    ``://`` and the URL's last ``@`` becomes ``***`` (``postgresql+psycopg://***@host/db``),
    and so does the value of a ``password=`` parameter.

    The text is cut, not parsed: a password holding an ``@`` not written ``%40`` makes
    URL parsers end the user information at its first ``@``, and then show the rest of
    the password as the host, port and database (``p@ss/w#rd`` showed ``ss/w%23rd``).
    Hiding up to the last ``@`` hides all of it whatever characters it holds; a URL that
    no parser reads is shown so too, never the password in it.
    """
    scheme, sep, rest = url.partition("://")
    if not sep:
        scheme, rest = "", url
    at = rest.rfind("@")
    if at >= 0:
        rest = "***" + rest[at:]
    return scheme + sep + _PASSWORD_PARAMETER.sub(r"\1***", rest)


_PASSWORD_PARAMETER = re.compile(r"(password=)[^&\s]*", re.IGNORECASE)


def autocommit_engine(engine: sqlalchemy.Engine) -> sqlalchemy.Engine:
    """``engine`` for reads and for writes of one statement: on PostgreSQL the same pool
    with its connections in autocommit, so each statement is sent alone, without the BEGIN
    before it and the ROLLBACK or COMMIT after (a one-statement read: 1 round trip instead
    of 3). Under READ COMMITTED every statement of a transaction sees a snapshot of its own
    anyway, so what reads see is unchanged. Elsewhere ``engine`` itself (SQLite's
    transaction keeps one snapshot across its statements).

    Made once per engine and kept in the engine's own ``__dict__`` (building it was 4 % of a
    create's CPU): the variant holds ``engine``, so a cache outside it would keep every
    engine alive with its pool's connections; kept in it, the two go together."""
    if engine.dialect.name != "postgresql":
        return engine
    variant = engine.__dict__.get(_AUTOCOMMIT_KEY)
    if variant is None:
        variant = engine.__dict__[_AUTOCOMMIT_KEY] = engine.execution_options(
            isolation_level="AUTOCOMMIT")
    return variant


_AUTOCOMMIT_KEY = "_hpo_autocommit_variant"


@contextlib.contextmanager
def database_lock(url: str, name: str, key: int) -> Iterator[None]:
    """Hold, for the block, the lock ``name`` of the database ``url``, across processes:
    the lock under which a database's tables are created or migrated (the Optuna
    storage's, ``hpo.storage.open_storage``; the service's, ``service.migrate``).

    On SQLite an exclusive ``flock`` of the file ``<database>.<name>-lock`` beside the
    database (not of the database file: on NFS, Linux emulates ``flock`` with the
    byte-range locks SQLite itself takes); on PostgreSQL the advisory lock ``key`` (one
    per database), held by a transaction on a connection of its own and released when
    the block ends or the process dies. Other backends take no lock.

    Raises:
        OSError: the lock file cannot be opened.
        sqlalchemy.exc.SQLAlchemyError: PostgreSQL cannot be reached.
    """
    path = sqlite_path(url)
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        with open(path.with_name(f"{path.name}.{name}-lock"), "a") as handle:
            if not _within(LOCK_QUIET_S, lambda: _flock_now(handle)):
                _say_waiting(name)
                fcntl.flock(handle, fcntl.LOCK_EX)  # released when the file is closed
            yield
        return
    if make_url(url).get_backend_name() != "postgresql":
        yield
        return
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool,
                                      hide_parameters=True)
    try:
        with engine.begin() as conn:
            if not _within(LOCK_QUIET_S, lambda: conn.execute(sqlalchemy.text(
                    "SELECT pg_try_advisory_xact_lock(:key)"), {"key": key}).scalar()):
                _say_waiting(name)
                conn.execute(sqlalchemy.text("SELECT pg_advisory_xact_lock(:key)"),
                             {"key": key})
            yield
    finally:
        engine.dispose()


# a lock taken within this long says nothing: processes opening one database at once take
# it in turn for a moment (helper-40: every driver's open warned)
LOCK_QUIET_S = 3.0


def _flock_now(handle) -> bool:
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    return True


def _within(seconds: float, take: Callable[[], bool]) -> bool:
    """Whether ``take()`` (a try-lock) succeeds within ``seconds``, tried every 50 ms."""
    deadline = time.monotonic() + seconds
    while not take():
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _say_waiting(name: str) -> None:
    """Say why a start waits (helper-39: ``hpo serve`` and the CLI hung silently, port
    bound, while another process held the lock). No time limit: a migration of a large
    database may take long; the process holding the lock is the one to look at."""
    _log.warning("waiting for the database's %s lock, which another process has held for "
                 "more than %.0f s (a service starting or migrating, or `hpo db upgrade`)", name,
                 LOCK_QUIET_S)
