"""What the dashboard gate changes of optuna-dashboard's answers (:mod:`service.dashboard`).

* A non-admin token's study list holds only its own studies (:func:`owned_studies`).
* A study with constraints shows each trial's constraint values and its best feasible
  trial, or feasible Pareto front, as REST and the CLI (:func:`feasible_study`).
* The answers that carry trials' user attributes (:data:`HIDING`) leave out the hidden
  ones (the ``checkpoint`` server path) and show the others as ``/v1`` does.
* A 5xx of optuna-dashboard is sent in the service's error shape (:class:`ServerErrors`).
"""

from __future__ import annotations

import csv
import io
import json
import logging
import math
from collections.abc import Awaitable, Callable
from typing import NamedTuple

from optuna.trial import FrozenTrial
from starlette.concurrency import run_in_threadpool

from hpo.summary import best_of
from service.api_errors import HTTP_CODES, error_response
from service.dashboard_cache import serialize_trial
from service.schemas import HIDDEN_TRIAL_ATTRS, public_attrs

log = logging.getLogger(__name__)

Rewrite = Callable[[bytes], bytes]  # a 200 answer's body -> the body sent


def owned_studies(owned: set[int], body: bytes) -> bytes:
    """The ``/api/studies`` answer with only the studies in ``owned``."""
    data = json.loads(body)
    data["study_summaries"] = [s for s in data.get("study_summaries", [])
                               if s.get("study_id") in owned]
    return _dumps(data)


_INFINITE = "\x00infinite\x00"  # stands for inf until the JSON is written


def _dumps(data) -> bytes:
    """``data`` as JSON, an infinite float written ``1e999`` (``-1e999``): JSON allows the
    number, and a browser reads it as ``Infinity``; Python writes ``Infinity``, which a
    browser's ``JSON.parse`` refuses (a NaN, which neither can carry, is written null)."""
    def walk(node):
        if isinstance(node, float) and not math.isfinite(node):
            return None if math.isnan(node) else _INFINITE if node > 0 else "-" + _INFINITE
        if isinstance(node, list):
            return [walk(v) for v in node]
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        return node

    text = json.dumps(walk(data))
    return text.replace(json.dumps("-" + _INFINITE), "-1e999").replace(
        json.dumps(_INFINITE), "1e999").encode()


class StudyReads(NamedTuple):
    """What :func:`feasible_study` reads of one study, each when it needs it."""

    has_constraints: Callable[[], bool]  # one query
    trials: Callable[[], list[FrozenTrial]]  # optuna-dashboard's cached trials
    system_attrs: Callable[[], dict]  # the study's (a best trial's note and artifacts)


def feasible_study(study_id: int, reads: StudyReads, body: bytes) -> bytes:
    """The ``/api/studies/ID`` answer of a study with constraints, with each trial's
    ``constraints`` (its violations in the order of their keys, <= 0 where a bound holds)
    and its best trials: the best COMPLETE feasible trial, or the feasible Pareto front
    (``hpo.summary.best_of``, the rule of REST and the CLI), of the trials the answer was
    made of; the answer unchanged for a study without constraints.

    optuna-dashboard 0.21 reads a trial's constraints from the system attribute
    ``constraints``, which Optuna 5 no longer writes (it keeps ``constraints:KEY``
    each), so every trial showed none and counted as feasible in its plots; and it took
    the best trial from ``RDBStorage.get_best_trial`` and the front of every COMPLETE
    trial, both blind to constraints: an infeasible trial was shown as the best (the
    breaker's finding). A violation of ``inf`` (the metric was not reported) is written
    ``1e999`` (:func:`_dumps`)."""
    if not reads.has_constraints():
        return body
    data = json.loads(body)
    by_number = {t.number: t for t in reads.trials()}
    directions = data.get("directions") or ["minimize"]
    shown = {d["number"]: d for d in [*data.get("best_trials", []), *data.get("trials", [])]}
    best = best_of(by_number.values(), [d == "maximize" for d in directions])
    missing = [t for t in best if t.number not in shown]  # (before ?after=)
    attrs = reads.system_attrs() if missing else {}
    data["best_trials"] = [shown.get(t.number) or serialize_trial(study_id, t, attrs)
                           for t in best]
    for d in [*data.get("trials", []), *data["best_trials"]]:
        if d.get("number") in by_number:
            constraints = by_number[d["number"]].constraints
            d["constraints"] = [constraints[k] for k in sorted(constraints)]
    return _dumps(data)


