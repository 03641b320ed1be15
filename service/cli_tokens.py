"""``hpo token ...``: the service's tokens and quotas, in its database (HPO_DATABASE_URL).

    hpo token create NAME [--role admin|member|viewer] [--admin] [--expires-in 30d]
    hpo token list
    hpo token revoke NAME
    hpo token quota NAME [--max-running-trials N] [--max-gpus G]
                         [--device-seconds-per-day S] [--device-seconds-total S]

These run where the database is, without the service; each change is written to the
audit trail (:mod:`service.audit`) with the local user as actor and ``cli`` as address.
Exit status: 0 done; 1 the database cannot be used; 2 an invalid argument or option (the
message names it), a taken or unknown name.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from service.cli import _database, _error, _missing_database, _settings, err

LimitOpt = Annotated[str | None, typer.Option(
    show_default=False, metavar="N|none", help="a limit >= 0; none clears it")]


def register(app: typer.Typer) -> None:
    """Add ``hpo token`` and its commands to the ``hpo`` typer app."""
    token_app = typer.Typer(help="API tokens of the service, their roles and quotas.",
                            no_args_is_help=True)
    token_app.command("create")(token_create)
    token_app.command("list")(token_list)
    token_app.command("revoke")(token_revoke)
    token_app.command("quota")(token_quota)
    app.add_typer(token_app, name="token")


def token_create(name: Annotated[str, typer.Argument(help="a name for the token's owner")],
                 role: Annotated[str | None, typer.Option(
                     metavar="admin|member|viewer", show_default=False,
                     help="admin: every study, tokens, audit; member (default): its own "
                          "studies; viewer: reads only")] = None,
                 admin: Annotated[bool, typer.Option(help="the same as --role admin")]
                 = False,
                 expires_in: Annotated[str | None, typer.Option(
                     metavar="DURATION", show_default=False,
                     help="expire after 90s, 15m, 12h or 30d; default never")] = None) -> None:
    """Create an API token in the database (HPO_DATABASE_URL) and print it once."""
    from service import audit, migrate
    from service.auth import create_token, parse_role
    from service.db import session_factory, utcnow
    from service.errors import TokenExists
    from service.tokens import parse_duration

    try:
        role = parse_role(admin, role)
        expires_at = utcnow() + parse_duration(expires_in) if expires_in is not None else None
    except ValueError as e:
        _error(str(e).replace("role must", "--role must"), 2)
    settings = _settings()
    with _database(settings) as engine:
        migrate.prepare(engine, auto=settings.migrate_on_start)
        sessions = session_factory(engine)
        try:
            token = create_token(sessions, name, role=role, expires_at=expires_at)
        except (ValueError, TokenExists) as e:
            _error(e, 2)
        audit.record(sessions, audit.cli_actor(), "token.create", name, audit.CLI_ADDRESS,
                     {"role": role.value, "expires_at": expires_at and expires_at.isoformat()})
    until = f", expires {expires_at:%Y-%m-%d %H:%M} UTC" if expires_at else ""
    err.print(f"token {name!r} ({role.value}{until}) created; it is shown only once:",
              highlight=False)
    print(token)


def token_list() -> None:
    """The tokens in the database (HPO_DATABASE_URL): name, role, created, last used (within a
    minute), expiry, revocation and quota. Tokens themselves are never stored, so never
    shown."""
    from service import migrate
    from service.db import session_factory
    from service.tokens import list_tokens

    settings = _settings()
    if (missing := _missing_database(settings)) is not None:
        _error(missing, 1)
    infos = []
    with _database(settings) as engine:
        if migrate.current(engine) is not None:  # else no service tables yet: no tokens
            migrate.prepare(engine, auto=settings.migrate_on_start)  # outdated: exit 1
            infos, _ = list_tokens(session_factory(engine))
    table = Table("name", "role", "created", "last used", "expires", "revoked", "quota",
                  header_style="bold")
    for t in infos:
        expires = _when(t.expires_at) + (" (expired)" if t.state == "expired" else "")
        table.add_row(t.name, t.role, _when(t.created_at), _when(t.last_used_at), expires,
                      _when(t.revoked_at), t.quota.describe())
    # a pipe or a test gets every column on one line; a terminal wraps to its width
    Console(width=None if sys.stdout.isatty() else 200, markup=False, emoji=False).print(table)


def token_revoke(name: Annotated[str, typer.Argument(help="the token's name")]) -> None:
    """Revoke a token: its next request (dashboard cookie included) answers 401. Its row
    stays: its studies keep naming their owner."""
    from service import audit
    from service.tokens import revoke_token

    with _sessions() as sessions:
        info, changed = _or_exit(revoke_token, sessions, name)
        if changed:
            audit.record(sessions, audit.cli_actor(), "token.revoke", name, audit.CLI_ADDRESS)
    state = "revoked" if changed else "was already revoked"
    err.print(f"token {name!r} {state} at {info.revoked_at:%Y-%m-%d %H:%M:%S} UTC",
              highlight=False)


def token_quota(name: Annotated[str, typer.Argument(help="the token's name")],
                max_running_trials: LimitOpt = None, max_gpus: LimitOpt = None,
                device_seconds_per_day: LimitOpt = None,
                device_seconds_total: LimitOpt = None) -> None:
    """Set the limits of a token's owner (the others keep theirs; none clears one) and print
    the quota; with no option, print it. A study over its owner's quota waits."""
    from service import audit
    from service.tokens import get_token, set_quota

    given = {"max_running_trials": max_running_trials, "max_gpus": max_gpus,
             "device_seconds_per_day": device_seconds_per_day,
             "device_seconds_total": device_seconds_total}
    changes = {field: _limit(field, text) for field, text in given.items() if text is not None}
    with _sessions() as sessions:
        if changes:
            quota = _or_exit(set_quota, sessions, name, changes)
            audit.record(sessions, audit.cli_actor(), "quota.set", name, audit.CLI_ADDRESS,
                         dataclasses.asdict(quota))
        else:
            quota = _or_exit(get_token, sessions, name).quota
    print(f"{name}: {quota.describe()}")


def _limit(field: str, text: str) -> float | None:
    """A quota option's value: ``none`` (clear) or a number >= 0; exits 2 naming the flag."""
    from service.tokens import check_limit

    flag = "--" + field.replace("_", "-")
    if text.strip().lower() == "none":
        return None
    try:
        value = float(text)
        check_limit(field, value)
    except ValueError:
        from service.tokens import QUOTA_MAX

        whole = " whole" if field == "max_running_trials" else ""
        _error(f"{flag} must be a{whole} number in [0, {QUOTA_MAX[field]:g}], or none to clear "
               f"it; got {text!r}", 2)
    return int(value) if field == "max_running_trials" else value


@contextlib.contextmanager
def _sessions():
    """Sessions on the settings' database, its tables made (new) or checked (outdated: exit 1)
    first; a SQLite file that does not exist exits 1."""
    from service import migrate
    from service.db import session_factory

    settings = _settings()
    if (missing := _missing_database(settings)) is not None:
        _error(missing, 1)
    with _database(settings) as engine:
        migrate.prepare(engine, auto=settings.migrate_on_start)
        yield session_factory(engine)


def _or_exit(function, *args):
    """``function(*args)``; an unknown token exits 2 with the message."""
    from service.errors import TokenNotFound

    try:
        return function(*args)
    except TokenNotFound as e:
        _error(e, 2)


def _when(value) -> str:
    return f"{value:%Y-%m-%d %H:%M}" if value is not None else "-"
