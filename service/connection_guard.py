"""uvicorn's HTTP/1.1 protocol with limits against slow and numerous clients.

uvicorn (h11) has a keep-alive timeout between requests but none for a
request in progress: a client that never finishes its headers, or trickles a
body the app does not read, holds its connection for ever, and needs no
token to do it (slowloris). :class:`GuardedH11Protocol` adds:

* a header timeout: a request's headers (from a new connection, or from the
  first byte after the previous answer) must be complete within
  ``header_timeout_s``, else the connection gets 408 and is closed (closed
  without an answer if nothing was sent at all);
* a body timeout: the body must be complete within ``body_timeout_s`` of the
  headers, else the connection is closed. The app answers the bodies it
  reads with 408 itself (:class:`service.middleware.BodyLimit`); this closes
  the connection ``BODY_GRACE_S`` later, for bodies no one reads;
* a send timeout: an answer the client does not read (the transport's
  write buffer stays full, so it has paused writing) for ``send_timeout_s``
  aborts the connection; a slow client that keeps reading resumes the
  writing and is not cut (issue 11: clients that never read a large answer
  held every slot of the connection limit, with no token);
* a connection limit: with more than ``max_connections`` connections open, a
  request gets 503 in the JSON error shape (and its connection is closed).

uvicorn's own ``limit_concurrency`` answers a plain-text 503 and counts the
connection asking; this limit counts it the same way but answers JSON.
Everything uvicorn-internal that this relies on (``H11Protocol``, its
``conn``, ``cycle``, ``connections`` and ``app``) is used here and nowhere else.
"""

from __future__ import annotations

import asyncio
import json

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

BODY_GRACE_S = 1.0


def _error_body(code: str, message: str) -> bytes:
    """The service's JSON error shape (:class:`service.schemas.ErrorBody`)."""
    return json.dumps({"error": {"code": code, "message": message, "details": []}}).encode()


def _raw_error(status: int, reason: str, code: str, message: str) -> bytes:
    """A complete HTTP/1.1 error answer in the JSON error shape, closing the connection."""
    body = _error_body(code, message)
    head = (f"HTTP/1.1 {status} {reason}\r\ncontent-type: application/json\r\n"
            f"content-length: {len(body)}\r\nconnection: close\r\n\r\n")
    return head.encode("ascii") + body


class GuardedH11Protocol(H11Protocol):
    """``H11Protocol`` with header, body and send timeouts and a connection limit.

    The limits are class attributes; :func:`guarded_protocol` makes a subclass
    with the service's values (uvicorn builds one protocol per connection).
    """

    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    max_connections: int = 1000

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.limit_concurrency = None  # the limit below answers in the JSON shape
        self.app = self._limited(self.app)
        self._header_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._send_timer: asyncio.TimerHandle | None = None

    def _limited(self, app):
        async def limited(scope, receive, send) -> None:
            if scope["type"] == "http" and len(self.connections) > self.max_connections:
                body = _error_body("too_many_connections", f"the server serves "
                                   f"{self.max_connections} connections at once; retry later")
                await send({"type": "http.response.start", "status": 503, "headers": [
                    (b"content-type", b"application/json"), (b"connection", b"close"),
                    (b"content-length", str(len(body)).encode()), (b"retry-after", b"1")]})
                await send({"type": "http.response.body", "body": body})
                return
            await app(scope, receive, send)

        return limited

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_header_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def pause_writing(self) -> None:
        """The transport's write buffer is full: the client must read within ``send_timeout_s``."""
        super().pause_writing()
        if self._send_timer is None:
            self._send_timer = self.loop.call_later(self.send_timeout_s, self._send_timeout)

    def resume_writing(self) -> None:
        """The client read enough of the answer: no send timeout until the buffer fills again."""
        if self._send_timer is not None:
            self._send_timer.cancel()
            self._send_timer = None
        super().resume_writing()

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._follow_state()

    def on_response_complete(self) -> None:
        super().on_response_complete()  # may parse a pipelined request
        self._follow_state()

    def _follow_state(self) -> None:
        """Arm or cancel the timers for where the client is in its request."""
        state = self.conn.their_state
        if state is h11.IDLE:
            if self.conn.trailing_data[0]:  # part of the next request's headers
                self._arm_header_timer()
            return
        if self._header_timer is not None:
            self._header_timer.cancel()
            self._header_timer = None
        if state is h11.SEND_BODY and self._body_timer is None:
            self._body_timer = self.loop.call_later(
                self.body_timeout_s + BODY_GRACE_S, self._body_timeout, self.cycle)
        elif state is not h11.SEND_BODY and self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    def _arm_header_timer(self) -> None:
        if self._header_timer is None and not self.transport.is_closing():
            self._header_timer = self.loop.call_later(self.header_timeout_s,
                                                      self._header_timeout)

    def _cancel_timers(self) -> None:
        for timer in (self._header_timer, self._body_timer, self._send_timer):
            if timer is not None:
                timer.cancel()
        self._header_timer = self._body_timer = self._send_timer = None

    def _header_timeout(self) -> None:
        self._header_timer = None
        if self.transport.is_closing() or self.conn.their_state is not h11.IDLE:
            return
        if self.conn.trailing_data[0]:  # a request was begun: say why it ends
            self.transport.write(_raw_error(
                408, "Request Timeout", "request_timeout",
                f"the request headers did not arrive within {self.header_timeout_s:g} s"))
        self._unset_keepalive_if_required()
        self.transport.close()

    def _send_timeout(self) -> None:
        """Still paused: nothing more can be said to this client, so drop it at once."""
        self._send_timer = None
        self.transport.abort()  # connection_lost follows: the slot is freed, the app's send ends

    def _body_timeout(self, cycle) -> None:
        self._body_timer = None
        if (cycle is self.cycle and not self.transport.is_closing()
                and self.conn.their_state is h11.SEND_BODY):
            self.transport.close()


def guarded_protocol(header_timeout_s: float, body_timeout_s: float, max_connections: int,
                     send_timeout_s: float = 30.0) -> type[GuardedH11Protocol]:
    """A :class:`GuardedH11Protocol` class with these limits, for ``uvicorn.Config(http=...)``.

    Args:
        header_timeout_s: seconds a request's headers may take (> 0).
        body_timeout_s: seconds a request's body may take after its headers (> 0).
        max_connections: connections served at once (>= 1); more get 503.
        send_timeout_s: seconds an answer may wait on a client that reads none of it (> 0):
            how long the transport may stay paused for writing before the connection is
            aborted.

    Raises:
        ValueError: a value out of range.
    """
    if not (header_timeout_s > 0 and body_timeout_s > 0 and send_timeout_s > 0):
        raise ValueError(f"timeouts must be > 0, got {header_timeout_s=}, {body_timeout_s=}, "
                         f"{send_timeout_s=}")
    if max_connections < 1:
        raise ValueError(f"max_connections must be >= 1, got {max_connections=}")
    return type("ServiceH11Protocol", (GuardedH11Protocol,), {
        "header_timeout_s": header_timeout_s, "body_timeout_s": body_timeout_s,
        "send_timeout_s": send_timeout_s, "max_connections": max_connections})
