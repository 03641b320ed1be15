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
import time
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


def session_members() -> list[int]:
    """The other live processes of this process's session (Linux ``/proc``; elsewhere
    none), zombies left out."""
    sid, me, found = os.getsid(0), os.getpid(), []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        try:
            # "pid (comm) state ppid pgrp session ...": comm may hold spaces and ')'
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # gone meanwhile
        if fields[0] != "Z" and int(fields[3]) == sid:
            found.append(int(entry.name))
    return found


def end_session(grace_s: float = 5.0) -> list[int]:
    """As the leader of a session of its own (``start_new_session``): SIGTERM every other
    process still in it, and SIGKILL those left after ``grace_s`` seconds. The local Ray
    head's last step: Ray's agents, which its ``ray.shutdown()`` does not stop itself
    (they follow their raylet), were seen alive minutes after a SIGKILL of ``hpo serve``
    (the breaker's finding). Outside a session of its own (run by hand, from a shell)
    nothing is done. Returns the processes it had to SIGKILL."""
    if os.getsid(0) != os.getpid():
        return []
    for pid in session_members():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace_s
    while (left := session_members()) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in left:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
    return left


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
