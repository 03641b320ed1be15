"""The dashboard's login step, and the same-origin check of cookie-authenticated writes.

A browser cannot send ``Authorization: Bearer`` when it follows a link, so the
dashboard exchanges a token for a session, kept in the ``hpo_session`` cookie
(HttpOnly, SameSite=Strict, Secure over https), in one explicit step:

* ``GET /dashboard/login`` shows a small form (also shown, with status 401,
  in place of any dashboard page opened without a token);
* ``POST /dashboard/login`` with ``token`` (and optionally ``next``, a
  ``/dashboard`` path) in an ``application/x-www-form-urlencoded`` body sets
  the cookie and redirects (303) to ``next`` (default ``/dashboard``);
* ``POST /dashboard/logout`` ends the session and clears the cookie.

The cookie holds a session id of its own (``service.auth.create_session``), never
the token: cookies are not bound to a port (RFC 6265, section 8.5), so whatever
listens on another port of the host gets the cookie, and with the token it would
have had the whole REST API (tokens, deletes) for as long as the token lived. A
session only opens the dashboard, ends ``HPO_DASHBOARD_SESSION_HOURS`` after the
login (default 12) or at its logout, and the gate (:mod:`service.dashboard`)
resolves its token on every request: revoking the token (``hpo token revoke``) or
its expiry ends the session at its next request.

A token in the address (``?token=``) is never read: any page could link to
it and so plant its own token in a visitor's browser (login CSRF). For the
same reason the login itself, and every request that the cookie authenticates
with a method other than GET, HEAD or OPTIONS, must come from the service's
own pages: its ``Origin`` header (or, when absent, its ``Referer``) must name
the service's address, ``Settings.url`` (``HPO_PUBLIC_URL``, default
``http://HPO_HOST:HPO_PORT``); a request with neither is refused too. When that
address names a loopback host, ``localhost``, ``127.0.0.1`` and ``[::1]`` on the
same scheme and port count as the same address. Requests authenticated with
``Authorization: Bearer`` are not subject to the check (another site cannot
make a browser send that header). The REST API (``/v1``) never reads the
cookie (``service.deps``).
"""

from __future__ import annotations

import datetime as dt
import html
import re
from collections.abc import Mapping
from urllib.parse import parse_qs, urlsplit

from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response

from service.api_errors import error_response
from service.auth import COOKIE_NAME, create_session, end_session
from service.errors import NotAuthenticated
from service.settings import Settings

LOGIN_PATH = "/dashboard/login"
LOGOUT_PATH = "/dashboard/logout"
SAFE_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
FORM_TYPE = "application/x-www-form-urlencoded"
_NEXT = re.compile(r"^/dashboard(/[A-Za-z0-9_.~/-]*)?$")
_LOOPBACK = frozenset({"localhost", "127.0.0.1", "::1"})
_DEFAULT_PORTS = {"http": 80, "https": 443}
_PAGE_HEADERS = {"Content-Security-Policy": "default-src 'none'; form-action 'self'; "
                                            "frame-ancestors 'none'",
                 "Cache-Control": "no-store"}
_FORM = """<!doctype html><meta charset="utf-8"><title>hpo dashboard: token needed</title>
<h1>Token needed</h1>{message}
<form method="post" action="{action}">
<label>Token <input type="password" name="token" autocomplete="current-password" required
autofocus></label><input type="hidden" name="next" value="{next}">
<button type="submit">Log in</button></form>
<p>Create a token with <code>hpo token create NAME</code>. The browser keeps a session (not the
token) in an HttpOnly cookie until it closes, you log out, or the session ends.</p>"""


def login_page(next_path: str = "/dashboard", message: str = "",
               status_code: int = 200) -> HTMLResponse:
    """The login form; after it, the browser goes to ``next_path`` (a ``/dashboard`` path,
    else ``/dashboard``)."""
    body = _FORM.format(action=LOGIN_PATH, next=html.escape(_safe_next(next_path)),
                        message=f"<p>{html.escape(message)}</p>" if message else "")
    return HTMLResponse(body, status_code=status_code, headers=_PAGE_HEADERS)


async def answer(request: Request, sessions: sessionmaker, settings: Settings) -> Response:
    """The answer to a request for ``LOGIN_PATH`` or ``LOGOUT_PATH``."""
    login = request.url.path == LOGIN_PATH
    if login and request.method in ("GET", "HEAD"):
        return login_page(request.query_params.get("next", "/dashboard"))
    if request.method != "POST":
        allow = "GET, HEAD, POST" if login else "POST"
        return error_response(405, "method_not_allowed",
                              f"{request.url.path} answers {allow}", headers={"Allow": allow})
    refusal = cross_origin_refusal(request.headers, settings.url)
    if refusal is not None:
        return refusal
    if not login:
        await run_in_threadpool(end_session, sessions, request.cookies.get(COOKIE_NAME))
        response = RedirectResponse(LOGIN_PATH, status_code=303)
        response.delete_cookie(COOKIE_NAME, path="/", httponly=True, samesite="strict")
        return response
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != FORM_TYPE:
        return error_response(415, "unsupported_media_type",
                              f"the login form is sent as {FORM_TYPE}")
    form = parse_qs((await request.body()).decode("utf-8", "replace"))
    token, next_path = form.get("token", [""])[0], form.get("next", ["/dashboard"])[0]
    try:
        session_id = await run_in_threadpool(
            create_session, sessions, token.strip(),
            dt.timedelta(hours=settings.dashboard_session_hours))
    except NotAuthenticated as e:  # unknown, revoked or expired: the message says which
        return login_page(next_path, f"{str(e)[:1].upper()}{str(e)[1:]}.", status_code=401)
    response = RedirectResponse(_safe_next(next_path), status_code=303)
    response.set_cookie(COOKIE_NAME, session_id, httponly=True, samesite="strict",
                        secure="https" in (request.url.scheme, urlsplit(settings.url).scheme),
                        path="/")
    return response


def cross_origin_refusal(headers: Mapping[str, str], own_url: str) -> Response | None:
    """``None`` when the request's ``Origin`` (else ``Referer``) names ``own_url``'s origin,
    else the 403 answer that refuses it."""
    source = headers.get("origin") or headers.get("referer")
    if source is not None and _origin(source) in _own_origins(own_url):
        return None
    got = f"got {source!r}" if source is not None else "it has neither"
    return error_response(
        403, "forbidden",
        f"a dashboard login, or a change made with the dashboard's cookie, must come from "
        f"this service's own pages: its Origin (or Referer) header must be {own_url}, {got} "
        f"(a script sends -H 'Origin: {own_url}'); set HPO_PUBLIC_URL to the address people "
        f"open, or send Authorization: Bearer TOKEN instead")


def _origin(url: str) -> tuple[str, str, int | None] | None:
    try:
        parts = urlsplit(url.strip())
        scheme = parts.scheme.lower()
        return scheme, (parts.hostname or "").lower(), parts.port or _DEFAULT_PORTS.get(scheme)
    except ValueError:  # a port that is not a number
        return None


def _own_origins(own_url: str) -> set[tuple[str, str, int | None]]:
    own = _origin(own_url)
    if own is None:
        return set()
    if own[1] not in _LOOPBACK:
        return {own}
    return {(own[0], host, own[2]) for host in _LOOPBACK}


def _safe_next(next_path: str) -> str:
    """``next_path`` when it is a dashboard page of this service, else ``/dashboard`` (no open
    redirect to another site)."""
    return next_path if _NEXT.match(next_path) and "//" not in next_path else "/dashboard"
