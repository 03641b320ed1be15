"""The service's commands of the ``hpo`` CLI, added through the entry-point group ``hpo.cli``.

    hpo serve [--host H] [--port P]
    hpo token create NAME [--role admin|member|viewer] [--expires-in 30d]   (service.cli_tokens)
    hpo token list | revoke NAME | quota NAME [--max-gpus G ...]
    hpo submit SPEC [--wait]       hpo status NAME     hpo trials NAME     hpo list
    hpo stop NAME                  hpo best NAME
    hpo model NAME [--trial N] [-o FILE]                                      (service.cli_models)

Client commands talk to ``--url`` / ``HPO_URL`` with ``--token`` / ``HPO_TOKEN``.
Exit status: 0 done (``submit --wait``: the study COMPLETED); 1 the service
answered an error or the study FAILED; 2 invalid spec or option; 3 the study
was STOPPED. Only typer and rich load with this module: FastAPI, Ray and
httpx are imported inside the commands, so ``hpo run`` stays light.
"""

from __future__ import annotations

import contextlib
import logging
import os
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

# an error is one line, however long; no markup or emoji codes read in users' text (hpo.cli)
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False)
out = Console(markup=False, emoji=False)


def _service_url(value: str) -> str:
    """``--url`` / ``HPO_URL``: an http(s) address with a host (``localhost:8000`` would be
    read as scheme ``localhost`` and fail later as "unreachable"); no spaces or control
    characters (a CRLF ``.env`` file's ``\r``)."""
    from urllib.parse import urlsplit

    import httpx

    from service.client import shown

    # both parsers: urlsplit refuses ports out of range (httpx takes 99999 and -1), httpx
    # what it would refuse at the first request
    example = "e.g. http://127.0.0.1:8000 (--url or HPO_URL)"
    if any(c.isspace() or not c.isprintable() for c in value):
        raise typer.BadParameter(f"{shown(value)!r} holds a space or a control character; "
                                 + example)
    try:
        parts = urlsplit(value)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
        httpx.URL(value)
    except (ValueError, httpx.InvalidURL) as e:
        raise typer.BadParameter(f"{shown(value)!r} is not an address "
                                 f"({shown(e)}); {example}") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise typer.BadParameter(f"{shown(value)!r} is not an http:// or https:// address "
                                 f"with a host; {example}")
    return value


UrlOpt = Annotated[str, typer.Option("--url", envvar="HPO_URL", callback=_service_url,
                                     help="the service's address")]
TokenOpt = Annotated[str | None, typer.Option("--token", envvar="HPO_TOKEN", show_default=False,
                                              help="API token (hpo token create)")]


