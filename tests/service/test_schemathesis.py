"""schemathesis, the OpenAPI-driven API tester, against a live server (issue 11.15).

It reads ``/openapi.json`` and sends what the document allows and what it does not
(every documented operation, undocumented methods, missing and invalid tokens,
boundary values, sequences that follow the responses' links) and runs every check:
no 5xx, each status, content type, header and body as documented, invalid data
refused, valid data accepted, 405 with ``Allow`` for other methods, auth not
ignored. Settings: ``tests/service/schemathesis.toml`` (25 examples per operation,
fixed seed). The server is ``hpo serve``'s uvicorn on SQLite, without a dispatcher
(studies stay QUEUED), once with an admin token and once with a member's.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import httpx
import pytest

from service.auth import create_token
from tests.service.test_connection_limits import guarded_server

CONFIG = Path(__file__).with_name("schemathesis.toml")
pytestmark = pytest.mark.server


@pytest.mark.parametrize("admin", [True, False], ids=["admin", "member"])
def test_schemathesis_finds_nothing_with_every_check(tmp_path, admin):
    with guarded_server(tmp_path) as server:
        token = create_token(server.config.app.state.components.sessions, "tester",
                             admin=admin)
        url = f"http://127.0.0.1:{server.config.port}/openapi.json"
        n_operations = sum(len(ops) for ops in httpx.get(url).json()["paths"].values())
        argv = [sys.executable, "-c", "from schemathesis.cli import schemathesis; schemathesis()",
                "--config-file", str(CONFIG), "run", url, "--checks", "all", "--workers", "1",
                "--no-color", "-H", f"Authorization: Bearer {token}"]
        run = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-20000:] + run.stderr[-5000:]
    assert f"Tested: {n_operations}\n" in run.stdout  # every operation of the document