def _public_value(key: str, value: str) -> str:
    """A user attribute's value as the dashboard shows it, made public as ``/v1`` does
    (:func:`service.schemas.public_attrs`: a ``fail_reason`` traceback becomes one line
    without server paths)."""
    return public_attrs({key: value}).get(key, value)


def _hide_attrs_in_study(body: bytes) -> bytes:
    """The ``/api/studies/ID`` answer without the trials' hidden user attributes
    (:data:`service.schemas.HIDDEN_TRIAL_ATTRS`: the ``checkpoint`` server path), and
    with their public values (a failed trial's ``fail_reason``), as ``/v1``."""
    data = json.loads(body)
    for trial in [*data.get("trials", []), *data.get("best_trials", [])]:
        trial["user_attrs"] = [{**a, "value": _public_value(a.get("key"), a.get("value"))}
                               for a in trial.get("user_attrs", [])
                               if a.get("key") not in HIDDEN_TRIAL_ATTRS]
    data["union_user_attrs"] = [a for a in data.get("union_user_attrs", [])
                                if a.get("key") not in HIDDEN_TRIAL_ATTRS]
    return _dumps(data)


def _hide_attrs_in_csv(body: bytes) -> bytes:
    """The ``/csv/ID`` answer without the columns of hidden user attributes, and with the
    public values of the others (a failed trial's ``fail_reason``)."""
    rows = list(csv.reader(io.StringIO(body.decode(), newline="")))
    hidden = {f"UserAttribute {key}" for key in HIDDEN_TRIAL_ATTRS}
    header = rows[0] if rows else []
    keep = [i for i, name in enumerate(header) if name not in hidden]
    keys = {i: name.removeprefix("UserAttribute ") for i, name in enumerate(header)
            if name.startswith("UserAttribute ")}
    out = io.StringIO()
    csv.writer(out).writerows([header[i] for i in keep] if n == 0 else
                              [_public_value(keys[i], row[i]) if i in keys and row[i] else row[i]
                               for i in keep if i < len(row)]
                              for n, row in enumerate(rows))
    return out.getvalue().encode()


def _public_hovertext(text: str) -> str:
    """An Optuna plot's hover text (``optuna.visualization._utils._make_hovertext``: a
    trial's number, values, params and user attributes as indented JSON, lines joined by
    ``<br>``) with the user attributes as ``/v1`` shows them; any other text as it was."""
    if "user_attrs" not in text:
        return text
    try:  # each <br> becomes a carriage return: JSON whitespace between tokens, and inside
        # a value (an error's text, a choice) a raw control character that only the lax
        # parser takes (helper-42: the strict one refused it, and the text went out whole,
        # hidden attributes included); the values' own newlines stay newlines
        data = _with_br(json.loads(text.replace("<br>", "\r"), strict=False))
    except ValueError:
        return HOVER_WITHHELD
    if not isinstance(data, dict):
        return HOVER_WITHHELD
    if not isinstance(data.get("user_attrs"), dict):
        return text if "user_attrs" not in data else HOVER_WITHHELD
    data["user_attrs"] = public_attrs(data["user_attrs"])
    if not data["user_attrs"]:
        del data["user_attrs"]
    return json.dumps(data, indent=2).replace("\n", "<br>")


HOVER_WITHHELD = "(this trial's details: see its page)"  # a hover text that does not parse


def _with_br(node):
    """``node`` with the carriage returns inside its strings (keys too) written ``<br>``
    again, as the hover text had them."""
    if isinstance(node, str):
        return node.replace("\r", "<br>")
    if isinstance(node, dict):
        return {_with_br(k): _with_br(v) for k, v in node.items()}
    if isinstance(node, list):
        return [_with_br(v) for v in node]
    return node


def _public_strings(node):
    if isinstance(node, str):
        return _public_hovertext(node)
    if isinstance(node, list):
        return [_public_strings(v) for v in node]
    if isinstance(node, dict):
        return {k: _public_strings(v) for k, v in node.items()}
    return node


def _hide_attrs_in_plot(body: bytes) -> bytes:
    """A ``/api/studies/ID/plot/KIND`` answer (a plotly figure) whose hover texts show the
    trials' user attributes as ``/v1`` does (``timeline`` and ``pareto_front`` carry them)."""
    data = json.loads(body)
    if isinstance(data, dict):
        data["data"] = _public_strings(data.get("data", []))
    return _dumps(data)


