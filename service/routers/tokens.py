"""``/v1/tokens``: the tokens and their quotas, for admin tokens (issue 15.1, 15.2).

List, read, create (the answer carries the secret, once), revoke (from the token's next
request on, dashboard cookies included), read and set an owner's quota. Every change
is audited (:mod:`service.audit`). Any other token answers 403.
"""

from __future__ import annotations

import datetime as dt
import re
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Response, status

from service import tokens as store
from service.api_errors import documented
from service.auth import TOKEN_NAME_PATTERN, create_token
from service.db import utcnow
from service.deps import Admin, AdminAuditDep, ComponentsDep
from service.errors import StudyConflict, TokenNotFound
from service.schemas import ErrorBody, Page
from service.token_schemas import QuotaBody, TokenCreated, TokenIn, TokenOut

router = APIRouter(prefix="/v1/tokens", tags=["tokens"])

NO_TOKEN = {404: {"model": ErrorBody, "description": "no token of that name"}}
CONFLICT = {409: {"model": ErrorBody, "description": "a token of that name exists, or the "
                                                     "token would revoke itself"}}
READ = {**documented(401, 403, 422, 503)}
WRITE = {**documented(401, 403, 408, 413, 422, 503)}
BODY = {**WRITE, **documented(400)}  # a body that is not JSON
Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="items to skip")]


def token_name(name: Annotated[str, Path(description="the token's name")]) -> str:
    """The ``{name}`` of the address; one no token can have answers 404 at once."""
    if not re.fullmatch(TOKEN_NAME_PATTERN, name):
        raise TokenNotFound(f"no token named {name!r}")
    return name


TokenName = Annotated[str, Depends(token_name)]


@router.get("", response_model=Page[TokenOut], responses=READ)
def list_tokens(who: Admin, c: ComponentsDep, offset: Offset = 0,
                limit: Limit = 50) -> Page[TokenOut]:
    """Every token by creation time: role, state, last use, expiry, quota (never a secret)."""
    infos, total = store.list_tokens(c.sessions, offset, limit)
    return Page[TokenOut](items=[TokenOut.of(i) for i in infos], total=total, offset=offset,
                          limit=limit)


@router.post("", status_code=status.HTTP_201_CREATED, response_model=TokenCreated,
             responses={**BODY, **CONFLICT})
def create(body: TokenIn, who: Admin, c: ComponentsDep, audit: AdminAuditDep,
           response: Response) -> TokenCreated:
    """Create a token; the answer carries its secret, which no later answer shows."""
    expires_at = (utcnow() + dt.timedelta(seconds=body.expires_in_s)
                  if body.expires_in_s is not None else None)
    secret = create_token(c.sessions, body.name, role=body.role, expires_at=expires_at)
    audit("token.create", body.name, {"role": body.role.value, "expires_at": expires_at
                                      and expires_at.isoformat()})
    response.headers["Location"] = f"/v1/tokens/{body.name}"
    return TokenCreated(**TokenOut.of(store.get_token(c.sessions, body.name)).model_dump(),
                        token=secret)


@router.get("/{name}", response_model=TokenOut, responses={**READ, **NO_TOKEN})
def get(name: TokenName, who: Admin, c: ComponentsDep) -> TokenOut:
    """One token: role, state, last use, expiry, quota (never its secret)."""
    return TokenOut.of(store.get_token(c.sessions, name))


@router.post("/{name}/revoke", response_model=TokenOut,
             responses={**WRITE, **NO_TOKEN, **CONFLICT})
def revoke(name: TokenName, who: Admin, c: ComponentsDep, audit: AdminAuditDep) -> TokenOut:
    """Revoke a token: its next request answers 401 (idempotent; the first time is kept).
    The token the request carries cannot revoke itself (use another admin's, or the CLI)."""
    if name == who.name:
        raise StudyConflict(f"token {name!r} cannot revoke itself: use another admin token "
                            f"or `hpo token revoke {name}`")
    info, changed = store.revoke_token(c.sessions, name)
    if changed:
        audit("token.revoke", name)
    return TokenOut.of(info)


@router.get("/{name}/quota", response_model=QuotaBody, responses={**READ, **NO_TOKEN})
def get_quota(name: TokenName, who: Admin, c: ComponentsDep) -> QuotaBody:
    """The owner's limits (``null``: not set)."""
    return QuotaBody.of(store.get_token(c.sessions, name).quota)


@router.put("/{name}/quota", response_model=QuotaBody, responses={**BODY, **NO_TOKEN})
def put_quota(name: TokenName, body: QuotaBody, who: Admin, c: ComponentsDep,
              audit: AdminAuditDep) -> QuotaBody:
    """Replace the owner's limits: a limit absent or ``null`` is cleared."""
    quota = store.set_quota(c.sessions, name, body.model_dump())
    audit("quota.set", name, QuotaBody.of(quota).model_dump())
    return QuotaBody.of(quota)
