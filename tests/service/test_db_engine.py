"""service.db.build_engine on each kind of database URL."""

from __future__ import annotations

import sqlalchemy as sa

from service.db import build_engine


def test_an_in_memory_sqlite_engine_opens_with_sqlalchemy_s_own_pool():
    """No path: no WAL file to prepare, and SQLite's pools take no ``max_overflow`` (a
    TypeError of ``create_engine`` for every command before)."""
    for url in ("sqlite://", "sqlite:///", "sqlite:///:memory:"):
        engine = build_engine(url)
        try:
            with engine.connect() as conn:
                assert conn.execute(sa.text("PRAGMA foreign_keys")).scalar() == 1
        finally:
            engine.dispose()
