"""``hpo serve``: the API, the dispatcher, the dashboard and (by default) a local Ray, in one
process group.

Without ``RAY_ADDRESS`` a child process starts a local Ray head
(:mod:`service.ray_head`) and the study drivers join it; with it they join that
cluster. SIGINT or SIGTERM shut down cleanly: uvicorn stops taking requests,
the dispatcher asks running drivers to requeue their studies, then the local
Ray stops. A SIGINT or SIGTERM during start-up (the seconds of starting Ray and
building the app) stops what has started, the local Ray head included, and
``serve`` returns. SIGKILL kills the children too (they die with their parent);
the next start takes the RUNNING studies over.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import gc
import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import uvicorn

from hpo.errors import printable
from service import api_processes, logs
from service.connection_guard import guarded_protocol
from service.errors import ServiceError, SettingsError
from service.health import folder_problem
from service.process import child_env, die_with_parent, stop_process
from service.settings import Settings

log = logging.getLogger("service.server")
RAY_START_TIMEOUT_S = 120.0
RAY_HEAD = [sys.executable, "-m", "service.ray_head"]  # and NUM_CPUS, if set


class LocalRay:
    """A Ray head in a child process (:mod:`service.ray_head`)."""

    def __init__(self, num_cpus: int | None) -> None:
        argv = RAY_HEAD + ([str(num_cpus)] if num_cpus else [])
        self.proc: subprocess.Popen | None = None
        try:
            # its own session, as the study drivers: a Ctrl-C in the terminal reaches only
            # `hpo serve`, which then stops drivers and Ray in order (they stay resumable)
            self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         text=True, env=child_env({}), start_new_session=True)
            line = self.proc.stdout.readline()
        except BaseException:  # Stopped: SIGINT/SIGTERM while Ray starts (10-60 s)
            if self.proc is None:
                raise
            log.info("stopping the local Ray head, which was starting")
            # it stops at the end of its input once Ray has started: a kill before would
            # leave Ray's agents running
            self.stop(RAY_START_TIMEOUT_S)
            raise
        if not line:
            code = self.proc.wait()
            raise ServiceError(f"the local Ray head did not start (exit code {code})")
        info = json.loads(line)
        self.address: str = info["address"]
        self.auth_mode: str | None = info.get("auth_mode")

    def stop(self, timeout_s: float = 30.0) -> None:
        """Close its stdin (it then shuts Ray down, once started); SIGTERM, then SIGKILL, if
        it lingers ``timeout_s`` seconds, and 30 more."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout_s)
        stop_process(self.proc, timeout_s=30)
        with contextlib.suppress(OSError):
            self.proc.stdout.close()


def uvicorn_config(app, settings: Settings, **options) -> uvicorn.Config:
    """uvicorn's config for ``app`` with the settings' address, timeouts and connection limit
    (:mod:`service.connection_guard`); ``options`` go to ``uvicorn.Config`` as they are."""
    protocol = guarded_protocol(settings.header_timeout_s, settings.body_timeout_s,
                                settings.max_connections, settings.send_timeout_s)
    return uvicorn.Config(app, host=settings.host, port=settings.port, http=protocol,
                          timeout_keep_alive=settings.keep_alive_s, **options)


def listen(host: str, port: int) -> socket.socket:
    """Bind and listen on ``host:port`` now, before the seconds of starting Ray: a port in
    use fails at once, and a client that connects while the service starts waits in the
    listen backlog instead of being refused. The socket is not inherited by child processes.

    Args:
        host: an address or name to bind (``0.0.0.0`` for every IPv4 interface).
        port: 0-65535 (0: any free port).

    Raises:
        SettingsError: ``host`` is no address of this machine (the message names
            ``--host`` / ``HPO_HOST``).
        ServiceError: the port is in use or cannot be bound (the message names
            ``--port`` / ``HPO_PORT``).
    """
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as e:
        raise SettingsError(f"cannot bind host {host!r} ({e.strerror}): set --host or "
                            f"HPO_HOST to an address of this machine") from None
    family, kind, proto, _, address = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
        sock.bind(address)
        sock.listen(2048)
    except OSError as e:
        sock.close()
        if e.errno in HOST_ERRNOS:
            raise SettingsError(f"cannot bind host {host!r} ({e.strerror}): set --host or "
                                f"HPO_HOST to an address of this machine") from None
        what = "is in use (another server?)" if e.errno == errno.EADDRINUSE else (
            f"cannot be bound ({e.strerror})")
        raise ServiceError(f"port {port} on {host} {what}: choose another with --port or "
                           f"HPO_PORT") from None
    return sock


