"""``/readyz``'s checks (service.health.Readiness): a Ray address that is set is always
checked, and no answer names a server's address (the route answers without a token)."""

from __future__ import annotations

import socket

import pytest

from service.db import build_engine
from service.health import Readiness


@pytest.fixture
def engine(tmp_path):
    engine = build_engine(f"sqlite:///{tmp_path / 'hpo.db'}")
    yield engine
    engine.dispose()


def test_a_ray_address_that_does_not_parse_is_an_error_not_a_missing_check(engine):
    """Settings refuse such an address; a Readiness given one anyway must not say ready."""
    for address in ("not a ray address", "head"):
        assert Readiness(engine, address).checks() == {
            "database": "ok", "ray": "error: RAY_ADDRESS is not a Ray address"}


def test_a_cluster_that_does_not_answer_is_an_error_without_its_address(engine):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        checks = Readiness(engine, f"127.0.0.1:{port}").checks()
    assert checks == {"database": "ok", "ray": "error: no answer"}


def test_auto_and_no_address(engine):
    assert Readiness(engine, "auto").checks() == {"database": "ok"}
    assert Readiness(engine, None).checks() == {"database": "ok", "ray": "not configured"}


def test_a_database_that_fails_is_named_by_its_error_kind_only(tmp_path):
    engine = build_engine("postgresql+psycopg://u:s3cret@127.0.0.1:1/db?connect_timeout=2")
    try:
        checks = Readiness(engine, None).checks()
    finally:
        engine.dispose()
    assert checks == {"database": "error: OperationalError", "ray": "not configured"}
