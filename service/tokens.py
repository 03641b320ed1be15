"""Managing tokens (issue 15.1, 15.2): list, revoke, and the per-owner quotas an admin sets.

Shared by the CLI (``hpo token ...``, :mod:`service.cli_tokens`) and the REST API
(``/v1/tokens``, :mod:`service.routers.tokens`). Secrets never leave
:func:`service.auth.create_token`: nothing here reads or returns one. Enforcing the
quotas is the dispatcher's business; this module only stores them.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from service.db import QuotaRow, TokenRow, utcnow
from service.errors import TokenNotFound

QUOTA_FIELDS = ("max_running_trials", "max_gpus", "device_seconds_per_day",
                "device_seconds_total")
_DURATION = re.compile(r"^\s*([0-9]{1,9})\s*([smhd])\s*$")
MAX_EXPIRES_IN_S = 10 * 365 * 86400  # ten years, over REST and the CLI alike
# the largest value of each quota limit, over REST and the CLI alike
QUOTA_MAX = {"max_running_trials": 2**31 - 1, "max_gpus": 1e9,
             "device_seconds_per_day": 1e15, "device_seconds_total": 1e15}
_UNIT_S = {"s": 1, "m": 60, "h": 3600, "d": 86400}


@dataclasses.dataclass(frozen=True)
class Quota:
    """An owner's limits; ``None`` is not set. Running trials and GPUs are counts held at
    once (GPUs may be fractional), device-seconds are per rolling 24 h and in total."""

    max_running_trials: int | None = None
    max_gpus: float | None = None
    device_seconds_per_day: float | None = None
    device_seconds_total: float | None = None

    def is_empty(self) -> bool:
        return all(getattr(self, f) is None for f in QUOTA_FIELDS)

    def describe(self) -> str:
        """``max_gpus=2, ...`` of the limits set, ``-`` when none is."""
        return ", ".join(f"{f}={_number(getattr(self, f))}" for f in QUOTA_FIELDS
                         if getattr(self, f) is not None) or "-"


@dataclasses.dataclass(frozen=True)
class TokenInfo:
    """A token as listed: never its secret."""

    name: str
    role: str
    created_at: dt.datetime
    last_used_at: dt.datetime | None
    expires_at: dt.datetime | None
    revoked_at: dt.datetime | None
    quota: Quota

    @property
    def state(self) -> str:
        """``revoked``, ``expired`` or ``active`` (now)."""
        if self.revoked_at is not None:
            return "revoked"
        if self.expires_at is not None and self.expires_at <= utcnow():
            return "expired"
        return "active"


def parse_duration(text: str) -> dt.timedelta:
    """``30d``, ``12h``, ``15m``, ``90s`` as a duration (a positive integer and one unit).

    Raises:
        ValueError: anything else, or zero; the message names ``--expires-in``.
    """
    match = _DURATION.match(text or "")
    if match is None or int(match.group(1)) == 0:
        raise ValueError(f"--expires-in must be a positive whole number with a unit s, m, h "
                         f"or d (e.g. 30d), got {text!r}")
    seconds = int(match.group(1)) * _UNIT_S[match.group(2)]
    if seconds > MAX_EXPIRES_IN_S:
        raise ValueError(f"--expires-in must be at most ten years ({MAX_EXPIRES_IN_S // 86400}d), "
                         f"got {text!r}")
    return dt.timedelta(seconds=seconds)


def list_tokens(sessions: sessionmaker, offset: int = 0,
                limit: int | None = None) -> tuple[list[TokenInfo], int]:
    """A page of the tokens by creation time, and how many there are in all."""
    with sessions() as session:
        total = session.execute(sa.select(sa.func.count()).select_from(TokenRow)).scalar_one()
        query = (sa.select(TokenRow, QuotaRow).outerjoin(QuotaRow,
                                                         QuotaRow.owner_id == TokenRow.id)
                 .order_by(TokenRow.created_at, TokenRow.id).offset(offset).limit(limit))
        rows = session.execute(query).all()
    return [_info(token, quota) for token, quota in rows], total


def get_token(sessions: sessionmaker, name: str) -> TokenInfo:
    """The token named ``name``.

    Raises:
        TokenNotFound: no such token.
    """
    with sessions() as session:
        token = _row(session, name)
        return _info(token, session.get(QuotaRow, token.id))


def revoke_token(sessions: sessionmaker, name: str) -> tuple[TokenInfo, bool]:
    """Revoke ``name`` from its next request on; the token, and whether this call revoked
    it (``False``: it was revoked already, and keeps its first revocation time).

    Raises:
        TokenNotFound: no such token.
    """
    with sessions.begin() as session:
        token = _row(session, name)
        changed = token.revoked_at is None
        if changed:
            token.revoked_at = utcnow()
        info = _info(token, session.get(QuotaRow, token.id))
    return info, changed


def set_quota(sessions: sessionmaker, name: str, changes: dict[str, float | None]) -> Quota:
    """Set the limits in ``changes`` (a limit ``None`` clears it; others keep their value);
    the quota as stored.

    Raises:
        TokenNotFound: no such token.
        ValueError: an unknown field, or a negative or non-finite limit (named).
    """
    for field, value in changes.items():
        check_limit(field, value)
    with sessions.begin() as session:
        token = _row(session, name)
        row = session.get(QuotaRow, token.id)
        if row is None:
            row = QuotaRow(owner_id=token.id)
            session.add(row)
        for field, value in changes.items():
            setattr(row, field, int(value) if field == "max_running_trials"
                    and value is not None else value)
        return _quota(row)


def check_limit(field: str, value: float | None) -> None:
    """Raises ValueError naming ``field`` when it is not a quota field or ``value`` is not
    ``None``, a finite number >= 0 (a whole number for ``max_running_trials``)."""
    if field not in QUOTA_FIELDS:
        raise ValueError(f"unknown quota field {field!r}; one of {', '.join(QUOTA_FIELDS)}")
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not (
            0 <= value <= QUOTA_MAX[field]):
        raise ValueError(f"{field} must be a number in [0, {QUOTA_MAX[field]:g}] (or none), "
                         f"got {value!r}")
    if field == "max_running_trials" and value != int(value):
        raise ValueError(f"{field} must be a whole number, got {value!r}")


def _row(session: Session, name: str) -> TokenRow:
    token = session.execute(sa.select(TokenRow).where(TokenRow.name == name)
                            ).scalar_one_or_none()
    if token is None:
        raise TokenNotFound(f"no token named {name!r}")
    return token


def _quota(row: QuotaRow | None) -> Quota:
    if row is None:
        return Quota()
    return Quota(**{f: getattr(row, f) for f in QUOTA_FIELDS})


def _info(token: TokenRow, quota: QuotaRow | None) -> TokenInfo:
    return TokenInfo(name=token.name, role=token.role, created_at=token.created_at,
                     last_used_at=token.last_used_at, expires_at=token.expires_at,
                     revoked_at=token.revoked_at, quota=_quota(quota))


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"
