"""Ray cluster addresses: the ``ray start`` command that ``hpo worker`` runs to add a
worker node, and the TCP probe of a cluster's address (drivers and ``/readyz``)."""

from __future__ import annotations

import ipaddress
import json
import math
import re
import socket
import sys
from pathlib import Path

from hpo.errors import printable
from hpo.spec import BUILTIN_RESOURCES, RESOURCE_PATTERN

DEFAULT_GCS_PORT = 6379
# Ray's largest resource quantity: kept here (a module the API process imports without
# Ray), checked against Ray's own at import by hpo.ray_private
RAY_MAX_RESOURCE_QUANTITY = 100e12
_HOST_LABEL = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_-]{0,62}")  # not starting with -
_PORT = re.compile(r"[0-9]{1,5}")
_BRACKETED = re.compile(r"\[([^\]]*)\](?::(.*))?", re.DOTALL)  # [IPv6] or [IPv6]:PORT


class WorkerOptionError(ValueError):
    """A bad ``hpo worker`` option; ``flag`` names it."""

    def __init__(self, flag: str, message: str) -> None:
        super().__init__(message)
        self.flag = flag


def ray_start_command(address: str, *, num_gpus: int | None = None,
                      num_cpus: int | None = None, resources: str | None = None,
                      block: bool = False) -> list[str]:
    """The ``ray start`` command that joins ``address`` as a worker node.

    Args:
        address: ``HOST`` or ``HOST:PORT`` (:func:`gcs_address`).
        resources: a JSON object of custom resources (:func:`resources_json`).

    Raises:
        WorkerOptionError: a bad address (``--address``) or resources (``--resources``).
    """
    ray = str(Path(sys.executable).parent / "ray")
    command = [ray, "start", f"--address={gcs_address(address)}"]
    if num_gpus is not None:
        command.append(f"--num-gpus={num_gpus}")
    if num_cpus is not None:
        command.append(f"--num-cpus={num_cpus}")
    if resources:
        command.append(f"--resources={resources_json(resources)}")
    if block:
        command.append("--block")
    return command


def gcs_address(address: str) -> str:
    """``address`` as ``HOST:PORT`` (port 6379 when left out), for ``ray start --address``.

    HOST is a host name (dot-separated labels of ASCII letters, digits, ``-`` and ``_``,
    which Docker's service names may have, none starting with ``-``; at most 253
    characters), an IPv4 address (a name of numbers only must be one), or an IPv6 address in
    brackets (``[::1]:6379``, as Ray parses it: without them its colons read as the port's);
    PORT is 1-65535 in ASCII digits. Refused so: a host starting with ``-`` (an option,
    wherever it stands alone on a command line), one with spaces, control characters or
    other characters, ``999.1.1.1``, ``::1``; the port of ``h:1\\n`` or ``h:\\u0661``
    (``int`` reads both).

    Raises:
        WorkerOptionError: (``--address``) not such an address.
    """
    bracketed = _BRACKETED.fullmatch(address)
    if bracketed:
        host, port = bracketed[1], bracketed[2]
    elif address.startswith("["):  # no closing bracket, or more after it than :PORT
        host, port = address, ""
    elif ":" in address:
        host, port = address.rsplit(":", 1)
    else:
        host, port = address, str(DEFAULT_GCS_PORT)
    if port is None:
        port = str(DEFAULT_GCS_PORT)
    if not _is_host(host, bracketed is not None):
        raise WorkerOptionError("--address", (
            f"expected HOST or HOST:PORT, got {printable(address)!r}: "
            f"{printable(host)!r} is not a host name nor an IP address "
            "(an IPv6 address goes in brackets: [::1]:6379)"))
    if not _PORT.fullmatch(port) or not 0 < int(port) < 65536:
        raise WorkerOptionError("--address", (
            f"expected HOST or HOST:PORT, got {printable(address)!r}: "
            f"the port {printable(port)!r} is not a number in 1-65535"))
    return f"[{host}]:{int(port)}" if bracketed else f"{host}:{int(port)}"


def _is_host(host: str, ipv6: bool) -> bool:
    """Whether ``host`` is an IPv6 address (``ipv6``: it was in brackets), else an IPv4
    address or a host name (a name of numbers only must be an IPv4 address)."""
    try:
        if ipv6:
            return ipaddress.IPv6Address(host) is not None
        labels = host.split(".")
        if all(label.isascii() and label.isdigit() for label in labels):
            return ipaddress.IPv4Address(host) is not None
    except ValueError:
        return False
    return len(host) <= 253 and all(_HOST_LABEL.fullmatch(label) for label in labels)


def resources_json(resources: str) -> str:
    """The JSON object of a node's custom resources, checked as ``ray start`` and the
    study specs check them, re-encoded.

    JSON as Python reads it allows what ``ray start`` refuses or misreads: ``Infinity``,
    ``NaN`` and numbers that overflow to infinity (``1e400``), fractions (a node's
    quantities are whole numbers), more than ``RAY_MAX_RESOURCE_QUANTITY``, a key given
    twice (the last one wins). Each name is 1-64 ASCII letters, digits, ``_ . : / -`` (the
    names a study's spec can ask for: ``hpo.spec.RESOURCE_PATTERN``) and not Ray's own
    ``CPU``, ``GPU``, ``memory`` in any case; each amount a whole number in
    [1, ``RAY_MAX_RESOURCE_QUANTITY``].

    Raises:
        WorkerOptionError: (``--resources``) not such an object.
    """
    try:
        parsed = json.loads(resources, object_pairs_hook=_unique_keys)
    except ValueError as e:  # JSONDecodeError, _DuplicateKey, an int of over 4300 digits
        raise WorkerOptionError("--resources", f"not JSON: {e}") from None
    if not isinstance(parsed, dict):
        raise WorkerOptionError("--resources", "expected a JSON object of resource amounts, "
                                               'e.g. {"a100": 1}')
    for name, amount in parsed.items():
        if not RESOURCE_PATTERN.fullmatch(name):
            raise WorkerOptionError("--resources", (
                f"{printable(name)!r} is not a resource name: 1-64 ASCII letters, digits, "
                "_ . : / -"))
        if name.upper() in BUILTIN_RESOURCES:
            raise WorkerOptionError("--resources", f"{name} is not a custom resource; "
                                                   "use --num-cpus / --num-gpus")
        if not (isinstance(amount, int | float) and not isinstance(amount, bool)
                and 1 <= amount <= RAY_MAX_RESOURCE_QUANTITY  # False for NaN, inf
                and math.isfinite(amount) and amount == int(amount)):
            raise WorkerOptionError("--resources", (
                f"{name}: expected a whole number from 1 to {RAY_MAX_RESOURCE_QUANTITY:,.0f} "
                f"(what ray start accepts), got {printable(json.dumps(amount))}"))
    return json.dumps(parsed)


class _DuplicateKey(ValueError):
    pass


def _unique_keys(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``json.loads``' object hook: the object, or a key given twice refused."""
    found = dict(pairs)
    if len(found) != len(pairs):
        seen = set()
        twice = next(k for k, _ in pairs if k in seen or seen.add(k))
        raise _DuplicateKey(f"the key {printable(twice)!r} is given twice")
    return found


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
