"""Settings of the service, read from the environment once (``Settings.from_env``), with
pydantic-settings.

Every knob of the service is a field of :class:`Settings` whose ``validation_alias`` is its
environment variable, with its range; the rest of the package receives a
:class:`Settings` object and never reads the environment itself. The README's settings
table lists the same variables and defaults (``tests/service/test_settings.py`` checks it).
A bad value raises :class:`~service.errors.SettingsError` naming the variable.
"""

from __future__ import annotations

import contextvars
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, SettingsConfigDict

from service.errors import SettingsError

_ENVIRON: contextvars.ContextVar[Mapping[str, str] | None] = contextvars.ContextVar(
    "hpo_settings_environ", default=None)


def _var(name: str, default: Any, **limits: Any) -> Any:
    """A field read from the environment variable ``name``."""
    return Field(default, validation_alias=name, **limits)


class Settings(BaseSettings):
    """Everything the service is configured with; each field names its variable."""

    model_config = SettingsConfigDict(frozen=True, extra="ignore", validate_by_name=True,
                                      validate_by_alias=True, env_ignore_empty=True,
                                      case_sensitive=True, validate_default=False)

    database_url: str = _var("HPO_DATABASE_URL", "sqlite:///hpo.db")
    ray_address: str | None = _var("RAY_ADDRESS", None)
    ray_auth_mode: str | None = _var("RAY_AUTH_MODE", None)
    results_dir: Path = _var("HPO_RESULTS_DIR", Path("hpo-runs"))
    # the best trials' final models (Optuna artifacts); None: <HPO_RESULTS_DIR>/artifacts
    artifact_dir: Path | None = _var("HPO_ARTIFACT_DIR", None)
    max_running_studies: int = _var("HPO_MAX_RUNNING_STUDIES", 2, ge=1, le=1024)
    open_reads: bool = _var("HPO_OPEN_READS", False)
    max_body_bytes: int = _var("HPO_MAX_BODY_BYTES", 1 << 20, ge=1024, le=1 << 30)
    header_timeout_s: float = _var("HPO_HEADER_TIMEOUT_S", 10.0, ge=0.1, le=3600)
    body_timeout_s: float = _var("HPO_BODY_TIMEOUT_S", 30.0, ge=0.1, le=3600)
    send_timeout_s: float = _var("HPO_SEND_TIMEOUT_S", 30.0, ge=0.1, le=3600)
    keep_alive_s: float = _var("HPO_KEEP_ALIVE_S", 5.0, ge=0.1, le=3600)
    max_connections: int = _var("HPO_MAX_CONNECTIONS", 1000, ge=1, le=1 << 20)
    host: str = _var("HPO_HOST", "127.0.0.1")
    port: int = _var("HPO_PORT", 8000, ge=0, le=65535)
    heartbeat_s: float = _var("HPO_HEARTBEAT_S", 2.0, ge=0.05, le=600)
    heartbeat_timeout_s: float = _var("HPO_HEARTBEAT_TIMEOUT_S", 30.0, ge=0.5, le=86400)
    dispatch_interval_s: float = _var("HPO_DISPATCH_INTERVAL_S", 1.0, ge=0.01, le=600)
    num_cpus: int | None = _var("HPO_NUM_CPUS", None, ge=1, le=4096)
    public_url: str | None = _var("HPO_PUBLIC_URL", None)
    dashboard_session_hours: float = _var("HPO_DASHBOARD_SESSION_HOURS", 12.0, gt=0, le=8760)
    run_dispatcher: bool = _var("HPO_RUN_DISPATCHER", True)
    warm_drivers: bool = _var("HPO_WARM_DRIVER", True)
    # the API's thread pool (its synchronous routes and dependencies); its database pools
    # keep as many connections
    api_threads: int = _var("HPO_API_THREADS", 20, ge=1, le=256)
    # API processes on the one port (service.api_processes); the first runs the dispatcher
    api_processes: int = _var("HPO_API_PROCESSES", 1, ge=1, le=64)
    log_format: Literal["text", "json"] = _var("HPO_LOG_FORMAT", "text")
    auto_migrate: bool | None = _var("HPO_AUTO_MIGRATE", None)  # None: on SQLite only
    metrics_open: bool = _var("HPO_METRICS_OPEN", False)
    # bounds on the costly options of a study created by a non-admin token (service.bounds)
    max_trial_workers: int = _var("HPO_MAX_TRIAL_WORKERS", 8, ge=1, le=1024)
    max_data_workers: int = _var("HPO_MAX_DATA_WORKERS", 8, ge=0, le=256)
    max_micro_batch_size: int = _var("HPO_MAX_MICRO_BATCH_SIZE", 4096, ge=1, le=1 << 40)
    max_model_parameters: int = _var("HPO_MAX_MODEL_PARAMETERS", 100_000_000, ge=1, le=10**15)
    max_trials: int = _var("HPO_MAX_TRIALS", 1000, ge=1, le=100_000)
    max_concurrent_trials: int = _var("HPO_MAX_CONCURRENT_TRIALS", 16, ge=1, le=1024)
    max_search_parameters: int = _var("HPO_MAX_SEARCH_PARAMETERS", 32, ge=1, le=10_000)
    max_search_choices: int = _var("HPO_MAX_SEARCH_CHOICES", 1000, ge=1, le=1_000_000)

    @field_validator("log_format", mode="before")
    @classmethod
    def _lower(cls, value: Any) -> Any:
        return value.strip().lower() if isinstance(value, str) else value

    @field_validator("database_url")
    @classmethod
    def _database_url(cls, value: str) -> str:
        problem = database_url_problem(value)
        if problem is not None:
            raise ValueError(f"HPO_DATABASE_URL {problem}")
        return value

    @field_validator("ray_address")
    @classmethod
    def _ray_address(cls, value: str | None) -> str | None:
        if value is None or value == "auto":
            return value
        match = _RAY_ADDRESS.fullmatch(value)
        if not (match and 0 < int(match[1]) < 65536):
            raise ValueError(f"RAY_ADDRESS must be auto, HOST:PORT or ray://HOST:PORT (e.g. "
                             f"10.0.0.1:6379), got {value!r}")
        return value

    @field_validator("public_url")
    @classmethod
    def _public_url(cls, value: str | None) -> str | None:
        problem = None if value is None else public_url_problem(value)
        if problem is not None:
            raise ValueError(f"HPO_PUBLIC_URL {problem}")
        return value

    @model_validator(mode="after")
    def _heartbeats(self) -> Settings:
        if self.heartbeat_timeout_s <= 2 * self.heartbeat_s:
            raise ValueError("HPO_HEARTBEAT_TIMEOUT_S must be more than twice HPO_HEARTBEAT_S")
        results, store = (Path(str(Path(p).resolve()).casefold())  # as study_dir_clash
                          for p in (self.results_dir, self.artifacts_path))
        if results.is_relative_to(store):  # every study's result files among the models
            raise ValueError("HPO_ARTIFACT_DIR must not be HPO_RESULTS_DIR or hold it")
        return self

    @classmethod
    def settings_customise_sources(cls, settings_cls, init_settings, env_settings,
                                   dotenv_settings, file_secret_settings):
        environ = _ENVIRON.get()
        if environ is None:  # Settings(...) in code: its arguments and the defaults only
            return (init_settings,)
        return init_settings, _MappingSource(settings_cls, environ)

    @property
    def api_pool_sizes(self) -> tuple[int, int]:
        """Connections one API process's pools keep: the service engine's (one per API
        thread, and the dispatcher's and ``/readyz``'s) and the Optuna storage's (one per
        API thread)."""
        return self.api_threads + 2, self.api_threads

    @property
    def url(self) -> str:
        """Where people reach this service (``HPO_PUBLIC_URL``, else ``http://HOST:PORT``,
        an IPv6 host in brackets): the only origin the dashboard takes cookie logins and
        writes from. A host that listens on every interface (``0.0.0.0``, ``::``) is no
        address a browser opens: then this machine's own, ``127.0.0.1`` (``[::1]``), which
        the dashboard takes as ``localhost`` too (:attr:`url_warning` says to set
        ``HPO_PUBLIC_URL`` for the others)."""
        if self.public_url:
            return self.public_url.rstrip("/")
        host = _WILDCARD_HOSTS.get(self.host, self.host)
        if ":" in host and not host.startswith("["):
            host = f"[{host}]"
        return f"http://{host}:{self.port}"

    @property
    def url_warning(self) -> str | None:
        """What to tell the operator when :attr:`url` is only this machine's address while
        the service listens on every interface (``HPO_HOST`` ``0.0.0.0`` or ``::``, no
        ``HPO_PUBLIC_URL``); else ``None``."""
        if self.public_url or self.host not in _WILDCARD_HOSTS:
            return None
        return (f"HPO_HOST={self.host} listens on every interface, but without "
                f"HPO_PUBLIC_URL the dashboard takes logins only from {self.url} (this "
                f"machine): set HPO_PUBLIC_URL to the address people open, e.g. "
                f"http://HOSTNAME:{self.port}")

    @property
    def artifacts_path(self) -> Path:
        """Where the best trials' final models are kept, as Optuna artifacts
        (``HPO_ARTIFACT_DIR``, else ``<HPO_RESULTS_DIR>/artifacts``); on a cluster, a path
        the service and every driver reach."""
        return self.artifact_dir or Path(self.results_dir) / "artifacts"

    @property
    def migrate_on_start(self) -> bool:
        """Whether ``hpo serve`` upgrades outdated service tables itself (``HPO_AUTO_MIGRATE``;
        by default on SQLite only: a shared PostgreSQL is upgraded by its operator)."""
        if self.auto_migrate is not None:
            return self.auto_migrate
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> Settings:
        """Settings from ``environ`` (default ``os.environ``), then ``overrides`` (by field
        name).

        Raises:
            SettingsError: a variable has a value of the wrong kind or out of
                range; the message names the variable.
        """
        import os

        token = _ENVIRON.set(os.environ if environ is None else environ)
        try:
            return cls(**overrides)
        except ValidationError as e:
            raise SettingsError(_message(e)) from None
        finally:
            _ENVIRON.reset(token)

    def replace(self, **changes: Any) -> Settings:
        """A copy with ``changes`` (by field name), validated like the original.

        Raises:
            SettingsError: a changed value is out of range.
        """
        try:
            return type(self)(**{**self.model_dump(), **changes})
        except ValidationError as e:
            raise SettingsError(_message(e)) from None

    def to_env(self) -> dict[str, str]:
        """Every setting as its environment variable (those that are ``None`` left out):
        what :meth:`from_env` turns back into these settings."""
        env = {}
        for name, field in type(self).model_fields.items():
            value = getattr(self, name)
            if value is not None:
                env[field.validation_alias] = (str(value).lower() if isinstance(value, bool)
                                               else str(value))
        return env

    def worker_env(self) -> dict[str, str]:
        """The variables a study driver process needs to rebuild these settings."""
        env = {"HPO_DATABASE_URL": self.database_url, "HPO_RESULTS_DIR": str(self.results_dir),
               "HPO_ARTIFACT_DIR": str(self.artifacts_path),
               "HPO_HEARTBEAT_S": str(self.heartbeat_s),
               "HPO_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
               "HPO_LOG_FORMAT": self.log_format}
        if self.ray_address:
            env["RAY_ADDRESS"] = self.ray_address
        if self.ray_auth_mode:
            env["RAY_AUTH_MODE"] = self.ray_auth_mode
        return env


