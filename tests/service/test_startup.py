"""Startup (issue 14.5): a port in use fails before Ray starts, naming --port / HPO_PORT;
the server logs where to go once ready; client commands wait for a starting server."""

from __future__ import annotations

import http.server
import json
import logging
import os
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from service import server as server_module
from service.client import ApiError, Client
from service.errors import ServiceError
from service.settings import Settings
from tests.service.conftest import free_port


def test_a_port_in_use_fails_before_ray_starts_naming_the_option(tmp_path, monkeypatch):
    def no_ray(*_args, **_kwargs):
        raise AssertionError("the local Ray head was started although the port is in use")

    monkeypatch.setattr(server_module, "LocalRay", no_ray)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}", port=port,
                            results_dir=tmp_path / "results")
        with pytest.raises(ServiceError) as caught:
            server_module.serve(settings)
    message = str(caught.value)
    assert message == (f"port {port} on 127.0.0.1 is in use (another server?): choose another "
                       f"with --port or HPO_PORT")


def test_an_unknown_host_names_the_option():
    with pytest.raises(ServiceError, match="--host or HPO_HOST"):
        server_module.listen("no-such-host.invalid", 0)


def test_listen_binds_before_serving_and_hands_out_no_inheritable_socket():
    sock = server_module.listen("127.0.0.1", 0)
    try:
        assert sock.getsockname()[1] > 0
        assert not sock.get_inheritable()  # drivers and the Ray head do not hold the port
        with socket.create_connection(sock.getsockname(), timeout=5):
            pass  # accepted into the backlog: a client of a starting server waits, not refused
    finally:
        sock.close()


