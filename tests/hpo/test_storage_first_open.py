"""Opening a fresh database from several processes at once (``hpo.storage.open_storage``).

Optuna's ``RDBStorage`` creates its tables (``metadata.create_all``: each table checked,
then created), its ``version_info`` row and its alembic stamp outside any lock: processes
opening a new database together (a first ``docker compose up``: ``hpo serve`` beside
``hpo token create``, several drivers) failed with "table trials already exists" on SQLite,
``UniqueViolation ... pg_type_typname_nsp_index`` or ``DuplicateTable`` on PostgreSQL.
"""

from __future__ import annotations

import multiprocessing as mp
import traceback
import uuid

import pytest
import sqlalchemy as sa

from hpo.errors import StorageError
from hpo.storage import open_storage

N_PROCESSES = 4
N_ROUNDS = 3  # a fresh database each round, opened by every process at once


def _open_each(urls: list[str], barrier, results) -> None:
    """Open each of ``urls`` in turn, at the same moment as the other processes; one result
    a URL: ``None``, or the failure's traceback."""
    for url in urls:
        try:
            barrier.wait(timeout=120)
            open_storage(url).engine.dispose()
            results.put(None)
        except Exception:  # noqa: BLE001 - reported to the parent
            results.put(traceback.format_exc())


def _open_together(urls: list[str]) -> list[str]:
    """Every process opens each of ``urls``, all at once; the tracebacks of the failures."""
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(N_PROCESSES), ctx.Queue()
    procs = [ctx.Process(target=_open_each, args=(urls, barrier, results))
             for _ in range(N_PROCESSES)]
    for p in procs:
        p.start()
    try:  # read before joining: a process exits only once what it put has been read
        found = [results.get(timeout=300) for _ in range(N_PROCESSES * len(urls))]
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.exitcode is None:
                p.kill()
    assert [p.exitcode for p in procs] == [0] * N_PROCESSES
    return [f for f in found if f is not None]


def _assert_initialized_once(url: str) -> None:
    """One version row and one alembic stamp, at Optuna's head; the storage opens and works."""
    storage = open_storage(url)
    with storage.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT count(*) FROM version_info")).scalar() == 1
        stamps = conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalars()
        assert list(stamps) == [storage.get_head_version()]
    assert storage.get_all_studies() == []
    storage.engine.dispose()


@pytest.mark.slow  # 7 s here (2 busy cores), mostly the processes starting
def test_processes_opening_a_new_sqlite_database_at_once_all_succeed(tmp_path):
    urls = [f"sqlite:///{tmp_path / f'round{i}' / 'new.db'}" for i in range(N_ROUNDS)]
    found = _open_together(urls)
    assert not found, f"{len(found)} of {N_PROCESSES * N_ROUNDS} opens failed:\n{found[0]}"
    for url in urls:
        _assert_initialized_once(url)


@pytest.fixture
def new_pg_databases(pg_url):
    """``N_ROUNDS`` new, empty PostgreSQL databases on the test server (dropped after)."""
    server = sa.create_engine(pg_url, isolation_level="AUTOCOMMIT")
    names = [f"hpo_first_open_{uuid.uuid4().hex[:12]}" for _ in range(N_ROUNDS)]
    try:
        with server.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        base = sa.make_url(pg_url)
        yield [base.set(database=name).render_as_string(hide_password=False)
               for name in names]
    finally:
        with server.connect() as conn:
            for name in names:
                conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        server.dispose()


@pytest.mark.slow  # 12 s here (2 cores)
def test_processes_opening_a_new_postgresql_database_at_once_all_succeed(new_pg_databases):
    found = _open_together(new_pg_databases)
    assert not found, f"{len(found)} of {N_PROCESSES * N_ROUNDS} opens failed:\n{found[0]}"
    for url in new_pg_databases:
        _assert_initialized_once(url)


def test_a_storage_error_is_one_line_without_the_sql_statement(tmp_path):
    """SQLAlchemy's message carries the statement (a CREATE TABLE of 10 lines) and a link;
    the error says what the database said, on one line."""
    path = tmp_path / "x.db"
    with sa.create_engine(f"sqlite:///{path}").begin() as conn:  # an index takes the name
        conn.exec_driver_sql("CREATE TABLE other (x INTEGER)")
        conn.exec_driver_sql("CREATE INDEX studies ON other (x)")
    with pytest.raises(StorageError) as info:
        open_storage(f"sqlite:///{path}")
    message = str(info.value)
    assert "\n" not in message and "[SQL" not in message and "CREATE" not in message
    assert message == (f"cannot open storage sqlite:///{path}: (sqlite3.OperationalError) "
                       "there is already an index named studies")


def test_a_process_waiting_for_the_database_lock_says_so_then_takes_it(db_url, caplog,
                                                                      monkeypatch):
    """helper-39: ``hpo serve`` and the CLI waited silently, port bound, while another
    process held the migration lock (a stuck ``hpo db upgrade``)."""
    import threading
    import time

    from hpo import engines
    from hpo.engines import database_lock

    held, release, order = threading.Event(), threading.Event(), []

    def holder():
        with database_lock(db_url, "migrate-test", 0x7465_7374):
            held.set()
            release.wait(30)
            order.append("holder done")

    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(30)
    monkeypatch.setattr(engines, "LOCK_QUIET_S", 0.3)  # a wait this long says so
    threading.Timer(1.0, release.set).start()
    started = time.monotonic()
    with caplog.at_level("WARNING", logger="hpo.engines"), \
            database_lock(db_url, "migrate-test", 0x7465_7374):
        order.append("waiter in")
    thread.join(30)
    assert order == ["holder done", "waiter in"] and time.monotonic() - started >= 0.9
    assert [r.getMessage() for r in caplog.records] == [
        "waiting for the database's migrate-test lock, which another process has held for "
        "more than 0 s (a service starting or migrating, or `hpo db upgrade`)"]
    caplog.clear()
    with caplog.at_level("WARNING", logger="hpo.engines"), \
            database_lock(db_url, "migrate-test", 0x7465_7374):  # free: no word
        pass
    assert caplog.records == []
    release.clear()  # held for less than LOCK_QUIET_S: taken without a word
    held.clear()
    monkeypatch.setattr(engines, "LOCK_QUIET_S", 3.0)
    thread = threading.Thread(target=holder)
    thread.start()
    assert held.wait(30)
    threading.Timer(0.5, release.set).start()
    with caplog.at_level("WARNING", logger="hpo.engines"), \
            database_lock(db_url, "migrate-test", 0x7465_7374):
        pass
    thread.join(30)
    assert caplog.records == []
