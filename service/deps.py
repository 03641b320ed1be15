"""FastAPI dependencies: the app's components and who is calling (``Annotated`` aliases)."""

from __future__ import annotations

import dataclasses
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy.orm import sessionmaker

from service.auth import ANONYMOUS, Principal, bearer, resolve
from service.settings import Settings
from service.studies import StudyService


@dataclasses.dataclass
class Components:
    """What ``create_app`` builds once and every request shares (``app.state.components``)."""

    settings: Settings
    sessions: sessionmaker
    studies: StudyService
    readiness: object  # service.health.Readiness


def components(request: Request) -> Components:
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
    """The caller of a write: a token is always needed."""
    return resolve(c.sessions, bearer(request.headers.get("authorization")))


Reader = Annotated[Principal, Depends(reader)]
Writer = Annotated[Principal, Depends(writer)]


def studies(c: ComponentsDep) -> StudyService:
    return c.studies


StudiesDep = Annotated[StudyService, Depends(studies)]
