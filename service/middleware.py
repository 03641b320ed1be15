"""ASGI middleware: the request body size limit (413) and token redaction in access logs."""

from __future__ import annotations

import logging
import re

from service.api_errors import error_response

BODY_METHODS = {"POST", "PUT", "PATCH", "DELETE"}


class BodyLimit:
    """Answers 413 to a request whose body is over ``max_bytes``.

    A declared ``Content-Length`` over the limit is refused before reading; a
    chunked body is read up to the limit, then refused, so a client cannot
    make the server buffer more than ``max_bytes`` of one request.

    Args:
        app: the ASGI app behind.
        max_bytes: the largest body accepted, in bytes (>= 1).
    """

    def __init__(self, app, max_bytes: int) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes must be >= 1, got {max_bytes=}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["method"] not in BODY_METHODS:
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            await self._refuse(scope, receive, send)
            return
        chunks, size, more = [], 0, True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            more = message.get("more_body", False)
            if size > self.max_bytes:
                await self._refuse(scope, receive, send)
                return
        body = b"".join(chunks)
        replayed = False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    async def _refuse(self, scope, receive, send) -> None:
        response = error_response(413, "body_too_large",
                                  f"the request body is over {self.max_bytes} bytes",
                                  headers={"Connection": "close"})
        await response(scope, receive, send)


class RedactTokens(logging.Filter):
    """Hides ``token=...`` query values in log records (uvicorn's access log prints URLs)."""

    PATTERN = re.compile(r"(token=)[^&\s\"]+")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.args:
            record.args = tuple(self.PATTERN.sub(r"\1<hidden>", a) if isinstance(a, str) else a
                                for a in record.args)
        return True
