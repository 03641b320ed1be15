"""API tokens: created once, stored as a SHA-256 hash, resolved to a :class:`Principal`.

A token is ``hpo_`` followed by 43 URL-safe characters (256 random bits), so
a plain SHA-256 (no salt, no slow hash) is safe to store and look up by: the
secret cannot be guessed from it. A request names its token as
``Authorization: Bearer TOKEN``; the dashboard also accepts the ``hpo_token``
cookie that its login form sets (see :mod:`service.dashboard_login`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
import secrets

import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.orm import sessionmaker

from service.db import TokenRow
from service.errors import NotAuthenticated, TokenExists

TOKEN_PREFIX = "hpo_"
TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
COOKIE_NAME = "hpo_token"


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request acts for: a token (``token_id``), or an anonymous reader (``None``)."""

    token_id: int | None
    name: str
    is_admin: bool = False


ANONYMOUS = Principal(token_id=None, name="anonymous")


def hash_token(token: str) -> str:
    """Hex SHA-256 of a token (64 characters)."""
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(sessions: sessionmaker, name: str, *, admin: bool = False) -> str:
    """Create a token named ``name``; return the token itself (it is not stored, only its hash).

    Raises:
        ValueError: ``name`` does not match ``TOKEN_NAME_PATTERN``.
        TokenExists: a token of that name exists.
    """
    if not re.match(TOKEN_NAME_PATTERN, name):
        raise ValueError(f"token name must match {TOKEN_NAME_PATTERN}, got {name!r}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with sessions() as session:
        session.add(TokenRow(name=name, token_hash=hash_token(token), is_admin=admin))
        try:
            session.commit()
        except sqlalchemy.exc.IntegrityError:
            raise TokenExists(f"a token named {name!r} exists") from None
    return token


def resolve(sessions: sessionmaker, token: str | None) -> Principal:
    """The principal of ``token``.

    Raises:
        NotAuthenticated: no token, or a token this service does not know.
    """
    if not token:
        raise NotAuthenticated("this needs a token: Authorization: Bearer TOKEN")
    with sessions() as session:
        row = session.execute(sa.select(TokenRow).where(
            TokenRow.token_hash == hash_token(token))).scalar_one_or_none()
    if row is None:
        raise NotAuthenticated("unknown token")
    return Principal(token_id=row.id, name=row.name, is_admin=row.is_admin)


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header value, or ``None``."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None
