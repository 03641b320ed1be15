"""What the dashboard gate checks of a request's own input before optuna-dashboard runs it.

optuna-dashboard 0.21 answers some malformed requests with a 500 of its own shape
(``{"reason": "internal server error"}``, a traceback in the log): a note whose body is
not a JSON object (``request.json.get`` on a list or None) or is nested past Python's
recursion limit, a study detail's ``after`` that is not an integer (``?after=x``; a
negative one is a 400 of its own shape), and the Pareto-front plot of a study without 2
or 3 objectives (``optuna.visualization.plot_pareto_front`` raises ValueError). The gate
answers those 400, and a plot kind the dashboard lacks 404, in the service's error shape,
naming the field; and it adds the ``Accept-Encoding`` header whose absence fails
optuna-dashboard's static routes.
"""

from __future__ import annotations

import json
import re

import sqlalchemy as sa
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from service import optuna_sql
from service.api_errors import error_response

# optuna-dashboard 0.21's get_plot kinds; any other answers 404
PLOT_KINDS = ("contour", "edf", "parallel_coordinate", "pareto_front", "rank", "slice",
              "timeline")
PLOT_RULE = "/api/studies/<study_id:int>/plot/<plot_type>"
STUDY_RULE = "/api/studies/<study_id:int>"
AFTER = re.compile(r"[0-9]{1,18}")  # ASCII: Bottle reads the query as Latin-1
NOTE_RULES = frozenset({"/api/studies/<study_id:int>/note",
                        "/api/studies/<study_id:int>/<trial_id:int>/note"})
_DIRECTIONS = sa.table("study_directions", sa.column("study_id"), sa.column("objective"))


async def input_problem(rule: str, args: dict, request: Request,
                        sessions: sessionmaker) -> Response | None:
    """A 400 or 404 answer where the request to the route ``rule`` (with its ``args``) is
    malformed; None where optuna-dashboard may run it."""
    if rule in NOTE_RULES:
        types = request.headers.getlist("content-type")
        if len(types) > 1:  # the gate and the dashboard could read different ones
            return error_response(400, "bad_request", "one Content-Type header, not "
                                  f"{len(types)}")
        return _note_problem(await request.body(), types[0] if types else "")
    if rule == STUDY_RULE:
        for after in request.query_params.getlist("after"):
            if not AFTER.fullmatch(after):
                return error_response(400, "bad_request", "after: the number of trials the "
                                      f"page has already, an integer >= 0; got {after!r}")
    if rule == PLOT_RULE:
        kind = args["plot_type"]
        if kind not in PLOT_KINDS:
            return error_response(404, "not_found", f"no plot {kind!r}; plots: "
                                  f"{', '.join(PLOT_KINDS)}")
        if kind == "pareto_front":
            n = await run_in_threadpool(_objectives, sessions, args["study_id"])
            if n not in (2, 3):
                return error_response(400, "bad_request", f"plot_type: a Pareto front is "
                                      f"drawn for 2 or 3 objectives; this study has {n}")
    return None


def _note_problem(body: bytes, content_type: str) -> Response | None:
    """optuna-dashboard reads a note as ``{"version": int, "body": str}`` JSON."""
    if content_type.split(";")[0].strip().lower() != "application/json":
        return error_response(415, "unsupported_media_type",
                              "a note is sent as application/json")
    try:  # UTF-8 without a BOM, as optuna-dashboard reads it (json.loads(bytes) would
        note = json.loads(body.decode("utf-8"))  # take UTF-16 and a BOM)
    except (ValueError, UnicodeDecodeError):
        return error_response(400, "bad_request", "the body is not JSON in UTF-8")
    except RecursionError:
        return error_response(400, "bad_request", "the body is nested too deeply")
    if not isinstance(note, dict):
        return error_response(400, "bad_request", "the body must be a JSON object "
                              "{\"version\": int, \"body\": str}")
    version, text = note.get("version"), note.get("body")
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        return error_response(400, "bad_request", "version: the note's next version, an "
                              "integer >= 1")
    if not isinstance(text, str):
        return error_response(400, "bad_request", "body: the note's text, a string")
    return None


async def study_exists(sessions: sessionmaker, study_id: int) -> bool:
    """Whether the Optuna study ``study_id`` exists (a token that sees every study is not
    checked against its owned ones, which would answer 404: optuna-dashboard answers an
    unknown id 500, ``Record does not exist``, on its plots)."""
    def query() -> bool:
        with sessions() as session:
            return session.execute(sa.select(optuna_sql.studies.c.study_id).where(
                optuna_sql.studies.c.study_id == study_id)).first() is not None

    return await run_in_threadpool(query)


def _objectives(sessions: sessionmaker, study_id: int) -> int:
    with sessions() as session:
        return session.execute(sa.select(sa.func.count()).select_from(_DIRECTIONS).where(
            _DIRECTIONS.c.study_id == study_id)).scalar_one()


def with_accept_encoding(headers: list[tuple[bytes, bytes]]) -> list[tuple[bytes, bytes]]:
    """``headers`` with ``accept-encoding: identity`` added when the client sent none.

    This answers optuna-dashboard's unguarded header read: its static routes
    (``/static/...``, ``/favicon.ico``) read ``request.headers["Accept-Encoding"]``
    and fail with 500 when the header is absent; "identity" is what no header means.
    """
    if any(name.lower() == b"accept-encoding" for name, _ in headers):
        return headers
    return [*headers, (b"accept-encoding", b"identity")]
