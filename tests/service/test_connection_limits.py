"""Slow and numerous clients against a real uvicorn server over raw sockets (issue 11.4):
header and body timeouts, and the connection limit."""

from __future__ import annotations

import contextlib
import json
import socket
import threading
import time

import pytest
import uvicorn

from service.app import create_app
from service.errors import SettingsError
from service.server import uvicorn_config
from service.settings import Settings
from tests.service.conftest import free_port

SAFETY_S = 60  # a socket that hears nothing this long fails the test (the old server: never)


@contextlib.contextmanager
def guarded_server(tmp_path, **limits):
    """``hpo serve``'s uvicorn config (no Ray, no dispatcher) in a thread; yields the server."""
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}", port=free_port(),
                        results_dir=tmp_path / "results", run_dispatcher=False, **limits)
    server = uvicorn.Server(uvicorn_config(create_app(settings), settings, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not server.started:
        assert time.monotonic() < deadline and thread.is_alive(), "uvicorn did not start"
        time.sleep(0.05)
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join(30)


def connect(server) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", server.config.port))
    sock.settimeout(SAFETY_S)
    return sock


def read_until_closed(sock: socket.socket, trickle: bytes | None = None) -> bytes:
    """Everything the server sends until it closes; with ``trickle``, one byte of it is sent
    every 0.1 s meanwhile (a slow client)."""
    data = b""
    if trickle is not None:
        sock.settimeout(0.1)
    deadline = time.monotonic() + SAFETY_S
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            if trickle:
                with contextlib.suppress(OSError):
                    sock.sendall(trickle[:1])
                trickle = trickle[1:] or b"x"
            continue
        except ConnectionResetError:
            return data
        if not chunk:
            return data
        data += chunk
    pytest.fail(f"the server kept the connection open; it sent {data!r}")


def status_and_body(answer: bytes) -> tuple[int, dict | None]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body) if body else None


@pytest.mark.server
def test_a_connection_that_never_finishes_its_headers_gets_408_and_is_closed(tmp_path):
    with guarded_server(tmp_path, header_timeout_s=0.5) as server, connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        status, body = status_and_body(read_until_closed(sock))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"


@pytest.mark.server
def test_headers_trickled_byte_by_byte_are_bounded_by_the_header_timeout(tmp_path):
    with guarded_server(tmp_path, header_timeout_s=0.5) as server, connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n")
        status, _ = status_and_body(read_until_closed(sock, trickle=b"X-Slow: " + b"y" * 10**4))
    assert status == 408


@pytest.mark.server
def test_a_connection_that_sends_nothing_is_closed_after_the_header_timeout(tmp_path):
    with guarded_server(tmp_path, header_timeout_s=0.5) as server, connect(server) as sock:
        assert read_until_closed(sock) == b""


@pytest.mark.server
def test_a_keep_alive_connection_times_out_its_next_request_headers_too(tmp_path):
    with guarded_server(tmp_path, header_timeout_s=0.5, keep_alive_s=30) as server, \
            connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
        first = sock.recv(65536)
        assert first.startswith(b"HTTP/1.1 200 ")
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHo")
        status, _ = status_and_body(read_until_closed(sock))
    assert status == 408


@pytest.mark.server
def test_a_trickled_body_gets_408_after_the_body_timeout(tmp_path):
    with guarded_server(tmp_path, body_timeout_s=0.5) as server, connect(server) as sock:
        sock.sendall(b"POST /v1/studies HTTP/1.1\r\nHost: x\r\nContent-Type: application/json"
                     b"\r\nContent-Length: 100000\r\n\r\n{")
        status, body = status_and_body(read_until_closed(sock, trickle=b" " * 10**5))
    assert status == 408
    assert body["error"]["code"] == "request_timeout"


@pytest.mark.server
def test_a_trickled_body_nobody_reads_is_closed_after_the_body_timeout(tmp_path):
    with guarded_server(tmp_path, body_timeout_s=0.5, keep_alive_s=30) as server, \
            connect(server) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: 100000\r\n\r\nx")
        answer = read_until_closed(sock, trickle=b"x" * 10**5)
    assert answer.startswith(b"HTTP/1.1 200 ")  # answered, then closed


@pytest.mark.server
def test_beyond_the_connection_limit_a_request_gets_503_in_the_error_shape(tmp_path):
    with guarded_server(tmp_path, max_connections=2, header_timeout_s=60) as server:
        holders = [connect(server), connect(server)]
        deadline = time.monotonic() + SAFETY_S
        while len(server.server_state.connections) < 2:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with connect(server) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
            status, body = status_and_body(read_until_closed(sock))
        assert (status, body["error"]["code"]) == (503, "too_many_connections")
        for holder in holders:
            holder.close()
        while server.server_state.connections:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        with connect(server) as sock:
            sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            assert read_until_closed(sock).startswith(b"HTTP/1.1 200 ")


def test_the_limits_are_read_from_the_environment_and_checked():
    settings = Settings.from_env({"HPO_HEADER_TIMEOUT_S": "2.5", "HPO_BODY_TIMEOUT_S": "7",
                                  "HPO_KEEP_ALIVE_S": "3", "HPO_MAX_CONNECTIONS": "64"})
    assert (settings.header_timeout_s, settings.body_timeout_s, settings.keep_alive_s,
            settings.max_connections) == (2.5, 7.0, 3.0, 64)
    assert (Settings().header_timeout_s, Settings().body_timeout_s,
            Settings().max_connections) == (10.0, 30.0, 1000)
    for name, value in [("HPO_HEADER_TIMEOUT_S", "0"), ("HPO_BODY_TIMEOUT_S", "x"),
                        ("HPO_MAX_CONNECTIONS", "0"), ("HPO_KEEP_ALIVE_S", "-1")]:
        with pytest.raises(SettingsError, match=name):
            Settings.from_env({name: value})
