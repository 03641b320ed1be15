"""The two test tiers (``make test-fast``, ``make test``): markers set from fixtures, and guards.

A test is marked ``ray`` when it uses a fixture that starts or joins Ray (``RAY_FIXTURES``)
and ``server`` when it uses one that serves over a socket (``SERVER_FIXTURES``); tests that
start Ray, a server or a driver process by other means carry the marker themselves
(``pytestmark`` or ``@pytest.mark.ray``). The fast tier is ``-m "not ray and not server"``.

The guards make a missing marker fail loudly instead of slowing the fast tier down:

- a test not marked ``server`` that starts uvicorn fails ("... mark it server");
- a test not marked ``ray`` that calls ``ray.init`` in this process fails;
- in a run with no ``ray`` test at all (the fast tier, or any part of it), Ray's temporary
  directory is a private one (``RAY_TMPDIR``, inherited by child processes), and a test after
  which a Ray session appeared there fails: this catches a Ray started by a subprocess too.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

import pytest

RAY_FIXTURES = frozenset({"ray_session", "ray_head", "server_process"})
SERVER_FIXTURES = frozenset({"server_process", "live_server"})

_ray_tmp: Path | None = None  # the private RAY_TMPDIR of a run without ray tests


def pytest_collection_modifyitems(config, items) -> None:
    for item in items:
        names = set(item.fixturenames)
        if names & RAY_FIXTURES:
            item.add_marker(pytest.mark.ray)
        if names & SERVER_FIXTURES:
            item.add_marker(pytest.mark.server)


def pytest_collection_finish(session) -> None:
    """Give Ray a private temporary directory when no collected test may start it."""
    global _ray_tmp
    if any(item.get_closest_marker("ray") for item in session.items):
        return
    # short: Ray's unix sockets live below it and their paths are limited to 107 bytes
    _ray_tmp = Path(tempfile.mkdtemp(prefix="hpo-noray-"))
    mp = pytest.MonkeyPatch()
    mp.setenv("RAY_TMPDIR", str(_ray_tmp))
    session.config.add_cleanup(mp.undo)
    session.config.add_cleanup(lambda: shutil.rmtree(_ray_tmp, ignore_errors=True))


def _ray_sessions() -> set[str]:
    root = _ray_tmp / "ray" if _ray_tmp else None
    if not (root and root.is_dir()):
        return set()
    return {p.name for p in root.glob("session_*") if p.name != "session_latest"}


def _refuse(what: str, marker: str):
    def refused(*args, **kwargs):
        raise RuntimeError(f"this test {what} but is not marked {marker}: add "
                           f"@pytest.mark.{marker} (or use a fixture that implies it)")
    return refused


@pytest.fixture(autouse=True)
def _tier_guard(request, monkeypatch):
    """Fail a test that starts Ray or a server without carrying the marker that says so."""
    node = request.node
    if node.get_closest_marker("server") is None:
        import uvicorn

        monkeypatch.setattr(uvicorn.Server, "__init__", _refuse("starts a server", "server"))
    needs_ray = node.get_closest_marker("ray") is not None
    if not needs_ray and "ray" in sys.modules:
        monkeypatch.setattr(sys.modules["ray"], "init", _refuse("starts Ray", "ray"))
    before = _ray_sessions()
    yield
    started = _ray_sessions() - before
    if started and not needs_ray:
        pytest.fail(f"this test started Ray ({', '.join(sorted(started))} under {_ray_tmp}) "
                    "but is not marked ray: add @pytest.mark.ray", pytrace=False)