# bind(2)'s errors of the address rather than the port: not an address of this machine
# (EADDRNOTAVAIL: HPO_HOST=8.8.8.8), of a family this machine lacks (IPv6 off)
HOST_ERRNOS = frozenset({errno.EADDRNOTAVAIL, errno.EAFNOSUPPORT})


def check_results_dir(settings: Settings) -> None:
    """Make ``HPO_RESULTS_DIR`` (if missing) and make and remove a folder in it, as the
    dispatcher does for each study (``<HPO_RESULTS_DIR>/NAME``) and its drivers for trials:
    a path that is a file, or a folder this process may not write, is refused at start
    rather than failing every study. The same for ``HPO_ARTIFACT_DIR`` where it is set
    (the kept models; by default a folder of ``HPO_RESULTS_DIR``, made when first used).

    Raises:
        SettingsError: one cannot be used; the message names its variable and why.
    """
    folders = [("HPO_RESULTS_DIR", Path(settings.results_dir))]
    if settings.artifact_dir is not None:
        folders.append(("HPO_ARTIFACT_DIR", Path(settings.artifact_dir)))
    for variable, path in folders:
        if (problem := folder_problem(path)) is not None:
            raise SettingsError(f"{variable} {printable(str(path))!r} cannot be used as a "
                                f"directory: {problem.strerror or problem}")


def _prepare_schema(settings: Settings) -> None:
    from service.db import build_engine
    from service.migrate import prepare

    engine = build_engine(settings.database_url)
    try:
        prepare(engine, auto=settings.migrate_on_start)
        warn_if_over_connections(engine, settings)
    finally:
        engine.dispose()


DRIVER_CONNECTIONS = 4  # a study driver's pooled connections: its engine's and storages'


def pooled_connections(settings: Settings) -> int:
    """The database connections the service's pools may keep open at once: per API process
    its pools' (``Settings.api_pool_sizes``), and ``DRIVER_CONNECTIONS`` per running study's
    driver (each pool may open 10 more for a burst, which close as they come back)."""
    return (settings.api_processes * sum(settings.api_pool_sizes)
            + settings.max_running_studies * DRIVER_CONNECTIONS)


def warn_if_over_connections(engine, settings: Settings) -> bool:
    """On PostgreSQL, log a warning (and return True) when :func:`pooled_connections` is more
    than the server takes (``max_connections`` less ``superuser_reserved_connections``):
    under load the pools would then fail with "too many clients already" rather than wait.
    Nothing on SQLite, or where the values cannot be read."""
    if engine.dialect.name != "postgresql":
        return False
    import sqlalchemy as sa

    try:
        with engine.connect() as conn:
            most = int(conn.execute(sa.text("SHOW max_connections")).scalar())
            reserved = int(conn.execute(sa.text("SHOW superuser_reserved_connections"))
                           .scalar())
    except (sa.exc.SQLAlchemyError, TypeError, ValueError):
        return False
    wanted = pooled_connections(settings)
    if wanted <= most - reserved:
        return False
    log.warning("the service's database pools may keep %d connections open (HPO_API_PROCESSES"
                "=%d x 2 x HPO_API_THREADS=%d + 2, plus %d per running study up to "
                "HPO_MAX_RUNNING_STUDIES=%d), and PostgreSQL takes %d (max_connections %d "
                "less %d reserved): lower those settings or raise max_connections",
                wanted, settings.api_processes, settings.api_threads, DRIVER_CONNECTIONS,
                settings.max_running_studies, most - reserved, most, reserved)
    return True