_WILDCARD_HOSTS = {"0.0.0.0": "127.0.0.1", "::": "::1"}
# what the drivers' ray.init and /readyz's probe (hpo.workers.gcs_endpoint) read as a
# cluster's address: a host name, an IPv4 address or a bracketed IPv6 one (the host
# characters of hpo.workers' HOST:PORT, which `hpo worker` takes), then a port
_RAY_ADDRESS = re.compile(r"(?:ray://)?(?:[A-Za-z0-9.\-]+|\[[0-9A-Fa-f:.]+\]):([0-9]{1,5})")


def database_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be the service's database (the end of a sentence that starts with
    the variable's name), or ``None``: it must parse, name SQLite or PostgreSQL (the
    service's statements are written for these two), name a SQLite file (an in-memory
    database is one per connection: the API, the dispatcher and every driver would each
    see an empty one), and hold one ``@`` at most (a password's own ``@`` not written
    ``%40`` would make the rest of the password the host). The URL is shown with its
    password hidden (:func:`hpo.engines.redact`)."""
    import sqlalchemy.exc
    from sqlalchemy.engine import make_url

    from hpo.engines import redact, sqlite_path

    example = "e.g. sqlite:///hpo.db or postgresql+psycopg://USER:PASSWORD@HOST:5432/DB"
    try:
        parsed = make_url(url)
    except (sqlalchemy.exc.ArgumentError,
            ValueError):  # a port that is not a number: int()'s own message
        return f"is not a database URL ({example}), got {redact(url)!r}"
    if parsed.get_backend_name() not in ("sqlite", "postgresql"):
        return f"must name SQLite or PostgreSQL ({example}), got {redact(url)!r}"
    if url.count("@") > 1:
        return ("holds more than one '@': write an '@' of the user or password as %40 "
                "(and a '%' as %25)")
    if parsed.get_backend_name() == "sqlite" and (
            sqlite_path(url) is None or parsed.query.get("mode") == "memory"):
        return (f"names an in-memory SQLite database, which every process of the service "
                f"would see empty: name a file, e.g. sqlite:///hpo.db; got {url!r}")
    return None


def public_url_problem(url: str) -> str | None:
    """Why ``url`` cannot be ``HPO_PUBLIC_URL`` (the end of a sentence that starts with the
    variable's name), or ``None``. Browsers send an origin, ``scheme://host[:port]``, and
    the dashboard compares it with this one: so an ``http://`` or ``https://`` address
    with a host, and nothing after it but an optional ``/`` (``localhost:8000`` alone
    would be read as the scheme ``localhost``, and every login refused)."""
    from urllib.parse import urlsplit

    example = "e.g. https://hpo.example.com or http://10.0.0.5:8000"
    if any(c.isspace() or not c.isprintable() for c in url):
        return f"holds a space or a control character ({example}), got {url!r}"
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number
    except ValueError as e:
        return f"is not an address ({e}; {example}), got {url!r}"
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return f"must be an http:// or https:// address with a host ({example}), got {url!r}"
    if "@" in parts.netloc:
        return f"must not hold a user or password ({example})"
    if parts.path not in ("", "/") or parts.query or parts.fragment or url.endswith(("?", "#")):
        return (f"must be an origin, scheme://host[:port] with no path, query or fragment "
                f"(the service answers at its root; {example}), got {url!r}")
    return None


def variables() -> dict[str, Any]:
    """``{environment variable: default}`` of every setting read from the environment."""
    return {f.validation_alias: f.default for f in Settings.model_fields.values()}


class _MappingSource(EnvSettingsSource):
    """The environment source of pydantic-settings over a given mapping (``from_env``). A
    variable set to the empty string counts as unset (``env_ignore_empty``, which
    pydantic-settings applies in the ``_load_env_vars`` that this one replaces): ``HPO_PORT=``
    in a compose file or a shell gives the default, not an error."""

    def __init__(self, settings_cls, environ: Mapping[str, str]) -> None:
        self._mapping = dict(environ)
        super().__init__(settings_cls, case_sensitive=True)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        if not self.env_ignore_empty:
            return self._mapping
        return {name: value for name, value in self._mapping.items() if value != ""}


_KINDS = {"bool_parsing": "must be true or false", "bool_type": "must be true or false",
          "int_parsing": "must be an integer", "int_type": "must be an integer",
          "int_from_float": "must be an integer", "float_parsing": "must be a number",
          "float_type": "must be a number"}


def _interval(metadata: list) -> str:
    """A field's bounds as an interval: ``[0, 65535]``, ``(0, 8760]``; an open end ``inf``."""
    def bound(*names: str) -> tuple[str, Any]:
        for m in metadata:
            for key in names:
                if getattr(m, key, None) is not None:
                    return key, getattr(m, key)
        return "", None

    low_kind, low = bound("ge", "gt")
    high_kind, high = bound("le", "lt")
    return (f"{'[' if low_kind == 'ge' else '('}{'-inf' if low is None else low}, "
            f"{'inf' if high is None else high}{']' if high_kind == 'le' else ')'}")


def _message(error: ValidationError) -> str:
    """The first error, naming the variable: ``HPO_PORT must be in [0, 65535], got 70000``."""
    first = error.errors(include_url=False)[0]
    fields = Settings.model_fields
    by_alias = {f.validation_alias: key for key, f in fields.items()}
    loc = first["loc"][0] if first["loc"] else None
    loc = by_alias.get(loc, loc)  # the environment's values are validated by alias
    if loc not in fields:
        return first["msg"].removeprefix("Value error, ")
    name, value, kind = fields[loc].validation_alias, first.get("input"), first["type"]
    if kind == "value_error":  # a field's own validator: its message names the variable
        return first["msg"].removeprefix("Value error, ")
    if kind in _KINDS:
        return f"{name} {_KINDS[kind]}, got {value!r}"
    if kind in ("greater_than_equal", "less_than_equal", "greater_than", "less_than"):
        return f"{name} must be in {_interval(fields[loc].metadata)}, got {value}"
    if kind == "literal_error":
        choices = first["ctx"]["expected"].replace(" or ", ", ").replace("'", "")
        return f"{name} must be one of {choices}, got {value!r}"
    return f"{name}: {first['msg']}, got {value!r}"
