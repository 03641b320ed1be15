"""Fixtures of the service tests: isolated databases, tokens, an app, real servers, one Ray.

Every test gets its own database: a SQLite file under ``tmp_path``, or on
PostgreSQL (``HPO_TEST_DATABASE_URL``) its own schema, dropped afterwards.
Servers run for real: ``live_server`` is uvicorn in a thread of the test
process (no dispatcher); ``server_process`` is ``python -m service.server`` as
a subprocess joining one Ray head shared by the whole session.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
import warnings
from pathlib import Path

import httpx
import pytest
import sqlalchemy as sa
import uvicorn

from service.app import create_app
from service.auth import create_token
from service.settings import Settings

with warnings.catch_warnings():  # starlette's TestClient asks for httpx2, which is not needed
    warnings.filterwarnings("ignore", message="Using `httpx` with `starlette.testclient`")
    from fastapi.testclient import TestClient

REPO = Path(__file__).resolve().parents[2]


def tiny_spec(name: str, n_trials: int = 3, **changes) -> dict:
    """A digits study that trains each trial for about a second."""
    spec = {
        "name": name, "task": "digits",
        "config": {"max_epochs": 1, "micro_batch_size": 64, "width": 16},
        "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
        "objective": {"metric": "val_accuracy"},
        "sampler": {"name": "random", "seed": 0},
        "budget": {"n_trials": n_trials, "max_concurrent_trials": 2},
    }
    spec.update(changes)
    return spec


def bearer(token: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {token}"}


def record_summary(app, name: str, summary=None) -> None:
    """Replace study ``name``'s summary as its driver's tracker would after its trials
    changed (``summary``, default computed from the Optuna study): for tests that write
    trials into Optuna behind the service's back, standing in for the study's driver."""
    from service.db import StudyRow, SummaryRow
    from service.summaries import compute_summary, store_summary

    c = app.state.components
    with c.sessions.begin() as session:
        row = session.execute(sa.select(StudyRow).where(StudyRow.name == name)).scalar_one()
        session.execute(sa.delete(SummaryRow).where(SummaryRow.study_id == row.id))
        store_summary(session, row.id, summary or compute_summary(c.studies.storage, row))


def forget_summary(app, name: str | None = None) -> None:
    """Remove the summary of study ``name`` (default: of every study), as for a study made
    before the service kept summaries."""
    from service.db import StudyRow, SummaryRow

    gone = sa.delete(SummaryRow)
    if name is not None:
        gone = gone.where(SummaryRow.study_id.in_(
            sa.select(StudyRow.id).where(StudyRow.name == name)))
    with app.state.components.sessions.begin() as session:
        session.execute(gone)


# -- databases --------------------------------------------------------------------------


@pytest.fixture
def pg_url(pg_server) -> str:
    """A PostgreSQL URL whose connections live in a fresh schema (dropped after the test)."""
    schema = f"svc_{uuid.uuid4().hex[:12]}"
    admin = sa.create_engine(pg_server)
    with admin.begin() as conn:
        conn.execute(sa.text(f"CREATE SCHEMA {schema}"))
    sep = "&" if "?" in pg_server else "?"
    yield f"{pg_server}{sep}options=-csearch_path%3D{schema}"
    with admin.begin() as conn:
        conn.execute(sa.text(f"DROP SCHEMA {schema} CASCADE"))
    admin.dispose()


# -- an app and its tokens ---------------------------------------------------------------


@pytest.fixture
def settings(sqlite_url, tmp_path) -> Settings:
    return Settings(database_url=sqlite_url, results_dir=tmp_path / "results",
                    run_dispatcher=False)


@pytest.fixture
def app(settings):
    return create_app(settings)


@pytest.fixture
def client(app):
    with TestClient(app) as c:
        yield c


@pytest.fixture
def tokens(app) -> dict[str, str]:
    """Tokens ``admin`` (admin), ``alice`` and ``bob``."""
    sessions = app.state.components.sessions
    return {"admin": create_token(sessions, "admin", admin=True),
            "alice": create_token(sessions, "alice"), "bob": create_token(sessions, "bob")}


# -- real servers ------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def serve_in_thread(app, port: int | None = None):
    """uvicorn serving ``app`` on ``port`` (default: a free one) in a thread; yields the base
    URL."""
    port = port or free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture
def live_server(app):
    with serve_in_thread(app) as url:
        yield url


@pytest.fixture(scope="session")
def ray_head():
    """One Ray head (2 CPUs) for every server and driver of the session, in a child process."""
    from service.server import LocalRay

    head = LocalRay(num_cpus=2)
    yield head
    head.stop()


class ServerProcess:
    """``python -m service.server`` in a subprocess, restartable, with its log."""

    def __init__(self, env: dict[str, str], log_path: Path) -> None:
        self.env = env
        self.port = int(env["HPO_PORT"])
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 90) -> None:
        log = open(self.log_path, "ab")  # noqa: SIM115 - the child keeps it
        self.proc = subprocess.Popen([sys.executable, "-m", "service.server"], cwd=REPO,
                                     env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                     start_new_session=True)  # its group: a terminal's
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"server exited: {self.log()[-3000:]}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(f"{self.url}/readyz", timeout=2).status_code == 200:
                    return
            time.sleep(0.3)
        raise RuntimeError(f"server not ready: {self.log()[-3000:]}")

    def stop(self, ctrl_c: bool = False) -> int:
        """SIGTERM the server, or with ``ctrl_c`` SIGINT its whole process group (what a
        terminal's Ctrl-C does); its exit status."""
        if self.proc is None or self.proc.poll() is not None:
            return self.proc.returncode if self.proc else 0
        if ctrl_c:
            os.killpg(self.proc.pid, signal.SIGINT)
        else:
            self.proc.terminate()
        try:
            return self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            return self.proc.wait()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@pytest.fixture
def server_process(ray_head, tmp_path):
    """A factory of real servers on the shared Ray: ``server_process(database_url, **env)``."""
    started: list[ServerProcess] = []

    def make(database_url: str, **env: str) -> ServerProcess:
        full_env = {**os.environ, "HPO_DATABASE_URL": database_url,
                    "HPO_RESULTS_DIR": str(tmp_path / "results"), "HPO_PORT": str(free_port()),
                    "RAY_ADDRESS": ray_head.address, "HPO_HEARTBEAT_S": "0.5",
                    "HPO_HEARTBEAT_TIMEOUT_S": "5", **env}
        if ray_head.auth_mode:
            full_env["RAY_AUTH_MODE"] = ray_head.auth_mode
        server = ServerProcess(full_env, tmp_path / f"server-{len(started)}.log")
        started.append(server)
        return server

    yield make
    for server in started:
        server.stop()


def wait_for(predicate, timeout_s: float = 240, interval_s: float = 0.5, what: str = ""):
    """Poll ``predicate()`` until it returns a truthy value; that value. Fails after timeout_s."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(interval_s)
    pytest.fail(f"timed out waiting for {what or predicate}")