class _Server(uvicorn.Server):
    """uvicorn's server that logs where to go once it serves, and calls ``on_shutdown`` as
    its shutdown begins (the other API processes are told to stop then, not after); it
    stops as soon as it started when ``stop_requested()`` (a signal came before it took
    its handlers)."""

    def __init__(self, config: uvicorn.Config, url: str,
                 on_shutdown: Callable[[], None] = lambda: None,
                 stop_requested: Callable[[], bool] = lambda: False) -> None:
        super().__init__(config)
        self.url = url
        self.on_shutdown = on_shutdown
        self.stop_requested = stop_requested

    async def shutdown(self, sockets=None) -> None:
        self.on_shutdown()
        await super().shutdown(sockets)

    async def startup(self, sockets=None) -> None:
        await super().startup(sockets)
        if self.stop_requested():  # a signal came before uvicorn's handlers: stop now
            self.should_exit = True
        elif self.started:
            log.info("ready: API %s/v1, docs %s/docs, dashboard %s/dashboard", self.url,
                     self.url, self.url)


def serve(settings: Settings, sock: socket.socket | None = None) -> None:
    """Serve until SIGINT/SIGTERM, on ``sock`` (from :func:`listen`) or a socket it binds
    first, before anything slow is imported or started. One of those signals before it
    serves (while Ray starts, say) stops what has started and returns, saying so in the
    log.

    Raises:
        ServiceError: the port is in use (before anything else starts), the service's
            tables need ``hpo db upgrade`` (``SchemaOutdated``), or the local Ray head could
            not start.
        SettingsError: ``HPO_RESULTS_DIR`` cannot be used (:func:`check_results_dir`).
        hpo.errors.StorageError: the database cannot be opened.
    """
    signals = _StopSignals(raising=True)
    try:
        _serve(settings, sock, signals)
    except Stopped as e:
        log.info("%s during start-up: what had started is stopped", e)
    finally:
        signals.restore()


def _serve(settings: Settings, sock: socket.socket | None, signals: _StopSignals) -> None:
    if sock is None:
        sock = listen(settings.host, settings.port)
    local_ray = shared = others = None
    try:
        check_results_dir(settings)
        _prepare_schema(settings)  # an outdated schema is refused before Ray starts
        if settings.port == 0:
            settings = settings.replace(port=sock.getsockname()[1])
        if not settings.ray_address:
            log.info("listening on %s; starting a local Ray head first (10-60 s), then the "
                     "API", settings.url)
            local_ray = LocalRay(settings.num_cpus)
            settings = settings.replace(ray_address=local_ray.address,
                                        ray_auth_mode=local_ray.auth_mode)
            log.info("local Ray head at %s", local_ray.address)
        if settings.api_processes > 1:
            shared = api_processes.new_metrics_dir()
            api_processes.use_shared_metrics(shared)  # before prometheus_client's import
        from service.app import create_app  # seconds of imports: after the port is ours

        app = create_app(settings)
        if shared is not None:
            others = _other_api_processes(app, settings, sock, shared)
            others.start()
        _run(app, settings, sock, others.signal_stop if others else lambda: None, signals)
    finally:
        signals.hold()  # a second signal must not cut the clean-up short
        if others is not None:
            others.stop()
        sock.close()
        if local_ray is not None:
            local_ray.stop()
        if shared is not None:
            shutil.rmtree(shared, ignore_errors=True)


class Stopped(BaseException):
    """SIGINT or SIGTERM (its name, the message) while ``hpo serve`` started: raised by the
    handler wherever start-up was, so that the clean-up on the way out stops what had
    started. A ``BaseException``, as ``KeyboardInterrupt``: no ``except Exception`` keeps it."""


class _StopSignals:
    """This process's SIGINT and SIGTERM handlers from ``serve``'s first line to its last.

    Until uvicorn serves (``raising``), the first signal raises :class:`Stopped`; from then
    on (:meth:`hold`) signals are only noted in ``received``: uvicorn's own handlers take
    them while it runs and raise them again against these when it ends, which then let the
    clean-up run and the process exit 0. Before, start-up had Python's defaults: a SIGTERM
    while Ray started ended the process at once (exit 143) and left Ray's agents running.
    """

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self, *, raising: bool) -> None:
        self.raising = raising
        self.received: int | None = None
        self._previous = {sig: signal.signal(sig, self._handle) for sig in self.SIGNALS}

    def hold(self) -> None:
        """From now on, only note the signals."""
        self.raising = False

    def restore(self) -> None:
        """Put back the handlers found."""
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, sig: int, _frame) -> None:
        self.received = self.received or sig
        if self.raising:
            self.raising = False
            raise Stopped(signal.Signals(sig).name)


