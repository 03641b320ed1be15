"""``GET /v1/audit``: the audit trail (:mod:`service.audit`), for admin tokens."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query

from service import audit as trail
from service.api_errors import documented
from service.deps import Admin, ComponentsDep
from service.schemas import Page
from service.token_schemas import AuditEntry

router = APIRouter(prefix="/v1/audit", tags=["audit"])

Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="items to skip")]
Actor = Annotated[str | None, Query(max_length=64, pattern=r"^[^\x00-\x1f\x7f]*$",
                                    description="only this actor's changes")]
Action = Annotated[str | None, Query(max_length=32, pattern=r"^[a-z.]*$",
                                     description="only this action (study.create, ...)")]


@router.get("", response_model=Page[AuditEntry], responses=documented(401, 403, 422, 503))
def list_audit(who: Admin, c: ComponentsDep, offset: Offset = 0, limit: Limit = 50,
               actor: Actor = None, action: Action = None) -> Page[AuditEntry]:
    """Who created, stopped and deleted studies, made and revoked tokens and set quotas:
    newest first."""
    rows, total = trail.entries(c.sessions, offset, limit, actor, action)
    return Page[AuditEntry](items=[AuditEntry.of(r) for r in rows], total=total,
                            offset=offset, limit=limit)
