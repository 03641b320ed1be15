"""Request and response bodies of ``/v1/tokens`` and ``/v1/audit`` (admins only).

A token's secret appears in exactly one answer, :class:`TokenCreated` (``POST
/v1/tokens``); no other body has a field for it.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

from service.auth import TOKEN_NAME_PATTERN
from service.db import AuditRow, Role
from service.schemas import UTCDatetime, _Out
from service.tokens import MAX_EXPIRES_IN_S, QUOTA_MAX, Quota, TokenInfo


def _json_number(value: Any) -> Any:
    """``value`` when it is a JSON number or null: pydantic's lax mode would take ``true`` as
    1 and ``"2"`` as 2, and its strict mode refuses ``2.0`` for an integer (JSON Schema's
    integers include it)."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
        raise ValueError("must be a number")
    return value


NUMBER = BeforeValidator(_json_number)


class QuotaBody(BaseModel):
    """An owner's limits; a limit that is absent or ``null`` is not set (no limit). Numbers
    only: ``"2"`` or ``true`` are refused (422), not converted."""

    model_config = ConfigDict(extra="forbid", ser_json_inf_nan="strings")

    max_running_trials: Annotated[int | None, NUMBER] = Field(
        None, ge=0, le=QUOTA_MAX["max_running_trials"], description="trials running at once")
    max_gpus: Annotated[float | None, NUMBER] = Field(
        None, ge=0, le=QUOTA_MAX["max_gpus"], allow_inf_nan=False,
        description="GPUs held at once (the sum of the running trials' resources.gpus)")
    device_seconds_per_day: Annotated[float | None, NUMBER] = Field(
        None, strict=True, ge=0, le=QUOTA_MAX["device_seconds_per_day"], allow_inf_nan=False,
        description="device-seconds per rolling 24 h")
    device_seconds_total: Annotated[float | None, NUMBER] = Field(
        None, strict=True, ge=0, le=QUOTA_MAX["device_seconds_total"], allow_inf_nan=False,
        description="device-seconds in all")

    @classmethod
    def of(cls, quota: Quota) -> QuotaBody:
        return cls(**{k: getattr(quota, k) for k in cls.model_fields})


class TokenIn(BaseModel):
    """A token to create."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=TOKEN_NAME_PATTERN, description="the token owner's name")
    role: Role = Field(Role.MEMBER, description="admin, member or viewer (reads only)")
    expires_in_s: Annotated[int | None, NUMBER] = Field(None, ge=1, le=MAX_EXPIRES_IN_S,
                                     description="seconds until it expires; default never")


class TokenOut(_Out):
    """A token as listed; never its secret."""

    name: str
    role: Role
    state: str = Field(description="active, expired or revoked")
    created_at: UTCDatetime
    last_used_at: UTCDatetime | None = Field(description="within a minute")
    expires_at: UTCDatetime | None
    revoked_at: UTCDatetime | None
    quota: QuotaBody

    @classmethod
    def of(cls, info: TokenInfo) -> TokenOut:
        return cls(name=info.name, role=Role(info.role), state=info.state,
                   created_at=info.created_at, last_used_at=info.last_used_at,
                   expires_at=info.expires_at, revoked_at=info.revoked_at,
                   quota=QuotaBody.of(info.quota))


class TokenCreated(TokenOut):
    """A new token, with its secret: shown this once, stored only as a hash."""

    token: str = Field(description="the secret: send it as Authorization: Bearer TOKEN")


class AuditEntry(_Out):
    """One change: who did what, when, from which address."""

    at: UTCDatetime
    actor: str = Field(description="the token's name; a CLI change: the local user's")
    action: str = Field(description="study.create, study.stop, study.delete, token.create, "
                                    "token.revoke or quota.set")
    target: str = Field(description="the study's or token's name")
    address: str | None = Field(description="the client's address; cli for the CLI")
    detail: dict[str, Any] | None

    @classmethod
    def of(cls, row: AuditRow) -> AuditEntry:
        return cls(at=row.at, actor=row.actor, action=row.action, target=row.target,
                   address=row.address, detail=row.detail)
