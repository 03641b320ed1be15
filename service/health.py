"""Readiness: is the database answering, is Ray reachable, is the dispatcher alive, can it
still write its results folder?

Request handlers never call Ray: Ray's reachability is a TCP connection to
the cluster's GCS address (what ``ray.init(address=...)`` connects to first),
a cheap check that needs no Ray import in the API process.
"""

from __future__ import annotations

import errno
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

import sqlalchemy as sa

from hpo.workers import gcs_endpoint, tcp_reachable

RAY_PROBE_TIMEOUT_S = 1.0


def folder_problem(path: Path) -> OSError | None:
    """Whether ``path`` can hold what the dispatcher writes (a folder per study): it is made
    if missing, and a folder is made and removed in it, as a study's is. ``None``: usable;
    else the ``OSError`` that refused it (a file there, no write permission, a read-only or
    full file system, a removed mount)."""
    try:
        if path.exists() and not path.is_dir():
            raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR))
        path.mkdir(parents=True, exist_ok=True)
        os.rmdir(tempfile.mkdtemp(prefix=".hpo-check-", dir=path))
    except OSError as e:
        return e
    return None


class Readiness:
    """The checks behind ``/readyz``.

    Args:
        engine: the service's database engine.
        ray_address: the cluster the drivers join (``None``: not checked).
        dispatcher_alive: ``None`` when this process runs no dispatcher.
        warm_driver: the warm driver's state (``Dispatcher.warm_driver``; informational,
            never makes the service unready); ``None``: none is kept.
        results_dir: ``HPO_RESULTS_DIR``, checked where this process runs the dispatcher
            (``None``: not checked). ``hpo serve`` refuses an unusable one at start
            (``service.server.check_results_dir``); this says when it became unusable since.
    """

    def __init__(self, engine: sa.Engine, ray_address: str | None,
                 dispatcher_alive: Callable[[], bool] | None = None,
                 warm_driver: Callable[[], str] | None = None,
                 results_dir: Path | None = None) -> None:
        self.engine = engine
        self.ray_address = ray_address
        self.dispatcher_alive = dispatcher_alive
        self.warm_driver = warm_driver
        self.results_dir = results_dir

    def checks(self) -> dict[str, str]:
        """``{"database": "ok" | "error: ...", "ray": ..., "dispatcher": ...,
        "results_dir": ..., "warm_driver": "ready" | "starting" | "unjoined" | "none"}``:
        states and error kinds only, no server address, path or URL (the route answers
        without a token). ``ray`` is left out for ``RAY_ADDRESS=auto`` (found by the
        drivers, nothing to probe)."""
        out = {"database": self._database()}
        if self.ray_address != "auto":  # found by the drivers: nothing to probe here
            out["ray"] = self._ray()
        if self.dispatcher_alive is not None:
            out["dispatcher"] = "ok" if self.dispatcher_alive() else "error: not running"
        if self.results_dir is not None:
            problem = folder_problem(Path(self.results_dir))
            out["results_dir"] = ("ok" if problem is None else
                                  f"error: {errno.errorcode.get(problem.errno or 0, 'OSError')}")
        if self.warm_driver is not None:
            out["warm_driver"] = self.warm_driver()
        return out

    def _ray(self) -> str:
        """The cluster's check, which names no address: ``/readyz`` answers anyone."""
        if self.ray_address is None:
            return "not configured"
        endpoint = gcs_endpoint(self.ray_address)
        if endpoint is None:  # Settings refuse it; a Readiness made in code may not
            return "error: RAY_ADDRESS is not a Ray address"
        return "ok" if tcp_reachable(*endpoint, RAY_PROBE_TIMEOUT_S) else "error: no answer"

    def _database(self) -> str:
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return "ok"
        except sa.exc.SQLAlchemyError as e:
            return f"error: {type(e).__name__}"
