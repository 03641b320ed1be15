"""The Optuna dashboard, served by the service at the root path beside ``/v1``, behind its auth.

optuna-dashboard's WSGI app (a Bottle app, run through ``a2wsgi``) must sit at
the root: its page loads ``/static/bundle.js`` and calls ``/api/...``
absolutely, and mounted under a prefix it redirects forever. It has no auth of
its own, and many of its routes write: create, rename and delete studies,
``tell`` trials, set trial attributes, even migrate the database schema.
:class:`DashboardGate` puts it behind the service's tokens, default-deny:

* The path is normalised the way the dashboard's router reads it (the
  server has already decoded percent-escapes; repeated slashes collapse,
  trailing slashes go: optuna-dashboard strips them before routing), the
  dashboard is handed that normalised path, and the route it will run is
  found with the dashboard's own router (HEAD runs the GET route). So the
  gate decides on exactly the route and arguments the dashboard will use.
* Only the routes in :data:`ALLOWED` run, each with its :class:`Access`; any
  other route answers 403 to every token, admins included (a newer
  optuna-dashboard's new route stays closed until it is added there):

  - the page, its code and its metadata (``/``, ``/dashboard...``,
    ``/static/...``, ``/favicon.ico``, ``/api/meta``, the schema notice
    ``GET /incompatible-rdb-schema``);
  - reads: the study list ``/api/studies`` (a non-admin token gets only its
    own studies, for GET and HEAD alike, ``content-length`` included), and
    every route that reads one study by its id (``/api/studies/ID``,
    ``.../param_importances``, ``.../plot/KIND``, ``/csv/ID``,
    ``/artifacts/ID/...``): another owner's study answers 404, as does a trial
    (``/artifacts/ID/TRIAL/...``, a trial's note) that is not one of study ID's;
    for a non-admin token (and open reads) the study detail and its CSV
    (``/api/studies/ID``, ``/csv/ID``) leave out the trials' ``checkpoint``
    attribute, a server path, and show a failed trial's ``fail_reason`` as one
    line without server paths, as ``/v1`` does; so do the hover texts of the
    plots (``plot/timeline``, ``plot/pareto_front``);
  - writes, for admin tokens only: the study's note and its trials' notes
    (``PUT /api/studies/ID/note``, ``PUT /api/studies/ID/TRIAL/note``), which
    only the dashboard reads.

  A study made outside the service (created directly with Optuna in the same
  database: no row in ``hpo_studies``, so no owner) is shown read-only: admins
  and viewers (and everyone, with ``HPO_OPEN_READS``) see it in the list and
  read every route of it; a member does not see it (it is nobody's study: 404,
  as another owner's); its notes are refused to admins too (403), so nothing
  in the dashboard writes to a study the service does not manage. ``/v1``
  does not list it (:meth:`service.studies.StudyService._absent`).

  Refused for everyone (403, pointing to the REST API): creating, renaming
  and deleting studies (the service owns the study names and keeps its own
  record of each study: use ``POST``/``DELETE /v1/studies``), telling trials,
  setting trial attributes, preferential feedback and skips, artifact uploads
  and deletions (the study drivers write the trials), the schema upgrade
  (``POST /incompatible-rdb-schema``; the service migrates its own tables, an
  Optuna schema upgrade is run by hand with ``optuna storage upgrade``) and
  the LLM routes (no provider is configured).
* The token comes from ``Authorization: Bearer``, or from the session of the
  ``hpo_session`` cookie set by the login step (:mod:`service.dashboard_login`);
  never from the address. Every request resolves it again
  (:func:`service.auth.resolve`, :func:`service.auth.resolve_session`): a revoked
  or expired token, an ended session, answers 401 from its next request on.
  A ``viewer`` token's request of any method but GET, HEAD and OPTIONS answers
  403. A cookie-authenticated write must come from the service's own pages
  (``Origin``/``Referer``, see there).
* Without a token, a page answers 401 with the login form, anything else 401
  in JSON; with ``HPO_OPEN_READS`` reads need no token and show every study.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import re
from pathlib import Path
from urllib.parse import quote

import bottle
import optuna
import optuna_dashboard
import sqlalchemy as sa
from a2wsgi import WSGIMiddleware
from optuna.artifacts import FileSystemArtifactStore
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response

from service import dashboard_login, optuna_sql
from service.api_errors import error_response
from service.auth import ANONYMOUS, COOKIE_NAME, Principal, bearer, resolve, resolve_session
from service.dashboard_answers import (
    HIDING,
    Filter,
    Rewrite,
    ServerErrors,
    StudyReads,
    feasible_study,
    owned_studies,
)
from service.dashboard_cache import StudyIdentities, cached_trials
from service.dashboard_input import input_problem, study_exists, with_accept_encoding
from service.db import StudyRow
from service.errors import NotAuthenticated
from service.middleware import replaying
from service.settings import Settings

READ_METHODS = frozenset({"GET", "HEAD"})
MIN_ID, MAX_ID = -2**63, 2**63 - 1  # the database's integer ids (SQLite's, BIGINT)
PAGE_PATH = re.compile(r"^/(dashboard(/.*)?)?$")
REFUSED = ("the dashboard does not change studies or trials here: the service manages them "
           "(create, stop and delete studies through the REST API, /v1; see /docs)")
FOREIGN = ("this study was made outside the service, directly with Optuna: the dashboard "
           "shows it read-only")


class Access(enum.Enum):
    """Who may call a dashboard route."""

    PUBLIC = "no token: the page's code, no data"
    PAGE = "any token: the page and metadata, no study data"
    LIST = "any token: the study list, only the token's own studies for a non-admin"
    STUDY = "a token that sees the study named by the route's study_id"
    NOTE = "admin tokens: notes, which only the dashboard reads"


# optuna-dashboard 0.21's routes (method, Bottle rule) that the gate lets through.
ALLOWED: dict[tuple[str, str], Access] = {
    ("GET", "/static/<filename:path>"): Access.PUBLIC,
    ("GET", "/favicon.ico"): Access.PUBLIC,
    ("GET", "/"): Access.PAGE,
    ("GET", "/dashboard<:re:(/.*)?>"): Access.PAGE,
    ("GET", "/api/meta"): Access.PAGE,
    ("GET", "/incompatible-rdb-schema"): Access.PAGE,
    ("GET", "/api/studies"): Access.LIST,
    ("GET", "/api/studies/<study_id:int>"): Access.STUDY,
    ("GET", "/api/studies/<study_id:int>/param_importances"): Access.STUDY,
    ("GET", "/api/studies/<study_id:int>/plot/<plot_type>"): Access.STUDY,
    ("GET", "/csv/<study_id:int>"): Access.STUDY,
    ("GET", "/artifacts/<study_id:int>/<artifact_id:re:[0-9a-fA-F-]+>"): Access.STUDY,
    ("GET", "/artifacts/<study_id:int>/<trial_id:int>/<artifact_id:re:[0-9a-fA-F-]+>"):
        Access.STUDY,
    ("PUT", "/api/studies/<study_id:int>/note"): Access.NOTE,
    ("PUT", "/api/studies/<study_id:int>/<trial_id:int>/note"): Access.NOTE,
}


def build_dashboard(storage: optuna.storages.BaseStorage, sessions: sessionmaker,
                    settings: Settings) -> DashboardGate:
    """The gated dashboard ASGI app over ``storage``; mount it at ``/`` after the API routes."""
    # the store the drivers keep the best trials' models in (hpo.models): the dashboard
    # lists and downloads them (GET /artifacts/..., gated below like the study)
    store = FileSystemArtifactStore(Path(settings.artifacts_path).resolve())
    return DashboardGate(optuna_dashboard.wsgi(storage, artifact_store=store), sessions,
                         settings, storage)


STUDY_RULE = "/api/studies/<study_id:int>"


def _then(first: Rewrite, second: Rewrite | None) -> Rewrite:
    """The rewrite ``first``, then ``second`` where there is one."""
    return first if second is None else lambda body: second(first(body))


def normalize_path(path: str) -> str:
    """``path`` as optuna-dashboard routes it: one slash between segments, none at the end.

    ``path`` is the ASGI ``scope["path"]``, already percent-decoded by the server.
    """
    return re.sub(r"/{2,}", "/", path).rstrip("/") or "/"


@dataclasses.dataclass(frozen=True)
class Route:
    """The dashboard route a request runs: its ``Access`` (``None``: refused) and arguments."""

    access: Access | None
    args: dict
    rule: str = ""


class DashboardGate:
    """ASGI app: auth, the route allow-list and owner scoping in front of the dashboard.

    Args:
        bottle_app: optuna-dashboard's WSGI app (``optuna_dashboard.wsgi(storage)``).
        sessions: the service's database sessions (tokens, study owners).
        settings: ``open_reads`` and ``url`` (the address cookie writes must come from).
        storage: the Optuna storage the dashboard reads (its study answers' best trials
            are rewritten from it: :func:`service.dashboard_answers.feasible_study`).
    """

    def __init__(self, bottle_app: bottle.Bottle, sessions: sessionmaker,
                 settings: Settings, storage: optuna.storages.BaseStorage) -> None:
        self.storage, self.bottle_app = storage, bottle_app
        self.router = bottle_app.router
        self.app = WSGIMiddleware(bottle_app)
        self.sessions = sessions
        self.settings = settings
        self.identities = StudyIdentities(bottle_app, sessions)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        path = normalize_path(scope["path"])
        scope = {**scope, "path": path, "raw_path": quote(path).encode("ascii"),
                 "headers": with_accept_encoding(scope["headers"])}
        request = Request(scope, receive)
        if path in (dashboard_login.LOGIN_PATH, dashboard_login.LOGOUT_PATH):
            answer = await dashboard_login.answer(request, self.sessions, self.settings)
        else:
            answer = await self._check(request)
        if isinstance(answer, Response):
            await answer(scope, receive, send)
            return
        head = scope["method"] == "HEAD"
        if answer is not None:  # a rewrite of the answer's body
            scope = {**scope, "method": "GET"}
        elif scope["method"] not in dashboard_login.SAFE_METHODS:  # a note: its body, read
            receive = replaying(await request.body(), receive)  # by the check, goes on
        errors = ServerErrors(scope, send, functools.partial(self._gone, scope))
        await errors.run(self.app, receive, errors.send if answer is None else
                         Filter(errors.send, answer, head).send)

    async def _gone(self, scope) -> str | None:
        """Why the study of the request's route is not there any more, or ``None``."""
        route = self._route(scope["method"], scope["path"])
        study_id = route.args.get("study_id") if isinstance(route, Route) else None
        if study_id is not None and not await study_exists(self.sessions, study_id):
            return f"no study with id {study_id}"
        return None

    async def _check(self, request: Request) -> Response | Rewrite | None:
        """A refusal, a rewrite of the answer's body, or ``None`` to let it through."""
        route = self._route(request.method, request.url.path)
        if isinstance(route, Route) and route.access is Access.PUBLIC:
            return None
        try:
            who, by_cookie = await self._principal(request)
        except NotAuthenticated as e:
            if PAGE_PATH.match(request.url.path):
                return dashboard_login.login_page(request.url.path, status_code=401)
            return error_response(401, "not_authenticated", str(e))
        if by_cookie and request.method not in dashboard_login.SAFE_METHODS:
            refusal = dashboard_login.cross_origin_refusal(request.headers, self.settings.url)
            if refusal is not None:
                return refusal
        if not who.may_write and request.method not in dashboard_login.SAFE_METHODS:
            return error_response(403, "forbidden", f"token {who.name!r} has the role "
                                  f"{who.role.value!r}, which may only read")
        if not isinstance(route, Route):
            return route
        if route.access is None:
            return error_response(403, "forbidden", REFUSED)
        if route.access is Access.NOTE and not who.is_admin:
            return error_response(403, "forbidden",
                                  "the dashboard is read-only for non-admin tokens")
        for name in ("study_id", "trial_id"):  # beyond the id columns: names nothing (and
            # SQLite's driver raises on such an int: 500)
            if not MIN_ID <= route.args.get(name, 0) <= MAX_ID:
                return error_response(404, "not_found", f"no {name[:-3]} with id "
                                      f"{route.args[name]}")
        if "study_id" in route.args and self._sees_all(who) and not await study_exists(
                self.sessions, route.args["study_id"]):  # (a member's: not owned, below)
            return error_response(404, "not_found", f"no study with id "
                                  f"{route.args['study_id']}")
        if route.access is Access.NOTE and not await self._managed(route.args["study_id"]):
            return error_response(403, "forbidden", FOREIGN)
        if route.access is Access.PAGE:
            return None
        hide = None if who.is_admin else HIDING.get(route.rule)
        if not self._sees_all(who):
            owned = await self._owned_ids(who)
            if route.access is Access.LIST:
                return functools.partial(owned_studies, owned)
            if route.args["study_id"] not in owned:
                return error_response(404, "not_found",
                                      f"no study with id {route.args['study_id']}")
        if "study_id" in route.args:  # SQLite reuses a deleted study's id
            await self.identities.check(route.args["study_id"])
        if route.rule == STUDY_RULE:  # its best trials as REST's, whoever reads
            hide = _then(functools.partial(feasible_study, route.args["study_id"],
                                           self._reads(route.args["study_id"])), hide)
        return (await self._trial_refusal(route)
                or await input_problem(route.rule, route.args, request, self.sessions) or hide)

    def _reads(self, study_id: int) -> StudyReads:
        """What :func:`service.dashboard_answers.feasible_study` reads of ``study_id``."""
        def has_constraints() -> bool:
            with self.sessions() as session:
                return optuna_sql.has_constraints(session.connection(), study_id)

        return StudyReads(
            has_constraints,
            functools.partial(cached_trials, self.bottle_app, self.storage, study_id),
            functools.partial(self.storage.get_study_system_attrs, study_id))

    async def _trial_refusal(self, route: Route) -> Response | None:
        """404 where the route names a trial that is not one of its study's.

        optuna-dashboard looks a trial up by its id alone (a trial's artifact, its note):
        one of another study, reached through a study the token sees, is refused. Checked
        once the token is known to see the study: before, the answer would tell another
        owner's study's trials from the rest.
        """
        if "trial_id" in route.args and not await self._trial_of(route.args["study_id"],
                                                                 route.args["trial_id"]):
            return error_response(404, "not_found", f"no trial with id "
                                  f"{route.args['trial_id']} in study {route.args['study_id']}")
        return None

    def _route(self, method: str, path: str) -> Route | Response:
        """The route the dashboard's router picks for ``method`` and ``path``, or its error."""
        try:
            target, args = self.router.match({"REQUEST_METHOD": method, "PATH_INFO": path})
        except bottle.HTTPError as e:
            if e.status_code == 405:
                methods = set(e.get_header("Allow", "").split(","))
                allow = ", ".join(sorted(methods | ({"HEAD"} if "GET" in methods else set())))
                return error_response(405, "method_not_allowed",
                                      f"{path} answers {allow}", headers={"Allow": allow})
            if e.status_code == 404:
                return error_response(404, "not_found", f"no such path: {path}")
            return error_response(400, "bad_request", f"malformed path: {path}")
        return Route(ALLOWED.get((target.method, target.rule)), args, target.rule)

    async def _principal(self, request: Request) -> tuple[Principal, bool]:
        """Who calls, and whether the cookie (not a bearer header) said so."""
        token = bearer(request.headers.get("authorization"))
        if token is not None:
            return await run_in_threadpool(resolve, self.sessions, token), False
        session_id = request.cookies.get(COOKIE_NAME)
        open_read = self.settings.open_reads and request.method in READ_METHODS
        if session_id is None and open_read:
            return ANONYMOUS, False
        try:
            return await run_in_threadpool(resolve_session, self.sessions, session_id), True
        except NotAuthenticated:
            if open_read:  # a session that ended (the browser still sends its cookie)
                return ANONYMOUS, False
            raise

    def _sees_all(self, who: Principal) -> bool:
        return who.reads_all or self.settings.open_reads

    async def _managed(self, study_id: int) -> bool:
        """Whether the Optuna study ``study_id`` is one of the service's (has a row)."""
        def query() -> bool:
            with self.sessions() as session:
                return session.execute(sa.select(StudyRow.id).join(
                    optuna_sql.studies, optuna_sql.studies.c.study_name == StudyRow.name)
                    .where(optuna_sql.studies.c.study_id == study_id)).first() is not None

        return await run_in_threadpool(query)

    async def _trial_of(self, study_id: int, trial_id: int) -> bool:
        """Whether the Optuna trial ``trial_id`` belongs to the study ``study_id``."""
        def query() -> bool:
            with self.sessions() as session:
                return session.execute(sa.select(optuna_sql.trials.c.trial_id).where(
                    optuna_sql.trials.c.trial_id == trial_id,
                    optuna_sql.trials.c.study_id == study_id)).first() is not None

        return await run_in_threadpool(query)

    async def _owned_ids(self, who: Principal) -> set[int]:
        def query() -> set[int]:
            with self.sessions() as session:
                names = session.execute(sa.select(StudyRow.name).where(
                    StudyRow.owner_id == who.token_id)).scalars().all()
                return set(optuna_sql.study_ids(session.connection(), names).values())

        return await run_in_threadpool(query)