# the answers that carry trials' user attributes, rewritten for non-admin tokens
HIDING: dict[str, Rewrite] = {
    "/api/studies/<study_id:int>": _hide_attrs_in_study,
    "/csv/<study_id:int>": _hide_attrs_in_csv,
    "/api/studies/<study_id:int>/plot/<plot_type>": _hide_attrs_in_plot,
}


class Filter:
    """Wraps ``send`` to send a 200 answer's body through ``rewrite``; with ``head``, sends
    its headers (the rewritten body's ``content-length``) and no body."""

    def __init__(self, send, rewrite: Rewrite, head: bool) -> None:
        self._send = send
        self.rewrite = rewrite
        self.head = head
        self.start: dict | None = None
        self.chunks: list[bytes] = []

    async def send(self, message) -> None:
        if message["type"] == "http.response.start":
            self.start = message
            return
        if message["type"] != "http.response.body":
            await self._send(message)
            return
        self.chunks.append(message.get("body", b""))
        if message.get("more_body"):
            return
        body = b"".join(self.chunks)
        if self.start["status"] == 200:  # (a rewrite may read the database)
            body = await run_in_threadpool(self.rewrite, body)
        headers = [(k, v) for k, v in self.start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**self.start, "headers": headers})
        await self._send({"type": "http.response.body", "body": b"" if self.head else body})


class ServerErrors:
    """Runs optuna-dashboard's app so that its failures answer in the service's error shape.

    A 5xx answer (Bottle's HTML error page, optuna-dashboard's ``{"reason": "internal
    server error"}``), or an exception out of the app before it answered (Bottle hands
    ``start_response`` the exception, which a2wsgi raises again: a CSV read of a study
    deleted meanwhile), is answered 404 where ``gone()`` says the route's study no
    longer exists (``KeyError: Record does not exist``), else 500 ``internal``; the
    exception goes to the log, not into the answer.
    """

    def __init__(self, scope, send, gone: Callable[[], Awaitable[str | None]]) -> None:
        self.scope, self._send, self.gone = scope, send, gone
        self.failed = self.started = False
        self.refused: int | None = None  # a 4xx answered as a page, not as JSON

    async def run(self, app, receive, send) -> None:
        """``app(scope, receive, send)``, where ``send`` ends in :meth:`send` (directly, or
        through a rewrite of the body)."""
        try:
            await app(self.scope, receive, send)
        except Exception:
            if self.started and not self.failed:  # its answer is on the way: nothing to do
                raise
            log.exception("dashboard: %s %s failed", self.scope["method"], self.scope["path"])
            if not self.started:
                await self._answer()

    async def send(self, message) -> None:
        if message["type"] == "http.response.start" and message["status"] >= 500:
            self.failed = True
            return
        if message["type"] == "http.response.start" and message["status"] >= 400 \
                and not _is_json(message):  # Bottle's HTML page, a plain "Not Found"
            self.refused = message["status"]
            return
        if self.refused is not None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                self.started = True
                answer = error_response(self.refused, HTTP_CODES.get(self.refused, "refused"),
                                        DASHBOARD_REFUSALS.get(self.refused, "refused"))
                await answer(self.scope, _nothing, self._send)
            return
        if not self.failed:
            self.started = True
            await self._send(message)
            return
        if message["type"] == "http.response.body" and not message.get("more_body"):
            await self._answer()

    async def _answer(self) -> None:
        self.started = True
        missing = await self.gone()
        answer = (error_response(404, "not_found", missing) if missing else
                  error_response(500, "internal", "internal error"))
        await answer(self.scope, _nothing, self._send)


# what a refusal of optuna-dashboard's (a page, not JSON) says instead (helper-39:
# ``/static/..%2f..``'s 403 was Bottle's HTML page, an unknown artifact a plain "Not Found")
DASHBOARD_REFUSALS = {403: "this path is not served", 404: "no such dashboard path or file",
                      405: "method not allowed on this dashboard path"}


def _is_json(start_message) -> bool:
    return any(k.lower() == b"content-type" and v.split(b";")[0].strip().endswith(b"json")
               for k, v in start_message.get("headers", []))


async def _nothing() -> dict:
    return {"type": "http.disconnect"}
