"""The API's thread pool and its database pools agree (``HPO_API_THREADS``): a request thread
always finds a kept connection, so none is opened and closed per checkout (a PostgreSQL
backend each: 350 in 20 s under bench/load.py with 20 threads on a pool of 10)."""

from __future__ import annotations

import threading

import anyio.to_thread
import sqlalchemy as sa
from fastapi.testclient import TestClient

from service.app import create_app
from service.settings import Settings


def test_thread_limiter_and_pools_follow_api_threads(pg_url, tmp_path):
    settings = Settings(database_url=pg_url, results_dir=tmp_path / "r", run_dispatcher=False,
                        api_threads=7)
    app = create_app(settings)
    engine = app.state.components.sessions.kw["bind"]
    storage = app.state.components.studies.storage
    assert engine.pool.size() == 9  # the threads, the dispatcher, /readyz
    assert storage.engine.pool.size() == 7
    with TestClient(app) as client:
        tokens = client.portal.call(
            lambda: anyio.to_thread.current_default_thread_limiter().total_tokens)
    assert tokens == 7


def test_concurrent_sessions_reuse_kept_connections(pg_url):
    from service.db import build_engine

    engine = build_engine(pg_url, pool_size=8)
    opened = []
    sa.event.listen(engine, "connect", lambda *_: opened.append(1))
    barrier = threading.Barrier(8)

    def hold() -> None:
        with engine.connect() as conn:
            barrier.wait(10)  # all 8 checked out at once
            conn.execute(sa.text("SELECT 1"))

    for _ in range(3):  # three rounds of 8 at once: the first opens 8, the others none
        threads = [threading.Thread(target=hold) for _ in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    engine.dispose()
    assert len(opened) == 8


def test_sqlite_engines_take_no_pool_size(sqlite_url):
    from hpo.storage import open_storage
    from service.db import build_engine

    build_engine(sqlite_url, pool_size=3).dispose()
    open_storage(sqlite_url, pool_size=3).engine.dispose()