class _Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        body = json.dumps({"name": "s", "status": "QUEUED"}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_client_waits_for_a_starting_server_and_says_so_once():
    port = free_port()
    said: list[str] = []
    late = http.server.HTTPServer
    servers = []

    def start_late():
        time.sleep(1.5)
        servers.append(late(("127.0.0.1", port), _Answer))
        servers[0].serve_forever()

    thread = threading.Thread(target=start_late, daemon=True)
    thread.start()
    client = Client(f"http://127.0.0.1:{port}", start_wait_s=60, on_wait=said.append)
    try:
        assert client.study("s") == {"name": "s", "status": "QUEUED"}
    finally:
        client.close()
        while not servers:
            time.sleep(0.05)
        servers[0].shutdown()
    assert said == [f"waiting up to 60 s for the service at http://127.0.0.1:{port} to start ..."]


def test_a_client_gives_up_after_its_wait_naming_the_url_option():
    port = free_port()
    client = Client(f"http://127.0.0.1:{port}", start_wait_s=0.5)
    with pytest.raises(ApiError) as caught:
        client.study("s")
    assert caught.value.status == 0 and caught.value.code == "unreachable"
    assert "set --url or HPO_URL" in str(caught.value)


def test_a_host_that_does_not_resolve_fails_at_once_without_waiting():
    said: list[str] = []
    client = Client("http://no-such-host.invalid:8000", start_wait_s=60, on_wait=said.append)
    with pytest.raises(ApiError) as caught:
        client.study("s")
    assert caught.value.code == "unreachable" and "set --url or HPO_URL" in str(caught.value)
    assert said == []  # a refused connection waits for a starting service; this did not


def _connect_error(cause: OSError) -> httpx.ConnectError:
    try:
        raise httpx.ConnectError(str(cause)) from cause
    except httpx.ConnectError as e:
        return e


@pytest.mark.parametrize(("cause", "waits"), [
    (socket.gaierror(socket.EAI_NONAME, "Name or service not known"), False),
    (socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution"), True),
    (ConnectionRefusedError(111, "Connection refused"), True),
    # localhost's addresses tried in turn, the last (::1, IPv6 off) raising
    (OSError(99, "Cannot assign requested address"), True),
    (OSError(113, "No route to host"), True),
], ids=["no-such-name", "resolver-for-now", "refused", "last-address-unusable", "no-route"])
def test_only_a_name_that_does_not_resolve_is_not_waited_for(cause, waits, monkeypatch):
    said: list[str] = []
    client = Client("http://bob:s3cret@localhost:1", start_wait_s=0.2, on_wait=said.append)

    def fail(*_args, **_kwargs):
        raise _connect_error(cause)

    monkeypatch.setattr(client.http, "request", fail)
    with pytest.raises(ApiError) as caught:
        client.study("s")
    assert (said != []) == waits and ("waited" in str(caught.value)) == waits
    assert "s3cret" not in str(caught.value) + " ".join(said)
    assert "http://bob:***@localhost:1" in str(caught.value)


@pytest.mark.parametrize("url", ["localhost:8000", "127.0.0.1:8000", "ftp://127.0.0.1:8000",
                                 "http://", "http://127.0.0.1:port", "//127.0.0.1:8000",
                                 "http://127.0.0.1:8000\r", " http://127.0.0.1:8000",
                                 "http://127.0.0.1:8000\t"])
@pytest.mark.parametrize("by_env", [False, True])
def test_a_url_that_is_no_http_address_is_refused_naming_the_option(url, by_env, monkeypatch):
    _refused_url(url, by_env, monkeypatch)


def test_a_url_with_a_null_byte_is_refused():  # a flag only: no environment holds one
    from typer.testing import CliRunner

    from hpo.cli import app

    result = CliRunner().invoke(app, ["status", "s", "--url", "http://127.0.0.1:8000\x00"])
    assert result.exit_code == 2 and "Invalid value for '--url'" in result.output


def _refused_url(url: str, by_env: bool, monkeypatch) -> None:
    from typer.testing import CliRunner

    from hpo.cli import app

    monkeypatch.delenv("HPO_URL", raising=False)
    monkeypatch.setenv("COLUMNS", "400")  # rich's box: the message on one line
    if by_env:
        monkeypatch.setenv("HPO_URL", url)
    argv = ["status", "s"] + ([] if by_env else ["--url", url])
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    text = " ".join(result.output.replace("│", " ").split())
    assert "Invalid value for '--url'" in text and "HPO_URL" in text and repr(url) in text


@pytest.mark.parametrize("url", ["ftp://bob:s3cret@h:1", "http://bob:s3cret@h:port",
                                 "bob:s3cret@h:1", "http://bob:s3cret@h:1\r"])
def test_a_refused_url_s_password_is_not_shown(url, monkeypatch):
    from typer.testing import CliRunner

    from hpo.cli import app

    monkeypatch.setenv("HPO_URL", url)
    result = CliRunner().invoke(app, ["status", "s"])
    assert result.exit_code == 2
    assert "s3cret" not in result.output and "bob:***@" in result.output


@pytest.mark.server
def test_the_server_logs_its_addresses_once_ready(caplog):
    async def app(scope, receive, send):  # a bare ASGI app: only the startup matters here
        if scope["type"] == "lifespan":
            while (await receive())["type"] != "lifespan.shutdown":
                await send({"type": "lifespan.startup.complete"})
            await send({"type": "lifespan.shutdown.complete"})

    sock = server_module.listen("127.0.0.1", 0)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    server = server_module._Server(uvicorn.Config(app, log_level="warning"), url)
    caplog.set_level(logging.INFO, logger="service.server")
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    server.should_exit = True
    thread.join(30)
    sock.close()
    assert f"ready: API {url}/v1, docs {url}/docs, dashboard {url}/dashboard" in caplog.messages


def test_hpo_serve_on_a_taken_port_fails_before_importing_torch_ray_or_the_app(tmp_path):
    """The port is checked first: nothing slow (torch, Ray, the app and its dashboard) is
    imported, let alone started, before `hpo serve` says the port is taken."""
    import subprocess
    import sys

    code = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "import hpo.cli\n"
        "r = CliRunner().invoke(hpo.cli.app, ['serve', '--port', sys.argv[1]])\n"
        "print(r.exit_code, [m for m in ('torch', 'ray', 'service.app') if m in sys.modules])\n"
        "print(' '.join(r.output.split()))\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run([sys.executable, "-c", code, str(port)], capture_output=True,
                              text=True, timeout=120,
                              env={**os.environ, "HPO_DATABASE_URL": f"sqlite:///{tmp_path}/h.db"})
    first, second = proc.stdout.splitlines()[:2]
    assert first == "1 []", proc.stdout + proc.stderr
    assert second == (f"error: port {port} on 127.0.0.1 is in use (another server?): choose "
                      f"another with --port or HPO_PORT")
    assert not (tmp_path / "h.db").exists()  # not even the database was opened


def test_pools_larger_than_postgresqls_connections_are_warned_of_at_start(pg_url, caplog):
    """Many API processes with many threads each could hold more connections than the
    PostgreSQL server takes: the start says so, naming the settings and the server's limit;
    the defaults fit the default server (max_connections 100); SQLite never warns."""
    import sqlalchemy as sa

    engine = sa.create_engine(pg_url)
    try:
        with engine.connect() as conn:
            most = int(conn.execute(sa.text("SHOW max_connections")).scalar())
            reserved = int(conn.execute(sa.text("SHOW superuser_reserved_connections"))
                           .scalar())
        fits = Settings.from_env({})
        assert server_module.pooled_connections(fits) == 1 * (2 * 20 + 2) + 2 * 4
        with caplog.at_level(logging.WARNING, logger="service.server"):
            assert not server_module.warn_if_over_connections(engine, fits)
            assert not caplog.records
            over = Settings.from_env({"HPO_API_PROCESSES": str(most // 42 + 1)})
            assert server_module.pooled_connections(over) > most - reserved
            assert server_module.warn_if_over_connections(engine, over)
        message = caplog.records[-1].getMessage()
        assert "HPO_API_PROCESSES" in message and "HPO_API_THREADS=20" in message
        assert f"PostgreSQL takes {most - reserved} (max_connections {most}" in message
    finally:
        engine.dispose()
    sqlite = sa.create_engine("sqlite://")
    assert not server_module.warn_if_over_connections(
        sqlite, Settings.from_env({"HPO_API_PROCESSES": "64"}))
