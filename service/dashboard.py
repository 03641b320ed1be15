"""The Optuna dashboard, served by the service at the root path beside ``/v1``, behind its auth.

optuna-dashboard's WSGI app (a Bottle app, run through ``a2wsgi``) must sit at
the root: its page loads ``/static/bundle.js`` and calls ``/api/...``
absolutely, and mounted under a prefix it redirects forever. It has no auth of
its own and 33 routes, of which every non-GET one writes (renames, deletes,
``tell``, and even a schema migration). :class:`DashboardGate` puts it behind
the service's tokens:

* the token comes from ``Authorization: Bearer``, the ``hpo_token`` cookie, or
  ``?token=`` once (answered by a redirect that sets the cookie and drops the
  token from the address);
* methods other than GET/HEAD answer 403 unless the token is an admin's;
* a non-admin token sees only its own studies: other study ids answer 404 and
  ``/api/studies`` is filtered (unless reads are open);
* ``/static/`` and ``/favicon.ico`` (the page's code, no data) need no token.
"""

from __future__ import annotations

import json
import re
from urllib.parse import parse_qsl, urlencode

import optuna
import optuna_dashboard
import sqlalchemy as sa
from a2wsgi import WSGIMiddleware
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse

from service import optuna_sql
from service.api_errors import error_response
from service.auth import ANONYMOUS, COOKIE_NAME, Principal, bearer, resolve
from service.db import StudyRow
from service.errors import NotAuthenticated
from service.settings import Settings

READ_METHODS = {"GET", "HEAD"}
PUBLIC = re.compile(r"^/(static/|favicon\.ico$)")
STUDY_PATH = re.compile(r"^/(?:api/studies|csv|artifacts)/(\d+)(?:/|$)")
LOGIN_PAGE = """<!doctype html><title>hpo dashboard: token needed</title>
<h1>Token needed</h1><p>Open <code>{path}?token=YOUR_TOKEN</code> once; a cookie keeps it.
Create a token with <code>hpo token create NAME</code>.</p>"""


def build_dashboard(storage: optuna.storages.BaseStorage, sessions: sessionmaker,
                    settings: Settings) -> DashboardGate:
    """The gated dashboard ASGI app over ``storage``; mount it at ``/`` after the API routes."""
    return DashboardGate(WSGIMiddleware(optuna_dashboard.wsgi(storage)), sessions, settings)


class DashboardGate:
    """ASGI app: auth, read-only for non-admins, and owner scoping in front of the dashboard."""

    def __init__(self, app, sessions: sessionmaker, settings: Settings) -> None:
        self.app = app
        self.sessions = sessions
        self.settings = settings

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or PUBLIC.match(scope["path"]):
            await self.app(scope, receive, send)
            return
        request = Request(scope)
        response = await self._check(request)
        if response is not None:
            await response(scope, receive, send)
            return
        who: Principal = scope["hpo.principal"]
        if (scope["path"] == "/api/studies" and scope["method"] == "GET"
                and not self._sees_all(who)):
            await self.app(scope, receive, _Filter(send, await self._owned_ids(who)).send)
            return
        await self.app(scope, receive, send)

    async def _check(self, request: Request):
        """``None`` to let the request through, else the answer that refuses it."""
        query_token = request.query_params.get("token")
        try:
            if query_token is not None:
                await run_in_threadpool(resolve, self.sessions, query_token)
                return _login_redirect(request, query_token)
            who = await self._principal(request)
        except NotAuthenticated as e:
            if request.url.path.startswith("/dashboard") or request.url.path == "/":
                return HTMLResponse(LOGIN_PAGE.format(path=request.url.path), status_code=401)
            return error_response(401, "not_authenticated", str(e))
        request.scope["hpo.principal"] = who
        if request.method not in READ_METHODS and not who.is_admin:
            return error_response(403, "forbidden", "the dashboard is read-only for non-admin "
                                                    "tokens")
        match = STUDY_PATH.match(request.url.path)
        if match and not self._sees_all(who) and int(match[1]) not in await self._owned_ids(who):
            return error_response(404, "not_found", f"no study with id {match[1]}")
        return None

    async def _principal(self, request: Request) -> Principal:
        token = bearer(request.headers.get("authorization")) or request.cookies.get(COOKIE_NAME)
        if token is None and self.settings.open_reads and request.method in READ_METHODS:
            return ANONYMOUS
        return await run_in_threadpool(resolve, self.sessions, token)

    def _sees_all(self, who: Principal) -> bool:
        return who.is_admin or self.settings.open_reads

    async def _owned_ids(self, who: Principal) -> set[int]:
        def query() -> set[int]:
            with self.sessions() as session:
                names = session.execute(sa.select(StudyRow.name).where(
                    StudyRow.owner_id == who.token_id)).scalars().all()
                return set(optuna_sql.study_ids(session.connection(), names).values())

        return await run_in_threadpool(query)


def _login_redirect(request: Request, token: str) -> RedirectResponse:
    """Redirect to the same address without ``token``, setting the cookie."""
    rest = [(k, v) for k, v in parse_qsl(request.url.query) if k != "token"]
    target = request.url.path + (f"?{urlencode(rest)}" if rest else "")
    response = RedirectResponse(target, status_code=303)
    response.set_cookie(COOKIE_NAME, token, httponly=True, samesite="strict",
                        secure=request.url.scheme == "https", path="/")
    return response


class _Filter:
    """Wraps ``send`` to keep only owned studies in the ``/api/studies`` answer."""

    def __init__(self, send, owned: set[int]) -> None:
        self._send = send
        self.owned = owned
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
        if self.start["status"] == 200:
            data = json.loads(body)
            data["study_summaries"] = [s for s in data.get("study_summaries", [])
                                       if s.get("study_id") in self.owned]
            body = json.dumps(data).encode()
        headers = [(k, v) for k, v in self.start["headers"] if k.lower() != b"content-length"]
        headers.append((b"content-length", str(len(body)).encode()))
        await self._send({**self.start, "headers": headers})
        await self._send({"type": "http.response.body", "body": body})
