"""Readiness: is the database answering, is Ray reachable, is the dispatcher alive?

Request handlers never call Ray: Ray's reachability is a TCP connection to
the cluster's GCS address (what ``ray.init(address=...)`` connects to first),
a cheap check that needs no Ray import in the API process.
"""

from __future__ import annotations

from collections.abc import Callable

import sqlalchemy as sa

from hpo.workers import gcs_endpoint, tcp_reachable

RAY_PROBE_TIMEOUT_S = 1.0


class Readiness:
    """The checks behind ``/readyz``.

    Args:
        engine: the service's database engine.
        ray_address: the cluster the drivers join (``None``: not checked).
        dispatcher_alive: ``None`` when this process runs no dispatcher.
        warm_driver: the warm driver's state (``Dispatcher.warm_driver``; informational,
            never makes the service unready); ``None``: none is kept.
    """

    def __init__(self, engine: sa.Engine, ray_address: str | None,
                 dispatcher_alive: Callable[[], bool] | None = None,
                 warm_driver: Callable[[], str] | None = None) -> None:
        self.engine = engine
        self.ray_address = ray_address
        self.dispatcher_alive = dispatcher_alive
        self.warm_driver = warm_driver

    def checks(self) -> dict[str, str]:
        """``{"database": "ok" | "error: ...", "ray": ..., "dispatcher": ..., "warm_driver":
        "ready" | "starting" | "unjoined" | "none"}``."""
        out = {"database": self._database()}
        endpoint = gcs_endpoint(self.ray_address)
        if endpoint is not None:
            out["ray"] = "ok" if tcp_reachable(*endpoint, RAY_PROBE_TIMEOUT_S) else (
                f"error: no answer from {endpoint[0]}:{endpoint[1]}")
        elif self.ray_address is None:
            out["ray"] = "not configured"
        if self.dispatcher_alive is not None:
            out["dispatcher"] = "ok" if self.dispatcher_alive() else "error: not running"
        if self.warm_driver is not None:
            out["warm_driver"] = self.warm_driver()
        return out

    def _database(self) -> str:
        try:
            with self.engine.connect() as conn:
                conn.execute(sa.text("SELECT 1"))
            return "ok"
        except sa.exc.SQLAlchemyError as e:
            return f"error: {type(e).__name__}"
