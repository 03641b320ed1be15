"""Shared fixtures: one Ray session for the whole run, storages, the test-task plugin."""

from __future__ import annotations

import os
import sys
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PLUGIN = REPO / "tests" / "hpo" / "plugin"  # registers the toy-hpo task (entry point)

# Ray workers are separate processes: they find the test tasks through PYTHONPATH.
sys.path.insert(0, str(PLUGIN))
os.environ["PYTHONPATH"] = os.pathsep.join(
    p for p in [str(REPO), str(PLUGIN), os.environ.get("PYTHONPATH", "")] if p)

pytest_plugins = ["tests.tiers"]  # the markers ray and server, set from fixtures, and guards


@pytest.fixture(scope="session")
def ray_session():
    """One local Ray (2 CPUs) shared by every test that needs it."""
    import ray

    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="WARNING",
                 log_to_driver=False)
    yield ray
    ray.shutdown()


@pytest.fixture
def sqlite_url(tmp_path) -> str:
    return f"sqlite:///{tmp_path / 'optuna.db'}"


PG_URL = os.environ.get("HPO_TEST_DATABASE_URL",
                        "postgresql+psycopg://postgres@127.0.0.1:5432/test")


def postgres_unreachable(url: str) -> str | None:
    """``None`` when PostgreSQL answers at ``url``, else why not (a skip reason)."""
    import sqlalchemy

    try:
        engine = sqlalchemy.create_engine(url, connect_args={"connect_timeout": 3})
        with engine.connect() as conn:
            conn.execute(sqlalchemy.text("SELECT 1"))
        engine.dispose()
    except Exception as e:  # noqa: BLE001 - any failure means "not available here"
        return (f"PostgreSQL unreachable at HPO_TEST_DATABASE_URL={url}: {type(e).__name__} "
                "(CI runs it at postgresql+psycopg://postgres@127.0.0.1:5432/test)")
    return None


@pytest.fixture(scope="session")
def pg_server() -> str:
    """The test PostgreSQL (``HPO_TEST_DATABASE_URL``, else the local server), probed once;
    the tests that need it skip, naming the reason, where it does not answer."""
    reason = postgres_unreachable(PG_URL)
    if reason is not None:
        pytest.skip(reason)
    return PG_URL


@pytest.fixture
def pg_url(pg_server) -> str:
    return pg_server


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request) -> str:
    """Each database the product supports: a test using it runs on SQLite and on PostgreSQL
    (which skips with the reason where it does not answer)."""
    return request.getfixturevalue("sqlite_url" if request.param == "sqlite" else "pg_url")


@pytest.fixture
def unique_name() -> str:
    return f"t-{uuid.uuid4().hex[:12]}"