def _study_name(value: str) -> str:
    """A study NAME argument: one that no study can have is refused here (exit 2), before
    it reaches a URL (``x/../other`` would name the study ``other``)."""
    from service.client import study_path

    try:
        study_path(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None
    return value


NameArg = Annotated[str, typer.Argument(metavar="NAME", callback=_study_name,
                                        help="the study's name")]
OffsetOpt = Annotated[int, typer.Option(min=0, help="items to skip")]
LimitOpt = Annotated[int, typer.Option(min=1, max=500, help="items to show")]
DEFAULT_URL = "http://127.0.0.1:8000"
TOKEN_HINT = ("set HPO_TOKEN or pass --token; a token comes from `hpo token create NAME` "
              "(add --admin for one that sees every study), run where the service's database "
              "is (same HPO_DATABASE_URL)")
ENDED_TOKEN_HINT = ("this token no longer works: ask an admin for a new one (`hpo token create "
                    "NEWNAME`; a revoked or expired token's name is not reused) and set "
                    "HPO_TOKEN to it")


def register(app: typer.Typer) -> None:
    """Add the service's commands to the ``hpo`` typer app."""
    app.command()(serve)
    from service import cli_tokens  # hpo token create | list | revoke | quota

    cli_tokens.register(app)
    db_app = typer.Typer(help="The service's own tables in HPO_DATABASE_URL (Alembic "
                              "migrations; Optuna migrates its own).", no_args_is_help=True)
    db_app.command("upgrade")(db_upgrade)
    db_app.command("current")(db_current)
    app.add_typer(db_app, name="db")
    for command in (submit, status, trials, stop, best):
        app.command()(command)
    app.command("list")(list_studies)
    from service import cli_models  # hpo model NAME [--trial N] [-o FILE]

    cli_models.register(app)


def serve(host: Annotated[str | None, typer.Option(
              help="address to listen on (else HPO_HOST, default 127.0.0.1)",
              show_default=False)] = None,
          port: Annotated[int | None, typer.Option(
              min=0, max=65535, help="port to listen on (else HPO_PORT, default 8000)",
              show_default=False)]
          = None) -> None:
    """Serve the REST API, the dispatcher and the Optuna dashboard (and a local Ray)."""
    from service import logs
    from service.errors import ServiceError, SettingsError
    from service.server import listen
    from service.server import serve as run_server

    overrides = {k: v for k, v in {"host": host, "port": port}.items() if v is not None}
    settings = _settings(**overrides)
    try:
        sock = listen(settings.host, settings.port)  # first: a taken port fails at once
    except SettingsError as e:  # a host that is no address of this machine
        _error(e, 2)
    except ServiceError as e:  # a port in use
        _error(e, 1)
    try:
        _check_database(settings.database_url)  # before the seconds of starting a local Ray
        logs.configure(settings.log_format)
        if settings.url_warning:  # HPO_HOST 0.0.0.0 or :: without HPO_PUBLIC_URL
            logging.getLogger(__name__).warning(settings.url_warning)
        run_server(settings, sock=sock)
    except SettingsError as e:  # a setting found unusable at start (HPO_RESULTS_DIR)
        _error(e, 2)
    except ServiceError as e:
        _error(e, 1)
    finally:
        sock.close()


def db_upgrade() -> None:
    """Upgrade the service's tables to this version's schema (under a lock; safe to rerun)."""
    from service import migrate

    with _database(_settings()) as engine:
        before, after = migrate.upgrade(engine)
    if before == after:
        out.print(f"the service's tables are at {after}, the newest revision")
    elif before is None:
        out.print(f"created the service's tables at {after}")
    else:
        out.print(f"upgraded the service's tables from {before} to {after}")


def db_current() -> None:
    """The revision of the service's tables (none: not created yet) and the newest one."""
    from hpo.engines import redact
    from service import migrate

    settings = _settings()
    if (missing := _missing_database(settings)) is not None:  # rather than make an empty one
        out.print(f"none: {missing}; newest: {migrate.head()}", highlight=False, soft_wrap=True)
        return
    with _database(settings) as engine:
        revision = migrate.current(engine)
        migrate.check_known(revision)
    out.print(f"{revision or 'none'} (newest: {migrate.head()}) in "
              f"{redact(settings.database_url)}", highlight=False, soft_wrap=True)


def _error(e: Exception | str, code: int) -> NoReturn:
    """Print ``e`` as the command's one-line error and exit with ``code``."""
    err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, markup=True)
    raise typer.Exit(code) from None


def _missing_database(settings) -> str | None:
    """``no database at PATH (HPO_DATABASE_URL)`` when the SQLite file does not exist."""
    from hpo.engines import sqlite_path

    path = sqlite_path(settings.database_url)
    if path is not None and not path.exists():
        return f"no database at {path.resolve()} (HPO_DATABASE_URL)"
    return None


@contextlib.contextmanager
def _database(settings):
    """An engine on the settings' database, opened after :func:`_check_database` and disposed
    after; tables at a revision that needs an upgrade, or that this version does not know
    (``SchemaOutdated``), exit 1 with the reason."""
    from service.db import build_engine
    from service.migrate import SchemaOutdated

    _check_database(settings.database_url)
    engine = build_engine(settings.database_url)
    try:
        yield engine
    except SchemaOutdated as e:
        _error(e, 1)
    finally:
        engine.dispose()


def _settings(**overrides):
    """The service's settings from the environment; a bad value exits 2 naming the variable."""
    from service.errors import SettingsError
    from service.settings import Settings

    try:
        return Settings.from_env(**overrides)
    except SettingsError as e:
        _error(e, 2)


def _check_database(url: str) -> None:
    """Exit 1 with the reason (password hidden) when the database cannot be opened."""
    from hpo.errors import StorageError
    from hpo.storage import open_storage

    try:
        open_storage(url).engine.dispose()
    except StorageError as e:
        _error(e, 1)


def _client(url: str, token: str | None):
    from service.client import Client

    return Client(url, token, on_wait=lambda message: err.print(message, highlight=False))


