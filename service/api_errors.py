"""Errors to HTTP, in one place; every error answer has the ``ErrorBody`` shape.

| error | status | code |
| --- | --- | --- |
| ``MalformedBody`` | 400 | ``malformed_body`` |
| ``NotAuthenticated`` | 401 | ``not_authenticated`` |
| ``Forbidden`` | 403 | ``forbidden`` |
| ``StudyNotFound``, ``TrialNotFound``, ``TokenNotFound`` | 404 | ``not_found`` |
| a method the path does not take | 405 | ``method_not_allowed`` (:mod:`service.middleware`) |
| a body slower than ``HPO_BODY_TIMEOUT_S`` | 408 | ``request_timeout`` (same) |
| ``StudyConflict``, ``TokenExists`` | 409 | ``conflict`` |
| body over the size limit | 413 | ``body_too_large`` (same) |
| ``UnsupportedMediaType`` | 415 | ``unsupported_media_type`` |
| ``hpo.errors.SpecError`` | 422 | ``invalid_spec``, one detail per field |
| request validation (query, path) | 422 | ``invalid_request`` |
| storage unreachable | 503 | ``storage_unavailable`` |
| anything else | 500 | ``internal`` (logged, no text leaks) |
"""

from __future__ import annotations

import logging

import optuna.exceptions
import sqlalchemy.exc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from hpo.errors import SpecError, StorageError, printable
from service import errors as e
from service.schemas import ErrorBody, ErrorDetail, ErrorInfo

log = logging.getLogger(__name__)

STATUS = {
    e.MalformedBody: (400, "malformed_body"),
    e.NotAuthenticated: (401, "not_authenticated"),
    e.Forbidden: (403, "forbidden"),
    e.StudyNotFound: (404, "not_found"),
    e.TrialNotFound: (404, "not_found"),
    e.StudyConflict: (409, "conflict"),
    e.TokenNotFound: (404, "not_found"),
    e.TokenExists: (409, "conflict"),
    e.UnsupportedMediaType: (415, "unsupported_media_type"),
}
UNAVAILABLE = (StorageError, sqlalchemy.exc.OperationalError, sqlalchemy.exc.TimeoutError,
               optuna.exceptions.StorageInternalError)
HTTP_CODES = {400: "bad_request", 401: "not_authenticated", 403: "forbidden", 404: "not_found",
              405: "method_not_allowed", 408: "request_timeout", 413: "body_too_large",
              415: "unsupported_media_type"}


DESCRIPTIONS = {400: "the body is not well-formed JSON or YAML", 401: "no token, or an unknown one",
                403: "the token may not do this", 404: "no such study (or trial) for this token",
                408: "the request body did not arrive within HPO_BODY_TIMEOUT_S",
                409: "the study's name is taken, or its state forbids this",
                413: "the request body is over HPO_MAX_BODY_BYTES",
                415: "the body's content type is neither JSON nor YAML",
                422: "invalid input; each detail names its field",
                503: "the database is unavailable; retry after Retry-After seconds"}


def documented(*statuses: int) -> dict[int | str, dict]:
    """OpenAPI ``responses`` of a route for these error statuses, each of the error shape."""
    return {s: {"model": ErrorBody, "description": DESCRIPTIONS[s]} for s in statuses}


def error_response(status: int, code: str, message: str,
                   details: list[dict] | None = None, headers: dict | None = None) -> JSONResponse:
    """A JSON error answer of the one error shape; control characters and lone surrogates
    of the message and of each detail's ``loc`` and ``msg`` are escaped (``\\ud800``), so
    that every answer encodes as UTF-8 whatever the input quoted in it."""
    details = [{"loc": printable(d["loc"]), "msg": printable(d["msg"])} for d in details or []]
    body = ErrorBody(error=ErrorInfo(code=code, message=printable(message),
                                     details=[ErrorDetail(**d) for d in details]))
    return JSONResponse(body.model_dump(mode="json"), status_code=status, headers=headers)


async def _service_error(request: Request, exc: e.ServiceError) -> JSONResponse:
    status, code = STATUS.get(type(exc), (500, "internal"))
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return error_response(status, code, str(exc), headers=headers)


async def _spec_error(request: Request, exc: SpecError) -> JSONResponse:
    return error_response(422, "invalid_spec", f"invalid study spec: {len(exc.errors)} "
                          f"problem(s)", [{"loc": d["loc"], "msg": d["msg"]} for d in exc.errors])


async def _validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
    # A route of service.deps.Call resolves its caller's token with its work, which invalid
    # parameters never reach: the token is judged here first, so that 401 and 403 precede
    # 422 as they do for routes whose token is a dependency of its own.
    caller = getattr(request.state, "caller", None)
    if caller is not None:
        try:
            await run_in_threadpool(caller)
        except e.ServiceError as denied:
            return await _service_error(request, denied)
        except UNAVAILABLE as down:
            return await _unavailable(request, down)
    details = [{"loc": ".".join(str(p) for p in err["loc"]), "msg": err["msg"]}
               for err in exc.errors()]
    return error_response(422, "invalid_request", "invalid request parameters", details)


async def _http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
    code = HTTP_CODES.get(exc.status_code, "http_error")
    return error_response(exc.status_code, code, str(exc.detail), headers=exc.headers)


async def _unavailable(request: Request, exc: Exception) -> JSONResponse:
    log.warning("storage unavailable on %s %s: %s", request.method, printable(request.url.path),
                printable(str(exc)))
    return error_response(503, "storage_unavailable", "the database is unavailable; retry later",
                          headers={"Retry-After": "2"})


async def _internal(request: Request, exc: Exception) -> JSONResponse:
    log.exception("unhandled error on %s %s", request.method, printable(request.url.path))
    return error_response(500, "internal", "internal error")



def install(app: FastAPI) -> None:
    """Register every handler on ``app``."""
    app.add_exception_handler(e.ServiceError, _service_error)
    app.add_exception_handler(SpecError, _spec_error)
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for exc_type in UNAVAILABLE:
        app.add_exception_handler(exc_type, _unavailable)
    app.add_exception_handler(Exception, _internal)
