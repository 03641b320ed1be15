"""``hpo serve``: the API, the dispatcher, the dashboard and (by default) a local Ray, in one
process group.

Without ``RAY_ADDRESS`` a child process starts a local Ray head
(:mod:`service.ray_head`) and the study drivers join it; with it they join that
cluster. SIGINT or SIGTERM shut down cleanly: uvicorn stops taking requests,
the dispatcher asks running drivers to requeue their studies, then the local
Ray stops. SIGKILL kills the children too (they die with their parent); the
next start takes the RUNNING studies over.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import gc
import json
import logging
import signal
import subprocess
import sys

import uvicorn

from service.connection_guard import guarded_protocol
from service.errors import ServiceError
from service.middleware import RedactTokens
from service.process import child_env, stop_process
from service.settings import Settings

log = logging.getLogger("service.server")
RAY_START_TIMEOUT_S = 120.0


class LocalRay:
    """A Ray head in a child process (:mod:`service.ray_head`)."""

    def __init__(self, num_cpus: int | None) -> None:
        argv = [sys.executable, "-m", "service.ray_head"] + ([str(num_cpus)] if num_cpus else [])
        # its own session, as the study drivers: a Ctrl-C in the terminal reaches only
        # `hpo serve`, which then stops drivers and Ray in order (they stay resumable)
        self.proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     text=True, env=child_env({}), start_new_session=True)
        line = self.proc.stdout.readline()
        if not line:
            code = self.proc.wait()
            raise ServiceError(f"the local Ray head did not start (exit code {code})")
        info = json.loads(line)
        self.address: str = info["address"]
        self.auth_mode: str | None = info.get("auth_mode")

    def stop(self) -> None:
        """Close its stdin (it then shuts Ray down); SIGTERM, then SIGKILL, if it lingers."""
        with contextlib.suppress(OSError):
            self.proc.stdin.close()
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(30)
        stop_process(self.proc, timeout_s=30)


def uvicorn_config(app, settings: Settings, **options) -> uvicorn.Config:
    """uvicorn's config for ``app`` with the settings' address, timeouts and connection limit
    (:mod:`service.connection_guard`); ``options`` go to ``uvicorn.Config`` as they are."""
    protocol = guarded_protocol(settings.header_timeout_s, settings.body_timeout_s,
                                settings.max_connections, settings.send_timeout_s)
    return uvicorn.Config(app, host=settings.host, port=settings.port, http=protocol,
                          timeout_keep_alive=settings.keep_alive_s, **options)


def serve(settings: Settings) -> None:
    """Serve until SIGINT/SIGTERM.

    Raises:
        ServiceError: the local Ray head could not start.
        hpo.errors.StorageError: the database cannot be opened.
    """
    from service.app import create_app

    logging.getLogger("uvicorn.access").addFilter(RedactTokens())
    local_ray = None
    if not settings.ray_address:
        local_ray = LocalRay(settings.num_cpus)
        settings = dataclasses.replace(settings, ray_address=local_ray.address,
                                       ray_auth_mode=local_ray.auth_mode)
        log.info("local Ray head at %s", local_ray.address)
    try:
        app = create_app(settings)
        # what the imports and the app built lives as long as the process: frozen out of
        # the cycle collector's reach, a full collection no longer walks those ~400k
        # objects (0.2-0.5 s each on a busy machine: the p99 of the API's reads,
        # bench/read_scaling.py)
        gc.freeze()
        config = uvicorn_config(app, settings, log_level="info", timeout_graceful_shutdown=10)
        # uvicorn handles SIGINT/SIGTERM while it runs, then raises the signal again
        # against the handlers it found: these no-ops let the clean-up below run and
        # the process exit 0 after a clean shutdown.
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, lambda *_: None)
        uvicorn.Server(config).run()
    finally:
        if local_ray is not None:
            local_ray.stop()


def main(argv: list[str] | None = None) -> int:
    """``python -m service.server [--host H] [--port P]``; other settings from the environment."""
    parser = argparse.ArgumentParser(prog="python -m service.server", description=__doc__)
    parser.add_argument("--host")
    parser.add_argument("--port", type=int)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: "
                                                   "%(message)s")
    overrides = {k: v for k, v in vars(args).items() if v is not None}
    serve(Settings.from_env(**overrides))
    return 0


if __name__ == "__main__":
    sys.exit(main())
