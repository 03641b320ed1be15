"""The one module that uses Ray's private names (see DESIGN.md: one seam per library).

Ray gives no public way to do what these functions do; each names the gap. The
module asserts the Ray version it was written against, so that an upgrade of Ray
fails here, loudly and in one place, rather than somewhere in a running study.
Change ``RAY_VERSION`` only after checking every function below against the new
Ray's source.
"""

from __future__ import annotations

import ray

RAY_VERSION = "2.60.0"

if ray.__version__ != RAY_VERSION:  # pragma: no cover - only on an upgrade of Ray
    raise ImportError(
        f"hpo.ray_private was written against Ray {RAY_VERSION}, found {ray.__version__}: "
        f"check its private names against the new Ray, then update RAY_VERSION")


def ray_connection_alive(timeout_s: float = 5.0) -> bool:
    """Whether this process's Ray connection still reaches the cluster it joined: one
    key-value read from the GCS, which raises (``WrongClusterID``) after a restart of the
    cluster, or times out when it is gone. Ray has no public liveness check of a
    connection (``ray.is_initialized`` stays true after the cluster went away).

    Args:
        timeout_s: seconds to wait for the GCS, > 0.
    """
    try:
        ray._private.worker.global_worker.gcs_client.internal_kv_get(
            b"hpo-liveness", b"hpo", timeout=timeout_s)
    except Exception:  # noqa: BLE001 - any failure: start afresh rather than abort later
        return False
    return True
