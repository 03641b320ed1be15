"""Child processes that share the fate of the service (study drivers, the local Ray head).

``hpo serve`` runs API, dispatcher, drivers and a local Ray as one process
group; when the service dies, even by SIGKILL, its children must die too, so
that a restarted service can take their studies over without two drivers on
one study.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import os
import signal
import subprocess
import sys
from pathlib import Path

PR_SET_PDEATHSIG = 1
PARENT_ENV = "HPO_PARENT_PID"


def die_with_parent(sig: int = signal.SIGKILL) -> None:
    """Ask Linux to send ``sig`` to this process when its parent dies; exit now if it already has.

    The parent's pid comes from ``HPO_PARENT_PID``. Elsewhere than Linux this
    only checks the parent once; the driver's heartbeat checks it again. On Linux
    "parent" means the parent's *thread* that started this process (prctl(2)): see
    ``service.driver_process`` for what that asks of the service.
    """
    if sys.platform.startswith("linux"):
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    if parent_gone():
        os._exit(70)


BATCH_NICENESS = 10  # study drivers and the local Ray run below the API's priority


def lower_priority(niceness: int = BATCH_NICENESS) -> None:
    """Run this process (and the processes it starts, which inherit it) ``niceness`` steps
    below normal CPU priority: batch work (study drivers, the local Ray and its trials) then
    takes the CPU the API leaves, so reads and writes stay fast on a machine whose cores the
    trials fill. Where the process may not change its priority, nothing changes.

    A process that leads its own session (drivers and the local Ray start in one) also
    lowers its session's scheduling group: where Linux groups processes by session
    (``CONFIG_SCHED_AUTOGROUP``, on by default in most distributions' kernels), a process's
    own niceness only ranks it within its group, and every group gets an equal share of
    the CPU, so a driver's ``nice`` alone gave the API nothing (sched(7), "The autogroup
    feature"; seen under ``bench/load.py``). A process in its parent's session leaves the
    group alone, which would lower its parent too.
    """
    _lower(0, niceness)


def _lower(pid: int, niceness: int) -> None:
    """Process ``pid`` (0: this one) ``niceness`` steps lower (at most 19), and its
    session's autogroup to ``niceness`` if it leads its session; nothing where it may not,
    or is already gone."""
    with contextlib.suppress(OSError):
        os.setpriority(os.PRIO_PROCESS, pid,
                       min(19, os.getpriority(os.PRIO_PROCESS, pid) + niceness))
        if os.getsid(pid) == (pid or os.getpid()):
            lower_session_group(niceness, pid or None)


AUTOGROUP = "/proc/self/autogroup"


def lower_session_group(niceness: int, pid: int | None = None) -> None:
    """Set the niceness of the autogroup (session's scheduling group) of process ``pid``
    (default this one) to ``niceness`` (-20..19), where the kernel has autogroups;
    elsewhere nothing changes."""
    path = AUTOGROUP if pid is None else f"/proc/{pid}/autogroup"
    with contextlib.suppress(OSError), open(path, "w") as f:
        f.write(str(niceness))


def start_batch(argv: list[str], niceness: int = BATCH_NICENESS, **popen) -> subprocess.Popen:
    """Start ``argv`` in a session of its own, ``niceness`` steps below this process's
    priority, with its session's autogroup lowered too (:func:`lower_priority`), from its
    first instruction: a study driver spends about 4 s of CPU importing torch, Ray and
    Optuna before it could lower itself, and spent them at the API's priority (seen under
    ``bench/load.py``, a driver importing at 60 % of a core). ``popen`` goes to Popen."""
    proc = subprocess.Popen(argv, start_new_session=True, **popen)
    _lower(proc.pid, niceness)  # it starts at this process's priority
    return proc


def session_group_niceness() -> int | None:
    """The niceness of this process's autogroup, or None where it is in none: a kernel
    without autogroups, or a process in a CPU cgroup (a container's, a systemd slice's),
    where the kernel schedules by the cgroup and ``/proc/self/autogroup`` reads empty."""
    try:
        fields = Path(AUTOGROUP).read_text().split()
    except OSError:
        return None
    # "/autogroup-85 nice 0" (sched(7))
    return int(fields[2]) if len(fields) == 3 and fields[1] == "nice" else None


def parent_gone() -> bool:
    """True when the parent named by ``HPO_PARENT_PID`` is no longer this process's parent."""
    expected = os.environ.get(PARENT_ENV)
    return expected is not None and os.getppid() != int(expected)


# prometheus-client's multiprocess directory of the API processes (service.api_processes):
# a driver that inherited it would write its libraries' metrics there
NOT_INHERITED = frozenset({"PROMETHEUS_MULTIPROC_DIR"})


def child_env(extra: dict[str, str]) -> dict[str, str]:
    """This process's environment (less ``NOT_INHERITED``) plus ``extra`` and the parent pid
    for :func:`die_with_parent`."""
    inherited = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    return {**inherited, **extra, PARENT_ENV: str(os.getpid())}


def describe_exit(code: int) -> str:
    """``exit code 3`` or ``signal SIGKILL`` for a ``Popen.returncode``."""
    if code < 0:
        try:
            return f"signal {signal.Signals(-code).name}"
        except ValueError:
            return f"signal {-code}"
    return f"exit code {code}"


def stop_process(proc: subprocess.Popen, timeout_s: float) -> int:
    """SIGTERM ``proc``, wait up to ``timeout_s`` seconds, then SIGKILL; return its exit code."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            proc.kill()
    return proc.wait()
