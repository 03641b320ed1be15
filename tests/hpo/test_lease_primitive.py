"""The one lease primitive (``hpo.lease``) on SQLite and PostgreSQL: taking, renewing,
releasing, taking over a dead or silent holder, and racers of which exactly one wins."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
import uuid

import pytest
import sqlalchemy as sa

from hpo.engines import engine_kwargs
from hpo.lease import STALE_AFTER_S, acquire, create_table, holder_gone, read, release, renew

HOST = socket.gethostname()


@pytest.fixture
def engine(db_url):
    engine = sa.create_engine(db_url, **engine_kwargs(db_url))
    create_table(engine)
    yield engine
    engine.dispose()


@pytest.fixture
def name() -> str:
    return f"lease-{uuid.uuid4().hex[:12]}"


def test_a_free_lease_is_taken_renewed_and_released_only_by_its_holder(engine, name):
    assert acquire(engine, name, "a", host=HOST, pid=os.getpid(), now=1000.0)
    assert not acquire(engine, name, "b", host=HOST, pid=os.getpid(), now=1001.0)
    assert acquire(engine, name, "a", host=HOST, pid=os.getpid(), now=1002.0)  # one's own
    assert not renew(engine, name, "b", now=1003.0)
    assert renew(engine, name, "a", now=1004.0)
    row = read(engine, name)
    assert (row.holder, row.host, row.pid, row.heartbeat_at) == ("a", HOST, os.getpid(), 1004.0)
    assert not release(engine, name, "b")
    assert release(engine, name, "a")
    assert read(engine, name).holder is None
    assert not renew(engine, name, "a", now=1005.0)  # released: renewing does not take it
    assert acquire(engine, name, "b", host=HOST, pid=os.getpid(), now=1006.0)


def test_a_silent_holder_on_another_host_keeps_its_lease_until_stale(engine, name):
    assert acquire(engine, name, "far", host="elsewhere", pid=1, now=1000.0)
    assert not acquire(engine, name, "near", host=HOST, pid=os.getpid(),
                       now=1000.0 + STALE_AFTER_S - 1)
    assert acquire(engine, name, "near", host=HOST, pid=os.getpid(),
                   now=1000.0 + STALE_AFTER_S + 1)
    assert read(engine, name).holder == "near"
    assert not renew(engine, name, "far")  # the old holder learns it lost the lease


def test_a_holder_whose_process_on_this_host_is_gone_is_taken_over_at_once(engine, name):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    assert holder_gone(HOST, dead.pid) and not holder_gone(HOST, os.getpid())
    assert not holder_gone("elsewhere", dead.pid)  # another host: only its heartbeat tells
    assert acquire(engine, name, "alive", host=HOST, pid=os.getpid(), now=1000.0)
    assert not acquire(engine, name, "other", host=HOST, pid=os.getpid(), now=1001.0)
    assert release(engine, name, "alive")
    assert acquire(engine, name, "killed", host=HOST, pid=dead.pid, now=1000.0)
    assert acquire(engine, name, "restarted", host=HOST, pid=os.getpid(), now=1001.0)
    assert read(engine, name).holder == "restarted"


def test_starters_at_the_same_instant_exactly_one_wins(db_url, name):
    """Each racer has its own engine (as separate processes would) and they all take the
    lease at one instant; the database lets exactly one through, with no sleep."""
    n_racers, n_rounds = 8, 5
    engines = [sa.create_engine(db_url, **engine_kwargs(db_url)) for _ in range(n_racers)]
    create_table(engines[0])
    try:
        for round_ in range(n_rounds):
            key = f"{name}-{round_}"
            barrier = threading.Barrier(n_racers)
            won: list[str] = []

            def race(i: int, key: str = key, barrier: threading.Barrier = barrier,
                     won: list[str] = won) -> None:
                barrier.wait()
                if acquire(engines[i], key, f"racer-{i}", host=HOST, pid=os.getpid(),
                           now=1000.0):
                    won.append(f"racer-{i}")

            threads = [threading.Thread(target=race, args=(i,)) for i in range(n_racers)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert len(won) == 1, won
            assert read(engines[0], key).holder == won[0]
    finally:
        for e in engines:
            e.dispose()


def test_forget_removes_only_a_free_lease_in_one_statement(db_url, name, monkeypatch):
    from hpo import lease

    monkeypatch.setattr(lease, "_HAS_LEASES", set())  # as in a process that just started
    engine = sa.create_engine(db_url, **engine_kwargs(db_url))
    create_table(engine)  # what the service does at start-up
    statements: list[str] = []
    sa.event.listen(engine, "before_cursor_execute",
                    lambda conn, cursor, statement, *args: statements.append(statement))
    try:
        assert acquire(engine, name, "a", host=HOST, pid=os.getpid())
        for holder, kept in (("a", True), (None, False)):  # held: it stays
            if holder is None:
                assert release(engine, name, "a")
            statements.clear()
            with engine.begin() as conn:
                lease.forget(conn, name)
            assert [s.split()[0] for s in statements] == ["DELETE"]  # no look at the schema
            assert (read(engine, name) is not None) == kept
    finally:
        engine.dispose()
