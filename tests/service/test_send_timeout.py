"""Clients that do not read their answer, against a real uvicorn server over raw sockets
(issue 11): the send timeout frees their connection slot; a slow reader is not cut."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import optuna_dashboard
import pytest

from service.errors import SettingsError
from service.settings import Settings
from tests.service.test_connection_limits import SAFETY_S, guarded_server, read_until_closed

BUNDLE = Path(optuna_dashboard.__file__).parent / "public" / "bundle.js"  # about 6.4 MB
BUNDLE_REQUEST = (b"GET /static/bundle.js HTTP/1.1\r\nHost: x\r\nAccept-Encoding: identity\r\n"
                  b"Connection: close\r\n\r\n")
HEALTH_REQUEST = b"GET /healthz HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"


def small_window_client(server, receive_buffer_bytes: int = 4096) -> socket.socket:
    """A socket with a small receive buffer, so the server's writes back up quickly."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive_buffer_bytes)
    sock.settimeout(SAFETY_S)
    sock.connect(("127.0.0.1", server.config.port))
    return sock


def read_exactly(sock: socket.socket, n_bytes: int) -> bytes:
    data = b""
    while len(data) < n_bytes and (chunk := sock.recv(n_bytes - len(data))):
        data += chunk
    return data


def body_of(answer: bytes) -> bytes:
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), head
    lengths = [line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
               if line.lower().startswith(b"content-length:")]
    assert lengths == [str(BUNDLE.stat().st_size).encode()]
    return body


@pytest.mark.server
def test_clients_that_never_read_their_answer_lose_their_slot_after_the_send_timeout(tmp_path):
    with guarded_server(tmp_path, max_connections=2, send_timeout_s=1.0) as server:
        holders = [small_window_client(server) for _ in range(2)]
        try:
            for holder in holders:  # each is answered (not refused by the limit) ...
                holder.sendall(BUNDLE_REQUEST)
                assert read_exactly(holder, 13) == b"HTTP/1.1 200 "
            # ... then reads no more: the server's write buffer fills, it pauses writing, and
            # after the send timeout drops both (before: held for ever, /healthz 503 for ever)
            statuses = []
            while not statuses or statuses[-1] == 503:
                if len(statuses) * 0.05 > SAFETY_S:
                    pytest.fail(f"/healthz still answers 503 after {SAFETY_S} s")
                time.sleep(0.05)
                with small_window_client(server) as sock:
                    sock.sendall(HEALTH_REQUEST)
                    statuses.append(int(read_until_closed(sock).split(b" ", 2)[1]))
            assert statuses[-1] == 200
            # one slot free is enough for that 200; each holder's own timer (armed when its
            # writes paused, which on a busy machine can be far apart) must drop it as well
            deadline = time.monotonic() + SAFETY_S
            while server.server_state.connections:
                if time.monotonic() > deadline:
                    pytest.fail(f"a holder is still connected after {SAFETY_S} s")
                time.sleep(0.05)
            for holder in holders:  # what they got is cut short
                assert len(read_until_closed(holder)) + 13 < BUNDLE.stat().st_size
        finally:
            for holder in holders:
                holder.close()


@pytest.mark.server
def test_a_slow_client_that_keeps_reading_gets_the_whole_answer(tmp_path):
    with guarded_server(tmp_path, send_timeout_s=1.0) as server, \
            small_window_client(server, 64 * 1024) as sock:
        sock.sendall(BUNDLE_REQUEST)
        answer = b""
        while chunk := sock.recv(64 * 1024):  # at least 2 s in all, a pause of 0.02 s each
            answer += chunk
            time.sleep(0.02)
    assert body_of(answer) == BUNDLE.read_bytes()


def test_the_send_timeout_is_read_from_the_environment_and_checked():
    assert Settings.from_env({"HPO_SEND_TIMEOUT_S": "2.5"}).send_timeout_s == 2.5
    assert Settings().send_timeout_s == 30.0
    for value in ("0", "x", "-1"):
        with pytest.raises(SettingsError, match="HPO_SEND_TIMEOUT_S"):
            Settings.from_env({"HPO_SEND_TIMEOUT_S": value})
