"""API tokens: created once, stored as a SHA-256 hash, resolved to a :class:`Principal`.

A token is ``hpo_`` followed by 43 URL-safe characters (256 random bits), so
a plain SHA-256 (no salt, no slow hash) is safe to store and look up by: the
secret cannot be guessed from it. A request names its token as
``Authorization: Bearer TOKEN``; the dashboard also accepts the ``hpo_session``
cookie that its login form sets (see :mod:`service.dashboard_login`): a session id
of its own (:func:`create_session`), stored the same way, never the token. Every
request resolves its token again (:func:`resolve`, :func:`resolve_session`), so a
token revoked or expired is refused from the next request on, a dashboard session
included.

A token has a role (issue 15.1, :class:`service.db.Role`): ``admin`` (every
owner's studies, the tokens, the audit), ``member`` (its own studies) or
``viewer`` (reads only: its writes answer 403).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import logging
import re
import secrets

import sqlalchemy as sa
import sqlalchemy.exc
from sqlalchemy.orm import sessionmaker

from service.db import DashboardSessionRow, Role, TokenRow, autocommit, utcnow
from service.errors import Forbidden, NotAuthenticated, TokenExists

TOKEN_PREFIX = "hpo_"
TOKEN_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.@-]{0,63}$"
COOKIE_NAME = "hpo_session"  # the dashboard's session (service.dashboard_login)
SESSION_PREFIX = "hpo_session_"  # + 43 URL-safe characters; hidden in logs as tokens are
MAX_SESSIONS_PER_TOKEN = 100  # a token's newest dashboard sessions; a login ends the oldest
LAST_USED_EVERY_S = 60  # last_used_at is written at most this often per token

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Principal:
    """Who a request acts for: a token (``token_id``), or an anonymous reader (``None``).

    ``role`` and ``is_admin`` are kept consistent: give either (``is_admin=True`` means
    ``role=Role.ADMIN``; neither means a member).

    Raises:
        ValueError: ``is_admin=True`` with a role other than admin.
    """

    token_id: int | None
    name: str
    is_admin: bool = False
    role: Role | None = None

    def __post_init__(self) -> None:
        if self.role is None:
            object.__setattr__(self, "role", Role.ADMIN if self.is_admin else Role.MEMBER)
        elif self.is_admin and self.role != Role.ADMIN:
            raise ValueError(f"is_admin=True with role={self.role!r}")
        object.__setattr__(self, "role", Role(self.role))
        object.__setattr__(self, "is_admin", self.role == Role.ADMIN)

    @property
    def reads_all(self) -> bool:
        """Whether the principal reads every owner's studies: admins, and viewers (read-only
        observers of the whole service: a viewer owns no study of its own to read)."""
        return self.role in (Role.ADMIN, Role.VIEWER)

    @property
    def may_write(self) -> bool:
        """Whether the principal may change anything (every role but ``viewer``)."""
        return self.role != Role.VIEWER


ANONYMOUS = Principal(token_id=None, name="anonymous", role=Role.VIEWER)


def hash_token(token: str) -> str:
    """Hex SHA-256 of a token (64 characters)."""
    return hashlib.sha256(token.encode()).hexdigest()


def check_token_name(name: str) -> str:
    """``name`` when it is a valid token name.

    Raises:
        ValueError: ``name`` does not match ``TOKEN_NAME_PATTERN``.
    """
    if not isinstance(name, str) or not re.fullmatch(TOKEN_NAME_PATTERN, name):
        raise ValueError(f"token name must match {TOKEN_NAME_PATTERN}, got {name!r}")
    return name


def create_token(sessions: sessionmaker, name: str, *, admin: bool = False,
                 role: Role | str | None = None,
                 expires_at: dt.datetime | None = None) -> str:
    """Create a token named ``name``; return the token itself (it is not stored, only its hash).

    Args:
        admin: an alias of ``role=Role.ADMIN``.
        role: ``admin``, ``member`` or ``viewer``; default member (admin with ``admin``).
        expires_at: an aware datetime after which the token answers 401; default never.

    Raises:
        ValueError: ``name`` does not match ``TOKEN_NAME_PATTERN``; an unknown role;
            ``admin=True`` with another role; ``expires_at`` naive.
        TokenExists: a token of that name exists (revoked ones included), or of a name
            that differs only in case (``Alice`` beside ``alice``: audit rows and study
            owners show the name alone).
    """
    check_token_name(name)
    role = parse_role(admin, role)
    if expires_at is not None and expires_at.tzinfo is None:
        raise ValueError("expires_at must carry a time zone")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    with sessions() as session:
        alike = session.execute(sa.select(TokenRow.name).where(
            sa.func.lower(TokenRow.name) == name.lower())).scalars().first()
        if alike is not None:
            raise TokenExists(f"a token named {alike!r} exists" + (
                "" if alike == name else "; names must differ by more than case"))
        session.add(TokenRow(name=name, token_hash=hash_token(token), role=role.value,
                             is_admin=role == Role.ADMIN, expires_at=expires_at))
        try:
            session.commit()
        except sqlalchemy.exc.IntegrityError:  # a concurrent create: the name, or its case
            raise TokenExists(f"a token named {name!r} exists, or one whose name differs "
                              "only in case") from None
    return token


def parse_role(admin: bool, role: Role | str | None) -> Role:
    """The role of ``admin`` (an alias of admin) and ``role`` (default member).

    Raises:
        ValueError: an unknown role, or ``admin`` with another role.
    """
    if role is None:
        return Role.ADMIN if admin else Role.MEMBER
    try:
        role = Role(role)
    except ValueError:
        raise ValueError(f"role must be one of {', '.join(Role)}, got {role!r}") from None
    if admin and role != Role.ADMIN:
        raise ValueError(f"--admin contradicts role {role.value!r}")
    return role


# built once: every request resolves its token (a statement built per call cost a third
# more); in Core, a row of columns rather than an ORM entity (a fifth of the SELECT's CPU)
_TOKENS = TokenRow.__table__
_BY_HASH = sa.select(_TOKENS.c.id, _TOKENS.c.name, _TOKENS.c.role, _TOKENS.c.expires_at,
                     _TOKENS.c.last_used_at, _TOKENS.c.revoked_at).where(
    _TOKENS.c.token_hash == sa.bindparam("hash"))


def resolve(sessions: sessionmaker, token: str | None) -> Principal:
    """The principal of ``token``; notes its use in ``last_used_at`` (at most once every
    ``LAST_USED_EVERY_S`` seconds per token, so that reads stay one SELECT).

    Raises:
        NotAuthenticated: no token, a token this service does not know, a revoked token or
            an expired one (the message says which).
    """
    if not token:
        raise NotAuthenticated("this needs a token: Authorization: Bearer TOKEN")
    with autocommit(sessions) as session:
        row = session.connection().execute(_BY_HASH, {"hash": hash_token(token)}).first()
    if row is None:
        raise NotAuthenticated("unknown token")
    return _principal_of(sessions, row)


def _principal_of(sessions: sessionmaker, row) -> Principal:
    """The principal of a token's row, unless it was revoked or expired (see :func:`resolve`)."""
    now = utcnow()
    if row.revoked_at is not None:
        raise NotAuthenticated(f"token {row.name!r} was revoked at {_when(row.revoked_at)}")
    if row.expires_at is not None and row.expires_at <= now:
        raise NotAuthenticated(f"token {row.name!r} expired at {_when(row.expires_at)}")
    cutoff = now - dt.timedelta(seconds=LAST_USED_EVERY_S)
    if row.last_used_at is None or row.last_used_at < cutoff:
        _note_use(sessions, row.id, now, cutoff)
    return Principal(token_id=row.id, name=row.name, role=Role(row.role))


