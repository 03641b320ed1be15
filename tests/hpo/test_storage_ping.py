"""hpo.engines.ping_when_idle: a pooled PostgreSQL connection is pinged only after it sat idle,
and a dead one is replaced before use then; one lost while busy fails once, then the pool is
new."""

from __future__ import annotations

import time

import pytest
import sqlalchemy as sa

from hpo.engines import engine_kwargs, ping_when_idle
from hpo.storage import open_storage


def _engine(url: str, idle_s: float, pings: list) -> sa.Engine:
    engine = sa.create_engine(url, **engine_kwargs(url, pre_ping=False), pool_size=1,
                              max_overflow=0)
    ping_when_idle(engine, idle_s)
    real = engine.dialect.do_ping
    engine.dialect.do_ping = lambda conn: pings.append(1) or real(conn)
    return engine


def _backend_pid(engine: sa.Engine) -> int:
    with engine.connect() as conn:
        return conn.execute(sa.text("SELECT pg_backend_pid()")).scalar_one()


def _kill(url: str, pid: int) -> None:
    other = sa.create_engine(url, poolclass=sa.pool.NullPool)
    with other.begin() as conn:
        assert conn.execute(sa.text("SELECT pg_terminate_backend(:p)"), {"p": pid}).scalar()
    other.dispose()


def test_a_busy_connection_is_not_pinged_an_idle_one_is_and_a_dead_one_replaced(pg_url):
    pings: list = []
    engine = _engine(pg_url, 0.5, pings)
    first = _backend_pid(engine)  # a new connection: pinged once
    assert len(pings) == 1
    for _ in range(5):  # checked out again at once: no round trip
        assert _backend_pid(engine) == first
    assert len(pings) == 1
    _kill(pg_url, first)
    time.sleep(0.6)  # idle past idle_s: the ping finds it dead, a new one is used
    second = _backend_pid(engine)
    assert second != first and len(pings) >= 2
    engine.dispose()


def test_a_connection_lost_while_busy_fails_once_then_the_pool_is_new(pg_url):
    pings: list = []
    engine = _engine(pg_url, 3600.0, pings)
    first = _backend_pid(engine)
    _kill(pg_url, first)
    with pytest.raises(sa.exc.OperationalError), engine.connect() as conn:
        conn.execute(sa.text("SELECT 1"))
    assert _backend_pid(engine) != first  # SQLAlchemy invalidated the pool
    engine.dispose()


def test_optunas_storage_keeps_pre_ping_a_driver_never_sees_a_lost_connection(pg_url):
    # a study driver's record write that failed once would fail a trial or the study
    storage = open_storage(pg_url)
    storage.get_all_studies()
    pooled = storage.engine.pool.checkedin()
    assert pooled >= 1
    conns = [storage.engine.connect() for _ in range(pooled)]  # every pooled one, busy
    pids = [c.execute(sa.text("SELECT pg_backend_pid()")).scalar_one() for c in conns]
    for c in conns:
        c.close()
    for pid in pids:
        _kill(pg_url, pid)
    storage.get_all_studies()  # at once, without an error
    storage.engine.dispose()


def test_sqlite_engines_are_left_alone(tmp_path):
    url = f"sqlite:///{tmp_path / 'a.db'}"
    storage = open_storage(url)
    assert len(storage.engine.pool.dispatch.checkout) == 0  # no listener: nothing to ping
    with storage.engine.connect() as conn:
        assert conn.execute(sa.text("SELECT 1")).scalar_one() == 1


def test_statement_parameters_stay_out_of_error_messages(tmp_path, pg_url):
    # they hold token hashes and specs; SQLAlchemy's errors (and so the logs) showed them
    from service.db import build_engine

    for url in (f"sqlite:///{tmp_path / 'b.db'}", pg_url):
        for engine in (build_engine(url), open_storage(url).engine):
            with pytest.raises(sa.exc.DBAPIError) as info, engine.connect() as conn:
                conn.execute(sa.text("SELECT * FROM no_such_table WHERE x = :x"),
                             {"x": "secret-hash-123"})
            assert "secret-hash-123" not in str(info.value), url
            assert "hidden due to hide_parameters" in str(info.value)
            engine.dispose()
