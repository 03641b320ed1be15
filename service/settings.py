"""Settings of the service, read from the environment once (``Settings.from_env``).

Every knob of the service is here, with its environment variable; the rest of
the package receives a :class:`Settings` object and never reads the
environment itself.

============================  =========================  ==========================================
variable                      default                    meaning
============================  =========================  ==========================================
``HPO_DATABASE_URL``          ``sqlite:///hpo.db``       service tables and Optuna studies
``RAY_ADDRESS``               unset: a local Ray         the cluster the study drivers join
``RAY_AUTH_MODE``             unset (local Ray: token)   passed on to the drivers (Ray token auth)
``HPO_RESULTS_DIR``           ``hpo-runs``               trial results, checkpoints, driver logs
``HPO_MAX_RUNNING_STUDIES``   ``2``                      studies this service runs at once (1-1024)
``HPO_OPEN_READS``            ``false``                  reads need no token and show every study
``HPO_MAX_BODY_BYTES``        ``1048576``                larger request bodies answer 413
``HPO_HEADER_TIMEOUT_S``      ``10``                     a request's headers must arrive in this
                                                         time, else 408 and the connection closes
``HPO_BODY_TIMEOUT_S``        ``30``                     a request's body must arrive in this time
                                                         after its headers, else 408 / closed
``HPO_SEND_TIMEOUT_S``        ``30``                     a client that reads none of an answer
                                                         this long has its connection aborted
``HPO_KEEP_ALIVE_S``          ``5``                      an idle connection closes after this
``HPO_MAX_CONNECTIONS``       ``1000``                   open connections served; more get 503
``HPO_HOST`` / ``HPO_PORT``   ``127.0.0.1`` / ``8000``   where ``hpo serve`` listens
``HPO_HEARTBEAT_S``           ``2``                      seconds between a driver's heartbeats
``HPO_HEARTBEAT_TIMEOUT_S``   ``30``                     silent this long: the study is taken over
``HPO_NUM_CPUS``              unset (all)                CPUs of the local Ray of ``hpo serve``
``HPO_PUBLIC_URL``            ``http://HOST:PORT``       the address people open: printed in
                                                         links; the one origin of dashboard
                                                         logins and cookie writes
``HPO_WARM_DRIVER``           ``true``                   keep one driver process imported and ready
============================  =========================  ==========================================
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from pathlib import Path

from service.errors import SettingsError

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Settings:
    """Everything the service is configured with; see the module docstring for variables."""

    database_url: str = "sqlite:///hpo.db"
    ray_address: str | None = None
    ray_auth_mode: str | None = None
    results_dir: Path = Path("hpo-runs")
    max_running_studies: int = 2
    open_reads: bool = False
    max_body_bytes: int = 1 << 20
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    send_timeout_s: float = 30.0
    keep_alive_s: float = 5.0
    max_connections: int = 1000
    host: str = "127.0.0.1"
    port: int = 8000
    heartbeat_s: float = 2.0
    heartbeat_timeout_s: float = 30.0
    dispatch_interval_s: float = 1.0
    num_cpus: int | None = None
    public_url: str | None = None
    run_dispatcher: bool = True
    warm_drivers: bool = True
    log_format: str = "text"
    auto_migrate: bool | None = None  # None: true on SQLite, false elsewhere
    metrics_open: bool = False

    @property
    def url(self) -> str:
        """Where people reach this service (``HPO_PUBLIC_URL``, else ``http://host:port``):
        the only origin the dashboard takes cookie logins and writes from."""
        return (self.public_url or f"http://{self.host}:{self.port}").rstrip("/")

    @property
    def migrate_on_start(self) -> bool:
        """Whether ``hpo serve`` upgrades outdated service tables itself (``HPO_AUTO_MIGRATE``;
        by default on SQLite only: a shared PostgreSQL is upgraded by its operator)."""
        if self.auto_migrate is not None:
            return self.auto_migrate
        return self.database_url.startswith("sqlite")

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, **overrides) -> Settings:
        """Settings from ``environ`` (default ``os.environ``), then ``overrides``.

        Raises:
            SettingsError: a variable has a value of the wrong kind or out of
                range; the message names the variable.
        """
        env = os.environ if environ is None else environ
        values = dict(
            database_url=env.get("HPO_DATABASE_URL") or cls.database_url,
            ray_address=env.get("RAY_ADDRESS") or None,
            ray_auth_mode=env.get("RAY_AUTH_MODE") or None,
            results_dir=Path(env.get("HPO_RESULTS_DIR") or cls.results_dir),
            max_running_studies=_int(env, "HPO_MAX_RUNNING_STUDIES", cls.max_running_studies,
                                     1, 1024),
            open_reads=_bool(env, "HPO_OPEN_READS", cls.open_reads),
            max_body_bytes=_int(env, "HPO_MAX_BODY_BYTES", cls.max_body_bytes, 1024, 1 << 30),
            header_timeout_s=_float(env, "HPO_HEADER_TIMEOUT_S", cls.header_timeout_s, 0.1, 3600),
            body_timeout_s=_float(env, "HPO_BODY_TIMEOUT_S", cls.body_timeout_s, 0.1, 3600),
            send_timeout_s=_float(env, "HPO_SEND_TIMEOUT_S", cls.send_timeout_s, 0.1, 3600),
            keep_alive_s=_float(env, "HPO_KEEP_ALIVE_S", cls.keep_alive_s, 0.1, 3600),
            max_connections=_int(env, "HPO_MAX_CONNECTIONS", cls.max_connections, 1, 1 << 20),
            host=env.get("HPO_HOST") or cls.host,
            port=_int(env, "HPO_PORT", cls.port, 0, 65535),
            heartbeat_s=_float(env, "HPO_HEARTBEAT_S", cls.heartbeat_s, 0.05, 600),
            heartbeat_timeout_s=_float(env, "HPO_HEARTBEAT_TIMEOUT_S", cls.heartbeat_timeout_s,
                                       0.5, 86400),
            num_cpus=_int(env, "HPO_NUM_CPUS", None, 1, 4096),
            public_url=env.get("HPO_PUBLIC_URL") or None,
            warm_drivers=_bool(env, "HPO_WARM_DRIVER", cls.warm_drivers),
            log_format=_choice(env, "HPO_LOG_FORMAT", cls.log_format, ("text", "json")),
            auto_migrate=_bool(env, "HPO_AUTO_MIGRATE", None),
            metrics_open=_bool(env, "HPO_METRICS_OPEN", cls.metrics_open),
        )
        values.update(overrides)
        settings = cls(**values)
        if settings.heartbeat_timeout_s <= 2 * settings.heartbeat_s:
            raise SettingsError("HPO_HEARTBEAT_TIMEOUT_S must be more than twice HPO_HEARTBEAT_S")
        return settings

    def worker_env(self) -> dict[str, str]:
        """The variables a study driver process needs to rebuild these settings."""
        env = {"HPO_DATABASE_URL": self.database_url, "HPO_RESULTS_DIR": str(self.results_dir),
               "HPO_HEARTBEAT_S": str(self.heartbeat_s),
               "HPO_HEARTBEAT_TIMEOUT_S": str(self.heartbeat_timeout_s),
               "HPO_LOG_FORMAT": self.log_format}
        if self.ray_address:
            env["RAY_ADDRESS"] = self.ray_address
        if self.ray_auth_mode:
            env["RAY_AUTH_MODE"] = self.ray_auth_mode
        return env


def _int(env: Mapping[str, str], name: str, default: int | None, low: int, high: int):
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise SettingsError(f"{name} must be an integer, got {raw!r}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _float(env: Mapping[str, str], name: str, default: float, low: float, high: float) -> float:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SettingsError(f"{name} must be a number, got {raw!r}") from None
    if not low <= value <= high:
        raise SettingsError(f"{name} must be in [{low}, {high}], got {value}")
    return value


def _bool(env: Mapping[str, str], name: str, default: bool) -> bool:
    raw = env.get(name)
    if raw is None:
        return default
    if raw.strip().lower() in _TRUE:
        return True
    if raw.strip().lower() in _FALSE:
        return False
    raise SettingsError(f"{name} must be true or false, got {raw!r}")


def _choice(env: Mapping[str, str], name: str, default: str, choices: tuple[str, ...]) -> str:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        return default
    if raw.strip().lower() not in choices:
        raise SettingsError(f"{name} must be one of {', '.join(choices)}, got {raw!r}")
    return raw.strip().lower()
