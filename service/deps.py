"""FastAPI dependencies: the app's components and who is calling (``Annotated`` aliases)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

import sqlalchemy.exc
from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import sessionmaker

from service import audit
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
    token = bearer(request.headers.get("authorization"))
    if token is None and c.settings.open_reads:
        return ANONYMOUS
    return resolve(c.sessions, token)


def writer(request: Request, c: ComponentsDep, _: Credentials) -> Principal:
    """The caller of a write: a token is always needed, and a viewer's answers 403."""
    return require_writer(resolve(c.sessions, bearer(request.headers.get("authorization"))))


def admin(request: Request, c: ComponentsDep, _: Credentials) -> Principal:
    """The caller of an admin's route (tokens, audit): an admin token, else 403."""
    return require_admin(resolve(c.sessions, bearer(request.headers.get("authorization"))))


Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]
Admin = Annotated[Principal, Depends(admin)]


@dataclasses.dataclass(frozen=True)
class Auditor:
    """Records the changes of one request in the audit trail (:func:`service.audit.record`):
    its caller is the actor, its client's host the address."""

    sessions: sessionmaker
    actor: str
    address: str | None

    def __call__(self, action: str, target: str, detail: dict | None = None) -> None:
        """Record a change that has been made: a row that cannot be written is logged (the
        log line is written first) and does not turn the change's answer into an error."""
        try:
            audit.record(self.sessions, self.actor, action, target, self.address, detail)
        except sqlalchemy.exc.SQLAlchemyError:
            audit.log.exception("audit row of %s %s not written", action, target)


async def auditor(request: Request, c: ComponentsDep, who: Writer) -> Auditor:
    return Auditor(c.sessions, who.name, request.client.host if request.client else None)


async def admin_auditor(request: Request, c: ComponentsDep, who: Admin) -> Auditor:
    return Auditor(c.sessions, who.name, request.client.host if request.client else None)


AuditDep = Annotated[Auditor, Depends(auditor)]
AdminAuditDep = Annotated[Auditor, Depends(admin_auditor)]


async def studies(c: ComponentsDep) -> StudyService:
    return c.studies


StudiesDep = Annotated[StudyService, Depends(studies)]
