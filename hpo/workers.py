"""Ray cluster addresses: the ``ray start`` command that ``hpo worker`` runs to add a
worker node, and the TCP probe of a cluster's address (drivers and ``/readyz``)."""

from __future__ import annotations

import json
import re
import socket
import sys
from pathlib import Path

from hpo.spec import BUILTIN_RESOURCES

DEFAULT_GCS_PORT = 6379
_ADDRESS = re.compile(r"^[A-Za-z0-9.\-\[\]:]+:\d{1,5}$")


class WorkerOptionError(ValueError):
    """A bad ``hpo worker`` option; ``flag`` names it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def ray_start_command(address: str, *, num_gpus: int | None = None,
                      num_cpus: int | None = None, resources: str | None = None,
                      block: bool = False) -> list[str]:
    """The ``ray start`` command that joins ``address`` as a worker node.

    Raises:
        WorkerOptionError: the address is not HOST:PORT, or ``resources`` is not
            a JSON object of positive numbers.
    """
    if ":" not in address:
        address = f"{address}:{DEFAULT_GCS_PORT}"
    if not _ADDRESS.match(address) or not 0 < int(address.rsplit(":", 1)[1]) < 65536:
        raise WorkerOptionError("--address", f"expected HOST or HOST:PORT, got {address!r}")
    ray = str(Path(sys.executable).parent / "ray")
    command = [ray, "start", f"--address={address}"]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if resources:
        try:
            parsed = json.loads(resources)
        except json.JSONDecodeError as e:
            raise WorkerOptionError("--resources", f"not JSON: {e}") from None
        if not isinstance(parsed, dict) or not all(
                isinstance(v, int | float) and not isinstance(v, bool) and v > 0
                for v in parsed.values()):
            raise WorkerOptionError("--resources", "expected a JSON object of positive numbers")
        builtin = sorted(k for k in parsed if k.upper() in BUILTIN_RESOURCES)
        if builtin:
            raise WorkerOptionError("--resources", f"{builtin[0]} is not a custom resource; "
                                                   "use --num-cpus / --num-gpus")
        command.append(f"--resources={json.dumps(parsed)}")
    if block:
        command.append("--block")
    return command


def gcs_endpoint(address: str | None) -> tuple[str, int] | None:
    """``(host, port)`` of a Ray address such as ``10.0.0.1:6379`` or ``ray://h:10001``.

    Returns ``None`` for ``auto`` or no address (nothing to probe).
    """
    if not address or address == "auto":
        return None
    hostport = address.split("://", 1)[-1].rstrip("/")
    host, _, port = hostport.rpartition(":")
    if not host or not port.isdigit():
        return None
    return host.strip("[]"), int(port)


def tcp_reachable(host: str, port: int, timeout_s: float) -> bool:
    """Whether a TCP connection to ``host:port`` opens within ``timeout_s`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return True
    except OSError:
        return False
