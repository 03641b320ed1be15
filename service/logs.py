"""The service's logs: plain text or JSON lines (``HPO_LOG_FORMAT``), with context, no tokens.

Every record passes one handler on the root logger (uvicorn's loggers propagate to it:
``uvicorn.Config(log_config=None)``), which

* adds the context of the record: ``request_id`` (the API request being served, set by
  :class:`RequestId`), ``study`` and ``trial`` (a driver process binds its study, code may
  pass ``extra={"study": ..., "trial": ...}``);
* hides tokens: ``hpo_...`` tokens, ``Bearer ...`` credentials and ``token=...`` query
  values become ``<hidden>`` in the message and its arguments, whatever logger wrote them.

JSON lines carry ``time`` (UTC, ISO 8601), ``level``, ``logger``, ``message`` and, when
known, ``request_id``, ``study``, ``trial`` and ``exc`` (the exception's traceback: logs
are the operator's, answers never carry one).
"""

from __future__ import annotations

import contextvars
import datetime as dt
import json
import logging
import re
import sys
import uuid
from urllib.parse import quote, unquote

from hpo.errors import SECRET, hide_secrets

LOG_FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
CONTEXT = ("request_id", "study", "trial")

request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar("request_id",
                                                                        default=None)
_bound: dict[str, object] = {}  # process-wide context (a driver process's study)

CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u2028\u2029]")  # what may break or paint a line
REQUEST_ID = re.compile(r"[A-Za-z0-9._\-]{1,64}")


def redact(text: str) -> str:
    """``text`` with tokens, bearer credentials and ``token=`` values replaced by ``<hidden>``.

    A line with percent-escapes (a request line as the client wrote it: ``?k=%68po_...``)
    is matched decoded too, as the server reads it; where only the decoded line shows a
    secret, it is logged decoded, with its control characters escaped again (``%0A``,
    ``%1B``): one request, one log line, no terminal escapes.
    """
    out = hide_secrets(text)
    decoded = out
    for _ in range(3):  # escapes of escapes, a few levels
        if "%" not in decoded or (again := unquote(decoded)) == decoded:
            break
        decoded = again
        if (hidden := hide_secrets(decoded)) != decoded:
            return CONTROL.sub(lambda m: quote(m.group(), safe=""), hidden)
    return out


def bind(**context: object) -> None:
    """Add ``study`` / ``trial`` to every later record of this process (a driver's study)."""
    _bound.update({k: v for k, v in context.items() if k in CONTEXT})


class ContextAndRedaction(logging.Filter):
    """Sets the record's context attributes and hides secrets (see module doc)."""

    def filter(self, record: logging.LogRecord) -> bool:
        rid = request_id.get()
        if rid is not None and getattr(record, "request_id", None) is None:
            record.request_id = rid
        for key, value in _bound.items():
            if getattr(record, key, None) is None:
                setattr(record, key, value)
        for key in CONTEXT:  # a record's own context too (extra={"trial": ...})
            value = getattr(record, key, None)
            if isinstance(value, str):
                setattr(record, key, redact(value))
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit: logging reports it
            return True
        record.msg, record.args = redact(message), None  # the whole line, once formatted
        return True


class JsonFormatter(logging.Formatter):
    """One JSON object per line (see module doc)."""

    def format(self, record: logging.LogRecord) -> str:
        out = {"time": dt.datetime.fromtimestamp(record.created, dt.UTC).isoformat(
                   timespec="milliseconds"),
               "level": record.levelname, "logger": record.name,
               "message": record.getMessage()}
        for key in CONTEXT:
            value = getattr(record, key, None)
            if value is not None:
                out[key] = value
        if record.exc_info:
            out["exc"] = redact(self.formatException(record.exc_info))
        return json.dumps(out, default=str)


class TextFormatter(logging.Formatter):
    """The text format, with the context in brackets when there is one; tracebacks redacted."""

    def formatException(self, ei) -> str:  # noqa: N802 - logging's name
        return redact(super().formatException(ei))

    def formatStack(self, stack_info: str) -> str:  # noqa: N802 - logging's name
        return redact(super().formatStack(stack_info))

    def format(self, record: logging.LogRecord) -> str:
        line = super().format(record)
        context = " ".join(f"{k}={getattr(record, k)}" for k in CONTEXT
                           if getattr(record, k, None) is not None)
        return f"{line} [{context}]" if context else line


def configure(log_format: str = "text", level: int = logging.INFO, stream=None) -> None:
    """Send every record (root logger, ``level``) to ``stream`` (default stderr) in
    ``log_format``, replacing the root logger's handlers.

    Raises:
        ValueError: ``log_format`` is not one of ``LOG_FORMATS``.
    """
    if log_format not in LOG_FORMATS:
        raise ValueError(f"HPO_LOG_FORMAT must be one of {', '.join(LOG_FORMATS)}, "
                         f"got {log_format!r}")
    if not getattr(logging.getLogRecordFactory(), "redacts", False):
        logging.setLogRecordFactory(_redacting(logging.getLogRecordFactory()))
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.addFilter(ContextAndRedaction())
    handler.setFormatter(JsonFormatter() if log_format == "json" else TextFormatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in ("uvicorn", "uvicorn.error", "uvicorn.access"):  # theirs go to the root's
        logging.getLogger(name).handlers.clear()
        logging.getLogger(name).propagate = True


def _redacting(factory):
    """``factory`` (logging's record factory), its records' message and traceback redacted
    as they are made: records of loggers with handlers of their own go past the root's
    filter. Ray's do (its ``ray`` logger does not propagate): a study driver's log held
    the service token and bearer credential of a trial's error in Ray Tune's own 'Trial
    task failed' traceback (helper-32's finding)."""
    plain = logging.Formatter()

    def make(*args, **kwargs) -> logging.LogRecord:
        record = factory(*args, **kwargs)
        try:
            message = record.getMessage()
        except (TypeError, ValueError):  # arguments that do not fit: logging reports it
            return record
        record.msg, record.args = redact(message), None
        if record.exc_info and not record.exc_text:  # what a formatter prints: its cache
            record.exc_text = redact(plain.formatException(record.exc_info))
        return record

    make.redacts = True
    return make


class RequestId:
    """ASGI middleware: each HTTP request gets an id, from a well-formed ``X-Request-ID``
    header (1-64 of ``A-Z a-z 0-9 . _ -``, and not a token: a client that sent its token
    there would have it logged and echoed) or a new one; it is in every log record
    written while the request is served and in the answer's ``X-Request-ID`` header."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        given = dict(scope["headers"]).get(b"x-request-id", b"").decode("latin-1")
        rid = given if REQUEST_ID.fullmatch(given) and not SECRET.search(given) \
            else uuid.uuid4().hex
        token = request_id.set(rid)

        async def send_with_id(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []),
                                                  (b"x-request-id", rid.encode())]}
            await send(message)

        try:
            await self.app(scope, receive, send_with_id)
        finally:
            request_id.reset(token)