_SESSIONS = DashboardSessionRow.__table__
_BY_SESSION = sa.select(*_BY_HASH.selected_columns,
                        _SESSIONS.c.expires_at.label("session_expires_at")).select_from(
    _SESSIONS.join(_TOKENS, _SESSIONS.c.token_id == _TOKENS.c.id)).where(
    _SESSIONS.c.session_hash == sa.bindparam("hash"))


def create_session(sessions: sessionmaker, token: str, lifetime: dt.timedelta) -> str:
    """Log ``token`` in to the dashboard: a new session id (``SESSION_PREFIX`` + 43
    URL-safe characters, 256 random bits; only its SHA-256 is stored) that acts for the
    token for ``lifetime``, until :func:`end_session`, or until the token is revoked or
    expires. Sessions that have ended are deleted on the way, and the token's sessions
    beyond its ``MAX_SESSIONS_PER_TOKEN`` newest (a token that logs in without end would
    otherwise grow the table without bound).

    Raises:
        NotAuthenticated: ``token`` is missing, unknown, revoked or expired (as
            :func:`resolve`).
    """
    who = resolve(sessions, token)
    session_id = SESSION_PREFIX + secrets.token_urlsafe(32)
    now = utcnow()
    rows = DashboardSessionRow
    with sessions() as session:
        session.execute(sa.delete(rows).where(rows.expires_at <= now))
        session.add(rows(session_hash=hash_token(session_id), token_id=who.token_id,
                         created_at=now, expires_at=now + lifetime))
        session.flush()
        newest = sa.select(rows.id).where(rows.token_id == who.token_id).order_by(
            rows.id.desc()).limit(MAX_SESSIONS_PER_TOKEN)
        session.execute(sa.delete(rows).where(  # any token could log in without end
            rows.token_id == who.token_id, rows.id.not_in(newest.scalar_subquery())))
        session.commit()
    return session_id


