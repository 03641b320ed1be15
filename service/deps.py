"""FastAPI dependencies: the app's components and who is calling (``Annotated`` aliases)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Annotated, TypeVar

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool

from service.audit import Auditor
from service.auth import ANONYMOUS, Principal, bearer, require_admin, require_writer, resolve
from service.settings import Settings
from service.studies import StudyService


@dataclasses.dataclass
class Components:
    """What ``create_app`` builds once and every request shares (``app.state.components``)."""

    settings: Settings
    sessions: sessionmaker
    studies: StudyService
    readiness: object  # service.health.Readiness


# The dependencies that do no I/O are ``async def``: FastAPI runs a plain ``def`` dependency
# in its thread pool, a hand-over per dependency per request (about a tenth of the API's
# CPU under bench/load.py). Those that query the database (the callers' tokens) stay
# ``def`` and so run off the event loop.


async def components(request: Request) -> Components:
    return request.app.state.components


ComponentsDep = Annotated[Components, Depends(components)]


# documents the bearer scheme in OpenAPI; the header is read by service.auth.bearer
BEARER = HTTPBearer(auto_error=False, description="a token of `hpo token create`")
Credentials = Annotated[HTTPAuthorizationCredentials | None, Security(BEARER)]


def reader(request: Request, c: ComponentsDep, _: Credentials) -> Principal:
    """The caller of a read: its token's principal; anonymous only when reads are open."""
    return _reader(c, request.headers.get("authorization"))


def _reader(c: Components, authorization: str | None) -> Principal:
    token = bearer(authorization)
    if token is None and c.settings.open_reads:
        return ANONYMOUS
    return resolve(c.sessions, token)


def writer(request: Request, c: ComponentsDep, _: Credentials) -> Principal:
    """The caller of a write: a token is always needed, and a viewer's answers 403."""
    return _writer(c, request.headers.get("authorization"))


def _writer(c: Components, authorization: str | None) -> Principal:
    return require_writer(resolve(c.sessions, bearer(authorization)))


def admin(request: Request, c: ComponentsDep, _: Credentials) -> Principal:
    """The caller of an admin's route (tokens, audit): an admin token, else 403."""
    return require_admin(resolve(c.sessions, bearer(request.headers.get("authorization"))))


Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]


async def auditor(request: Request, c: ComponentsDep, who: Writer) -> Auditor:
    return Auditor(c.sessions, who.name, request.client.host if request.client else None)


async def admin_auditor(request: Request, c: ComponentsDep, who: Admin) -> Auditor:
    return Auditor(c.sessions, who.name, request.client.host if request.client else None)


AuditDep = Annotated[Auditor, Depends(auditor)]
AdminAuditDep = Annotated[Auditor, Depends(admin_auditor)]


async def studies(c: ComponentsDep) -> StudyService:
    return c.studies


StudiesDep = Annotated[StudyService, Depends(studies)]


T = TypeVar("T")


@dataclasses.dataclass(frozen=True)
class Call:
    """One request of a route that does its whole work in one hand-over to the thread pool:
    the caller's token resolved (:func:`reader` or :func:`writer`), the work, and for a
    write its audit row. A ``def`` route with ``def`` dependencies takes three hand-overs
    (the token's dependency, the route, and FastAPI's validation of a ``def`` route's answer),
    each a wake-up of the event loop and of a worker thread: under ``bench/load.py`` the
    event loop's share of the API's CPU. The dependency itself does no I/O (``async``)."""

    components: Components
    authorization: str | None
    address: str | None
    write: bool

    @property
    def studies(self) -> StudyService:
        return self.components.studies

    def caller(self) -> Principal:
        """The request's principal (in the thread pool: reads the token's row).

        Raises:
            NotAuthenticated, Forbidden: as :func:`reader` and :func:`writer`.
        """
        return (_writer if self.write else _reader)(self.components, self.authorization)

    def auditor(self, who: Principal) -> Auditor:
        return Auditor(self.components.sessions, who.name, self.address)

    async def run(self, work: Callable[[Principal], T]) -> T:
        """``work(caller)`` in the thread pool, after the caller's token is resolved."""
        return await run_in_threadpool(lambda: work(self.caller()))


def _call(write: bool):
    async def call(request: Request, c: ComponentsDep, _: Credentials) -> Call:
        # No token at all answers 401 here, before the route's parameters are validated, as
        # from reader and writer. A token is read from the database in the thread pool, with
        # the route's work; if the parameters are invalid the route never runs, and the
        # handler of their 422 resolves the token first (service.api_errors), so a bad token
        # still answers 401 (or a viewer's write 403) before the parameters are judged.
        authorization = request.headers.get("authorization")
        if bearer(authorization) is None and (write or not c.settings.open_reads):
            _writer(c, authorization)  # raises NotAuthenticated, with no query
        found = Call(c, authorization, request.client.host if request.client else None, write)
        request.state.caller = found.caller
        return found
    return call


ReadCall = Annotated[Call, Depends(_call(write=False))]
WriteCall = Annotated[Call, Depends(_call(write=True))]