def _other_api_processes(app, settings: Settings, sock: socket.socket,
                         shared: Path) -> api_processes.ApiProcesses:
    """``settings.api_processes - 1`` API processes (to start) on ``sock`` with these
    settings and no dispatcher; this one's dispatcher publishes its state to them and wakes
    on their creates (``service.api_processes``)."""
    env = {**settings.replace(run_dispatcher=False).to_env(),
           api_processes.METRICS_ENV: str(shared)}
    dispatcher = app.state.dispatcher
    if dispatcher is not None:
        status = api_processes.DispatcherStatus(shared / "dispatcher.json")
        dispatcher.on_round = lambda: status.publish(dispatcher)
        signal.signal(api_processes.WAKE_SIGNAL, lambda *_: dispatcher.wake())
        env[api_processes.STATUS_ENV] = str(status.path)
    else:  # no dispatcher to wake: a wake signal must not end this process (its default)
        signal.signal(api_processes.WAKE_SIGNAL, signal.SIG_IGN)
    return api_processes.ApiProcesses(settings.api_processes - 1, sock.fileno(), env)


def _run(app, settings: Settings, sock: socket.socket,
         on_shutdown: Callable[[], None] = lambda: None,
         signals: _StopSignals | None = None) -> None:
    """Serve ``app`` on ``sock`` until SIGINT/SIGTERM (``signals``: the handlers that noted
    them before; a signal noted before uvicorn took its own stops it as it starts)."""
    # what the imports and the app built lives as long as the process: frozen out of
    # the cycle collector's reach, a full collection no longer walks those ~400k
    # objects (0.2-0.5 s each on a busy machine: the p99 of the API's reads,
    # bench/read_scaling.py)
    gc.freeze()
    config = uvicorn_config(app, settings, log_level="info", log_config=None,
                            timeout_graceful_shutdown=10)
    if signals is None:
        signals = _StopSignals(raising=False)
    signals.hold()  # uvicorn takes the signals now (_StopSignals says how)
    _Server(config, settings.url, on_shutdown, lambda: signals.received is not None
            ).run(sockets=[sock])


def serve_api_process(settings: Settings, fd: int) -> None:
    """One of the other API processes (``service.api_processes``): the app without a
    dispatcher on the inherited listening socket ``fd``, until SIGINT/SIGTERM or the end of
    the process that started it."""
    die_with_parent(signal.SIGTERM)
    sock = socket.socket(fileno=fd)
    from service.app import create_app

    status_path = os.environ.get(api_processes.STATUS_ENV)
    # the first process publishes after each round: rounds come at least every
    # dispatch_interval_s (a wake brings one sooner), so its state is stale only past that
    stale_after_s = settings.dispatch_interval_s + settings.heartbeat_timeout_s
    status = (api_processes.DispatcherStatus(Path(status_path), stale_after_s)
              if status_path else None)
    app = create_app(settings, dispatcher_status=status)
    if status is not None:  # the first process runs a dispatcher: wake it at each create
        app.state.components.studies.on_queued = api_processes.wake_first_process
    try:
        _run(app, settings, sock)
    finally:
        sock.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m service.server [--host H] [--port P]``; other settings from the environment."""
    parser = argparse.ArgumentParser(prog="python -m service.server", description=__doc__)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    parser.add_argument("--api-process", type=int, metavar="FD", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    fd = args.api_process
    overrides = {k: v for k, v in vars(args).items() if v is not None and k != "api_process"}
    try:
        settings = Settings.from_env(**overrides)
        logs.configure(settings.log_format)
        if fd is not None:
            serve_api_process(settings, fd)
        else:
            serve(settings)
    except ServiceError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2 if isinstance(e, SettingsError) else 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