def _fail(e) -> None:
    """Print an ``ApiError`` and exit 2 (invalid input) or 1."""
    answer = f"{e.status} {e.code}" if e.status else f"no answer: {e.code}"
    err.print(f"[bold red]error[/] ({escape(answer)}): {escape(str(e))}", highlight=False,
              markup=True)
    for d in e.details:
        loc = d["loc"] or "<spec>"
        # a query parameter is the command's option of the same name (`hpo list --status`)
        loc = f"--{loc.removeprefix('query.')}" if loc.startswith("query.") else loc
        err.print(f"  {loc}: {d['msg']}", markup=False)
    if e.status == 401:
        if os.environ.get("HPO_TOKEN", None) == "":
            err.print("HPO_TOKEN is set but empty (did `hpo token create` fail?)",
                      markup=False, highlight=False)
        ended = " was revoked at " in str(e) or " expired at " in str(e)
        err.print(ENDED_TOKEN_HINT if ended else TOKEN_HINT, markup=False, highlight=False)
    raise typer.Exit(2 if e.status in (400, 413, 415, 422) else 1)


def submit(spec_path: Annotated[Path, typer.Argument(metavar="SPEC", exists=True, dir_okay=False,
                                                     help="study spec, YAML or JSON")],
           wait: Annotated[bool, typer.Option(help="show progress until the study ends")] = False,
           url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Submit a study spec to the service; with --wait, follow it and print the best trial."""
    from service.client import ApiError

    client = _client(url, token)
    try:
        study = client.submit(spec_path)
        err.print(f"study {study['name']} {study['status']} ({study['n_trials']} trials); "
                  f"dashboard: {url.rstrip('/')}{study['dashboard_url'] or '/dashboard'}",
                  soft_wrap=True, highlight=False)
        if not wait:
            return
        from service.progress import follow

        study = follow(client, study["name"], err)
    except ApiError as e:
        _fail(e)
    if study.get("stop_reason"):
        err.print(f"stopped before its budget: {study['stop_reason']}", markup=False,
                  soft_wrap=True, highlight=False)
    _print_best(study)
    _exit_for(study)


def status(name: NameArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """A study's status, progress, trial counts, best trial and device-seconds."""
    from service.client import ApiError

    try:
        study = _client(url, token).study(name)
    except ApiError as e:
        _fail(e)
    c = study["counts"]
    table = Table(show_header=False, box=None)
    for key, value in [("study", study["name"]), ("status", study["status"]),
                       ("progress", f"{study['progress']['finished']}/{study['n_trials']}"),
                       ("trials", f"{c['complete']} complete, {c['pruned']} pruned, "
                                  f"{c['failed']} failed, {c['running']} running"),
                       ("device-seconds", f"{study['device_seconds']:.1f}"),
                       ("stop requested", str(study["stop_requested"]).lower())]:
        table.add_row(key, value)
    if study.get("waiting_for"):
        table.add_row("waiting for", study["waiting_for"])
    if study.get("quota"):
        table.add_row("quota", _quota_line(study["quota"]))
    if study["error"]:
        table.add_row("error", study["error"])
    if study.get("stop_reason"):
        table.add_row("stopped early", study["stop_reason"])
    if not study["best_trials"] and c["complete"] and study["spec"].get("constraints"):
        table.add_row("best", "none: every complete trial breaks a constraint")
    out.print(table)
    _print_best(study)


def _quota_line(quota: dict) -> str:
    """The owner's use against its limits: ``trials 1/1, GPUs 0/-, ...`` (``-``: no limit)."""
    lim, use = quota["limits"], quota["use"]

    def of(limit) -> str:
        return "-" if limit is None else f"{limit:g}"

    return (f"trials {use['running_trials']}/{of(lim['max_running_trials'])}, "
            f"GPUs {use['gpus']:g}/{of(lim['max_gpus'])}, "
            f"device-s 24h {use['device_seconds_24h']:.0f}/{of(lim['device_seconds_per_day'])}, "
            f"total {use['device_seconds_total']:.0f}/{of(lim['device_seconds_total'])}")


def list_studies(status_filter: Annotated[str | None, typer.Option(
                     "--status", help="only studies of this status (QUEUED, RUNNING, ...)")]
                 = None, offset: OffsetOpt = 0,
                 limit: LimitOpt = 50,
                 url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """The studies this token sees, newest first: status, progress, task and owner."""
    from service.client import ApiError

    try:
        page = _client(url, token).studies(status_filter, offset, limit)
    except ApiError as e:
        _fail(e)
    table = Table("study", "status", "progress", "task", "owner", "created",
                  header_style="bold")
    for s in page["items"]:
        table.add_row(s["name"], s["status"], f"{s['progress']['finished']}/{s['n_trials']}",
                      s["task"], s["owner"] or "", s["created_at"][:19].replace("T", " "))
    out.print(table)
    err.print(f"studies {offset}-{offset + len(page['items'])} of {page['total']}")


def trials(name: NameArg, offset: OffsetOpt = 0,
           limit: LimitOpt = 50,
           url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """A page of a study's trials: state, value (each objective's), parameters, who stopped
    it, and whether it breaks a constraint."""
    from service.client import ApiError

    try:
        page = _client(url, token).trials(name, offset, limit)
    except ApiError as e:
        _fail(e)
    table = Table("#", "state", "value", "params", "note", header_style="bold")
    for t in page["items"]:
        attrs = t["user_attrs"]
        note = attrs.get("fail_reason") or (f"stopped by {attrs['stopped_by']}"
                                             if attrs.get("stopped_by") else "")
        if t.get("feasible") is False:  # it breaks a constraint: never the best trial
            note = f"infeasible; {note}" if note else "infeasible"
        values = t.get("values") or ([] if t["value"] is None else [t["value"]])
        value = ", ".join(f"{v:.6g}" if isinstance(v, float) else str(v) for v in values)
        params = ", ".join(f"{k}={_short(v)}" for k, v in t["params"].items())
        note = note if len(note) <= 60 else note[:59] + "…"  # (REST has the whole text)
        table.add_row(str(t["number"]), t["state"], value, params, note)
    out.print(table)
    err.print(f"trials {offset}-{offset + len(page['items'])} of {page['total']}")


def stop(name: NameArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """Stop a study: its running trials end within seconds."""
    from service.client import ApiError

    try:
        study = _client(url, token).stop(name)
    except ApiError as e:
        _fail(e)
    out.print(f"study {name}: {study['status']}"
              f"{' (stopping)' if study['status'] == 'RUNNING' else ''}")


def best(name: NameArg, url: UrlOpt = DEFAULT_URL, token: TokenOpt = None) -> None:
    """The best trial of a study (the Pareto front for several objectives)."""
    from service.client import ENDED, ApiError

    try:
        study = _client(url, token).study(name)
    except ApiError as e:
        _fail(e)
    if not study["best_trials"]:
        feasible = " and feasible" if study["spec"].get("constraints") else ""
        yet = "" if study["status"] in ENDED else " yet"
        err.print(f"study {name} has no complete{feasible} trial{yet}")
        raise typer.Exit(1)
    _print_best(study)


def _print_best(study: dict) -> None:
    """The best trial, or for several objectives the Pareto front (as ``hpo run`` ends)."""
    from service.client import ENDED, objective_metrics

    metrics = objective_metrics(study)
    front = len(metrics) > 1

    c = study["counts"]  # (a constrained study's complete trials: `best none` says why)
    if not study["best_trials"] and not (c["complete"] and study["spec"].get("constraints")):
        out.print("no complete trial" + ("" if study["status"] in ENDED else " yet"),
                  highlight=False)
    if front and study["best_trials"]:
        out.print(f"Pareto front: {len(study['best_trials'])} trial(s)", highlight=False)
    for t in study["best_trials"]:
        values = ", ".join(f"{m} = {_short(v)}" for m, v in zip(metrics, t["values"] or [],
                                                                strict=False))
        out.print(f"  #{t['number']}: {values}" if front else
                  f"best trial #{t['number']}: {values}", highlight=False)
        for key, value in t["params"].items():
            out.print(f"{'    ' if front else '  '}{key} = {value!r}", highlight=False)


def _short(value) -> str:
    return f"{value:.6g}" if isinstance(value, float) else str(value)


def _exit_for(study: dict) -> None:
    if study["status"] == "FAILED":
        err.print(f"[bold red]study failed:[/] {escape(str(study['error']))}", highlight=False,
                  markup=True)
        raise typer.Exit(1)
    if study["status"] == "STOPPED":
        raise typer.Exit(3)
