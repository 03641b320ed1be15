"""The audit trail (issue 15.5): who did what, when, from which address.

Every study create, stop and delete, every token creation and revocation and every
quota change is written to ``hpo_audit`` and logged by the logger ``service.audit``
(one INFO line each). ``actor`` is the token's name (a CLI change: the local user's
name), ``address`` the client's IP address as the server sees it (``cli`` for the
CLI). The API's admins read the table at ``GET /v1/audit``.

Actions: ``study.create``, ``study.stop``, ``study.delete``, ``token.create``,
``token.revoke``, ``quota.set``.
"""

from __future__ import annotations

import dataclasses
import getpass
import logging

import sqlalchemy as sa
from sqlalchemy.orm import Session, sessionmaker

from hpo.errors import printable
from service.db import AuditRow, autocommit, utcnow

log = logging.getLogger("service.audit")

CLI_ADDRESS = "cli"
ACTIONS = ("study.create", "study.stop", "study.delete", "token.create", "token.revoke",
           "quota.set")


def record(sessions: sessionmaker | Session, actor: str, action: str, target: str,
           address: str | None, detail: dict | None = None) -> None:
    """Write one audit row and its log line.

    Args:
        sessions: a session factory (the row is committed here), or an open session (the
            row joins its transaction; the caller commits).
        actor: who: a token's name (at most 64 characters).
        action: one of :data:`ACTIONS`.
        target: what: a study's or a token's name (at most 200 characters).
        address: the client's address, ``"cli"`` for the CLI, ``None`` when unknown.
        detail: JSON-able facts of the change (a quota's new limits, a token's role).

    Raises:
        ValueError: ``action`` is not one of :data:`ACTIONS`.
        sqlalchemy.exc.SQLAlchemyError: the row could not be written (it is logged first).
    """
    change = Change(actor, action, target, address, detail)  # checks the action
    change.log()
    # a Core INSERT (the ORM's unit of work, add and flush, cost 4 times its round trip),
    # built once and given its values as parameters (one built per call cost a third more)
    row = change.row()
    if isinstance(sessions, Session):
        sessions.connection().execute(_INSERT, row)
        return
    with autocommit(sessions) as session:  # one INSERT: no transaction of its own on PG
        session.connection().execute(_INSERT, row)
        session.commit()


_INSERT = sa.insert(AuditRow.__table__)


@dataclasses.dataclass(frozen=True)
class Change:
    """One change's audit row, written in the change's own statement or transaction
    (:func:`insert_for`, :meth:`record`): stored together with the change, or not at all."""

    actor: str
    action: str
    target: str
    address: str | None
    detail: dict | None = None

    def __post_init__(self) -> None:
        if self.action not in ACTIONS:
            raise ValueError(f"unknown audit action {self.action!r}")

    def row(self) -> dict[str, object]:
        """The row's values (``at`` now), cut to the columns' lengths; the address with its
        control characters escaped (a trusted proxy's ``X-Forwarded-For`` is any text)."""
        return {"at": utcnow(), "actor": self.actor[:64], "action": self.action,
                "target": self.target[:200],
                "address": _escaped_prefix(self.address, 64) if self.address else None,
                "detail": self.detail}

    def params(self) -> dict[str, object]:
        """The parameters of :func:`insert_for`'s statement."""
        return {f"audit_{k}": v for k, v in self.row().items()}

    def record(self, session: Session) -> None:
        """Write the row in ``session``'s transaction (the caller commits), then its log line."""
        session.connection().execute(_INSERT, self.row())
        self.log()

    def log(self) -> None:
        """The change's log line."""
        log.info("audit: %s %s %s from %s%s", printable(self.actor), self.action,
                 printable(self.target), printable(self.address or "?"),
                 f" {self.detail}" if self.detail else "")


def _escaped_prefix(text: str, limit: int) -> str:
    """``text`` with control characters escaped (:func:`hpo.errors.printable`), cut to at
    most ``limit`` characters between two escapes, never inside one."""
    escaped = printable(text)
    if len(escaped) <= limit:
        return escaped
    kept = ""
    for char in text:
        shown = printable(char)
        if len(kept) + len(shown) > limit:
            return kept
        kept += shown
    return kept


def insert_for(changed: sa.CTE) -> sa.CTE:
    """PostgreSQL: a data-modifying ``WITH`` that inserts a :class:`Change`'s row (bound by
    :meth:`Change.params`) once for each row of ``changed``: added to the statement that
    makes the change, the row is written exactly when the change is, in the same round
    trip."""
    table = AuditRow.__table__
    values = [sa.bindparam(f"audit_{c}", type_=table.c[c].type)
              for c in ("at", "actor", "action", "target", "address", "detail")]
    return (sa.insert(table).from_select(
        ["at", "actor", "action", "target", "address", "detail"],
        sa.select(*values).select_from(changed)).cte(f"audit_{changed.name}"))


@dataclasses.dataclass(frozen=True)
class Auditor:
    """Records the changes of one request in the audit trail: its caller is the actor, its
    client's host the address."""

    sessions: sessionmaker
    actor: str
    address: str | None

    def __call__(self, action: str, target: str, detail: dict | None = None) -> None:
        """Record a change that has been made (:func:`record`): a row that cannot be written
        is logged (the log line is written first) and does not turn the change's answer
        into an error."""
        try:
            record(self.sessions, self.actor, action, target, self.address, detail)
        except sa.exc.SQLAlchemyError:
            log.exception("audit row of %s %s not written", action, target)

    def change(self, action: str, target: str, detail: dict | None = None) -> Change:
        """The row of a change that writes it itself, with the change (:class:`Change`)."""
        return Change(self.actor, action, target, self.address, detail)


def cli_actor() -> str:
    """The actor of a CLI change: the local user's name (``cli`` when it has none)."""
    try:
        return getpass.getuser() or CLI_ADDRESS
    except (KeyError, OSError):  # no name for this uid (a container's)
        return CLI_ADDRESS


def entries(sessions: sessionmaker, offset: int, limit: int, actor: str | None = None,
            action: str | None = None) -> tuple[list[AuditRow], int]:
    """A page of the audit rows, newest first, optionally of one actor and one action; and
    how many match in all."""
    where = [c for c in (AuditRow.actor == actor if actor is not None else None,
                         AuditRow.action == action if action is not None else None)
             if c is not None]
    with sessions() as session:
        total = session.execute(sa.select(sa.func.count()).select_from(AuditRow)
                                .where(*where)).scalar_one()
        rows = session.execute(sa.select(AuditRow).where(*where)
                               .order_by(AuditRow.at.desc(), AuditRow.id.desc())
                               .offset(offset).limit(limit)).scalars().all()
    return list(rows), total