def resolve_session(sessions: sessionmaker, session_id: str | None) -> Principal:
    """The principal of a dashboard session id (the ``hpo_session`` cookie).

    Raises:
        NotAuthenticated: no id, an id no session has (logged out, or an older
            version's cookie), a session that ended, or its token revoked or expired.
    """
    if not session_id:
        raise NotAuthenticated("this needs a token: Authorization: Bearer TOKEN")
    with autocommit(sessions) as session:
        row = session.connection().execute(
            _BY_SESSION, {"hash": hash_token(session_id)}).first()
    if row is None:
        raise NotAuthenticated("unknown dashboard session (logged out?): log in again")
    if row.session_expires_at <= utcnow():
        raise NotAuthenticated(f"the dashboard session ended at "
                               f"{_when(row.session_expires_at)}: log in again")
    return _principal_of(sessions, row)


def end_session(sessions: sessionmaker, session_id: str | None) -> None:
    """End the dashboard session ``session_id`` (a logout); nothing if there is none."""
    if not session_id:
        return
    with sessions() as session:
        session.execute(sa.delete(DashboardSessionRow).where(
            DashboardSessionRow.session_hash == hash_token(session_id)))
        session.commit()


def _note_use(sessions: sessionmaker, token_id: int, now: dt.datetime,
              cutoff: dt.datetime) -> None:
    """Set ``last_used_at``, unless a concurrent request did within the minute; a database
    too busy to take the write does not fail the request."""
    try:
        with autocommit(sessions) as session:
            session.execute(sa.update(TokenRow).where(
                TokenRow.id == token_id,
                sa.or_(TokenRow.last_used_at.is_(None), TokenRow.last_used_at < cutoff))
                .values(last_used_at=now))
            session.commit()
    except sqlalchemy.exc.OperationalError as e:
        log.warning("could not note the use of token %d: %s", token_id, type(e).__name__)


def require_writer(who: Principal) -> Principal:
    """``who`` when it may write.

    Raises:
        Forbidden: ``who`` is a viewer (or anonymous).
    """
    if not who.may_write:
        raise Forbidden(f"token {who.name!r} has the role {who.role.value!r}, which may only "
                        f"read")
    return who


def require_admin(who: Principal) -> Principal:
    """``who`` when it is an admin.

    Raises:
        Forbidden: ``who`` is not an admin (the message names its role).
    """
    if not who.is_admin:
        raise Forbidden(f"this needs an admin token; token {who.name!r} has the role "
                        f"{who.role.value!r}")
    return who


def _when(value: dt.datetime) -> str:
    return f"{value:%Y-%m-%d %H:%M:%S} UTC"


def bearer(header: str | None) -> str | None:
    """The token of an ``Authorization: Bearer TOKEN`` header value, or ``None``."""
    if not header:
        return None
    scheme, _, value = header.partition(" ")
    return value.strip() or None if scheme.lower() == "bearer" else None
