"""ASGI middleware: unsupported methods (405), the request body's size limit (413) and time
limit (408), and the security headers of every answer. Token redaction in logs is
:mod:`service.logs`."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from starlette.routing import BaseRoute, Match, Route

from service.api_errors import error_response

BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class MethodGuard:
    """Answers 405 (JSON error shape, ``Allow`` header) to a method that a route's path does
    not take, HEAD included: the API's routes take exactly the methods they declare (FastAPI's
    convention, and what issue 11.13 asks of ``HEAD /v1/studies``); only the dashboard, behind
    this guard, answers HEAD like GET (it does so itself).

    The dashboard is mounted at ``/`` and would otherwise answer any method on any path
    (404, 403 or HTML) before the router's own 405 could. Paths that no route in
    ``routes`` matches go on unchanged.

    Args:
        app: the ASGI app behind.
        routes: the routes to guard (the API's, not the dashboard's mount).
    """

    def __init__(self, app, routes: Sequence[BaseRoute]) -> None:
        self.app = app
        self.routes = [r for r in routes if isinstance(r, Route) and r.methods]

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        allowed: set[str] = set()
        for route in self.routes:
            match, _ = route.matches(scope)
            if match is Match.FULL:
                await self.app(scope, receive, send)
                return
            if match is Match.PARTIAL:
                allowed |= route.methods
        if not allowed:
            await self.app(scope, receive, send)
        else:
            allow = ", ".join(sorted(allowed))
            response = error_response(405, "method_not_allowed",
                                      f"{scope['method']} is not allowed here; allowed: {allow}",
                                      headers={"Allow": allow})
            await response(scope, receive, send)


class BodyLimit:
    """Answers 413 to a request whose body is over ``max_bytes``, and 408 (then closes the
    connection) to one whose body has not fully arrived ``timeout_s`` after its headers.

    A declared ``Content-Length`` over the limit is refused before reading; a
    chunked body is read up to the limit, then refused, so a client cannot
    make the server buffer more than ``max_bytes`` of one request, nor hold
    it longer than ``timeout_s`` by trickling the body. Bodies of methods
    other than POST, PUT, PATCH and DELETE are not read by the API; the
    connection guard (:mod:`service.connection_guard`) bounds those.

    Args:
        app: the ASGI app behind.
        max_bytes: the largest body accepted, in bytes (>= 1).
        timeout_s: seconds a body may take to arrive (> 0).

    Raises:
        ValueError: ``max_bytes`` < 1 or ``timeout_s`` <= 0.
    """

    def __init__(self, app, max_bytes: int, timeout_s: float = 30.0) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes=}")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s must be > 0, got {timeout_s=}")
        self.app = app
        self.max_bytes = max_bytes
        self.timeout_s = timeout_s

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        try:
            async with asyncio.timeout(self.timeout_s):
                body = await self._read(receive)
        except TimeoutError:
            response = error_response(408, "request_timeout", f"the request body did not "
                                      f"arrive within {self.timeout_s:g} s",
                                      headers={"Connection": "close"})
            await response(scope, receive, send)
            return
        if body is None:  # the client went away
            return
        if len(body) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        await self.app(scope, replaying(body, receive), send)

    async def _read(self, receive) -> bytes | None:
        """The body, cut after ``max_bytes + 1`` bytes; ``None`` if the client went away."""
        chunks, size, more = [], 0, True
        while more and size <= self.max_bytes:
            message = await receive()
            if message["type"] == "http.disconnect":
                return None
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
        return b"".join(chunks)

    async def _refuse(self, scope, receive, send) -> None:
        response = error_response(413, "body_too_large",
                                  f"the request body is over {self.max_bytes} bytes",
                                  headers={"Connection": "close"})
        await response(scope, receive, send)


def replaying(body: bytes, receive):
    """An ASGI ``receive`` that gives ``body`` (already read from ``receive``, whole) first,
    then waits on ``receive`` (a disconnect)."""
    sent = False

    async def replay():
        nonlocal sent
        if sent:
            return await receive()
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    return replay


class SecurityHeaders:
    """Adds to every answer what a browser needs to keep another site's page from using it:
    ``X-Content-Type-Options: nosniff`` (a served file, a model or a CSV, is never run as
    what it looks like), ``X-Frame-Options: SAMEORIGIN`` and, in a
    ``Content-Security-Policy`` that names no ``frame-ancestors`` (optuna-dashboard's),
    ``frame-ancestors 'self'`` (another origin, another port of the same host included,
    cannot frame the logged-in dashboard); and drops ``Access-Control-Allow-Origin``, which
    optuna-dashboard sends as ``*`` on its artifacts: the service answers no cross-origin
    reads."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": secure_headers(message.get("headers", []))}
            await send(message)

        await self.app(scope, receive, with_headers)


def secure_headers(headers: Sequence[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` (an ASGI answer's) as :class:`SecurityHeaders` sends them."""
    out, names = [], set()
    for name, value in headers:
        low = name.lower()
        if low == b"access-control-allow-origin":
            continue
        if low == b"content-security-policy" and b"frame-ancestors" not in value:
            value = value.rstrip(b"; ") + b"; frame-ancestors 'self'"
        out.append((name, value))
        names.add(low)
    if b"x-content-type-options" not in names:
        out.append((b"x-content-type-options", b"nosniff"))
    if b"x-frame-options" not in names:
        out.append((b"x-frame-options", b"SAMEORIGIN"))
    return out
