"""The study driver's Ray cluster: joining it (:func:`init_ray`) and checking that a trial's
resources fit on one of its nodes (:func:`check_resources`).

``hpo.tune.driver`` uses both (and re-exports :func:`init_ray`, which the CLI and the
service's warm driver call).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import ray
from ray.exceptions import RuntimeEnvSetupError

from hpo.errors import ClusterError, SpecError
from hpo.spec import StudySpec
from hpo.workers import gcs_endpoint, tcp_reachable

CLUSTER_PROBE_TIMEOUT_S = 5.0
_joined: dict[str, Any] = {}  # the Ray connection init_ray made: its job id and runtime_env


def init_ray(address: str | None = None, num_cpus: int | None = None,
             runtime_env: dict[str, Any] | None = None) -> None:
    """Join the cluster at ``address`` (or ``RAY_ADDRESS``), or start a local Ray.

    ``runtime_env`` is the job's Ray runtime environment: the task's code
    shipped to every trial (``hpo.taskcode``). A connection that this function
    made with another runtime environment is closed and made anew (a warm
    driver joins before it knows its study's task); a Ray that the caller
    initialized itself is left as it is (tests share one session; the caller
    then ships the code, or the workers have the task installed). A cluster
    address is first probed with a TCP connection (``CLUSTER_PROBE_TIMEOUT_S``),
    so that a cluster that is down fails at once.

    Raises:
        ClusterError: the cluster cannot be reached, or the task's code cannot be
            shipped to it (e.g. a package of Ray's 512 MiB limit or more).
    """
    if ray.is_initialized():
        made_here = _joined.get("job_id") == ray.get_runtime_context().get_job_id()
        if not made_here or _joined.get("runtime_env") == runtime_env:
            return
        ray.shutdown()
    _joined.clear()
    address = address or os.environ.get("RAY_ADDRESS") or None
    endpoint = gcs_endpoint(address)
    if endpoint is not None and not tcp_reachable(*endpoint, CLUSTER_PROBE_TIMEOUT_S):
        # ray.init would retry for many minutes (about 40 s per attempt with ray 2.60)
        raise ClusterError(f"cannot reach the Ray cluster at {address}: nothing answers at "
                           f"{endpoint[0]}:{endpoint[1]} (is its head node up?)")
    try:  # "local": a new Ray, never one that `ray start` left running on this machine
        ray.init(address=address or "local", num_cpus=None if address else num_cpus,
                 include_dashboard=False, configure_logging=True, logging_level="WARNING",
                 log_to_driver=False, runtime_env=copy.deepcopy(runtime_env))  # Ray
        # rewrites it (py_modules become the uploaded packages' URIs): kept as asked, a
        # second call with the same environment stays on this connection
    except RuntimeEnvSetupError as e:
        ray.shutdown()
        raise ClusterError(f"cannot ship the task's code to the Ray cluster: {e}") from e
    except (ConnectionError, RuntimeError, ValueError) as e:
        raise ClusterError(f"cannot reach the Ray cluster at {address or 'a new local Ray'}: "
                           f"{e}") from e
    _joined.update(job_id=ray.get_runtime_context().get_job_id(), runtime_env=runtime_env)


def check_resources(spec: StudySpec) -> None:
    """Refuse, naming the field, a trial that no node of the cluster could ever hold.

    Raises:
        SpecError: no node has a worker's ``resources.cpus`` CPUs, ``resources.gpus``
            GPUs and ``resources.custom`` resources, or the cluster has fewer than
            ``resources.workers`` such slots.
    """
    r = spec.resources
    need = {"CPU": r.cpus, "GPU": r.gpus, **r.custom}
    nodes = [n["Resources"] for n in ray.nodes() if n.get("Alive")]
    fitting = [n for n in nodes if all(n.get(k, 0) >= v for k, v in need.items() if v > 0)]
    if not fitting:
        for key, field in [("GPU", "resources.gpus"), ("CPU", "resources.cpus"),
                           *((k, f"resources.custom.{k}") for k in r.custom)]:
            most = max((n.get(key, 0) for n in nodes), default=0)
            if need[key] > most:
                raise SpecError.at(field, f"no node of the cluster has {need[key]:g}; the "
                                          f"largest has {most:g}")
        raise SpecError.at("resources", "no single node has all of these resources")
    slots = sum(int(min(n.get(k, 0) // v for k, v in need.items() if v > 0)) for n in fitting)
    if slots < r.workers:
        raise SpecError.at("resources.workers", f"the cluster can hold {slots} such workers at "
                                                f"most")
