"""A study driver process, both ends of its pipes, and the warm spare behind them.

The dispatcher says only start, interrupt and reap; :class:`DriverProcess` owns
the rest: the ``Popen`` of ``python -m service.worker``, the study's claim, its
log file, the interrupt, and whether (and how) it ended, with its log's tail.
:class:`DriverPool` starts them, from a warm spare when one is ready.

The pipes (the same for a cold driver and a spare):

- stdin, from the service: ``NAME CLAIM LOG`` once (only a spare reads it: its
  study), then ``interrupt`` (or end of input), which asks the driver to
  interrupt its study and requeue it (:func:`watch_for_interrupt`). Not a
  signal: Ray and Tune take SIGTERM, SIGINT and SIGUSR1 once ``ray.init`` ran.
- stdout: a spare writes one line, ``ready`` or ``unjoined`` (imports done; the
  cluster joined, or not joinable now), read by a thread of the pool; every
  other output of a driver goes to its study's log.

A spare imports Ray, torch and the driver and joins the cluster while the
service is idle (a cold driver spends about 4 s on that after its claim). Its
connection may have gone stale by the time a study comes (the cluster
restarted: Ray would abort at the first query, or wait 60 s for the old one);
then the spare re-executes itself as a cold driver of that study (same pid, same
pipes, :func:`wait_for_study`).

Every driver dies with the service (``service.process.die_with_parent``, Linux's
PR_SET_PDEATHSIG), so that a restarted service never finds two drivers on one
study. Linux sends that signal when the *thread* that started the child exits,
not the process: every driver and spare must therefore be started, interrupted
and waited for by one long-lived thread, the dispatcher's (``Dispatcher._loop``);
a driver started from a short-lived thread would be SIGKILLed when it ends.
"""

from __future__ import annotations

import contextlib
import os
import stat
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path

from hpo.errors import public_message
from hpo.lease import LeaseColumns
from service.db import StudyRow
from service.process import child_env, describe_exit, start_batch, stop_process
from service.settings import Settings

WORKER = [sys.executable, "-m", "service.worker"]

# A study's claim is a lease (``hpo.lease``) kept in its row: taken by the dispatcher,
# renewed by the driver's heartbeat, ended with the study.
CLAIMS = LeaseColumns(StudyRow, StudyRow.name, StudyRow.claimed_by, StudyRow.heartbeat_at)


class DriverProcess:
    """One running study driver.

    Args:
        name: the study.
        claim: the claim it runs under (``hpo_studies.claimed_by``).
        proc: its process; its stdin is the pipe :meth:`interrupt` writes to.
        log_path: its log (stdout and stderr).
    """

    def __init__(self, name: str, claim: str, proc: subprocess.Popen, log_path: Path) -> None:
        self.name = name
        self.claim = claim
        self.proc = proc
        self.log_path = log_path

    @property
    def pid(self) -> int:
        return self.proc.pid

    def exit_code(self) -> int | None:
        """Its exit status (negative: the signal), ``None`` while it runs."""
        return self.proc.poll()

    def interrupt(self) -> None:
        """Ask it to interrupt its study and requeue it (``interrupt`` on its stdin)."""
        with contextlib.suppress(OSError, ValueError, AttributeError):
            self.proc.stdin.write(b"interrupt\n")
            self.proc.stdin.close()

    def wait(self, timeout_s: float) -> None:
        """Wait up to ``timeout_s`` seconds for it to exit, then stop it (SIGTERM, SIGKILL)."""
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(max(0.0, timeout_s))
        stop_process(self.proc, timeout_s=5)

    def close(self) -> None:
        """Release its pipe once it exited."""
        with contextlib.suppress(OSError, AttributeError):
            self.proc.stdin.close()

    def exit_reason(self) -> str:
        """Why it ended, for the study's ``error``: its exit and one line of its log (no
        traceback, no paths)."""
        return (f"the study driver ended with {describe_exit(self.proc.returncode)} without a "
                f"result; its log ends with: {public_message(self.log_tail(), from_end=True)}")

    def log_tail(self, n_lines: int = 20) -> str:
        """The last ``n_lines`` lines of its log (at most 4000 characters)."""
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(deque(f, maxlen=n_lines))[-4000:]
        except OSError:
            return "(no log)"


class DriverPool:
    """Starts study drivers; with ``settings.warm_drivers``, keeps one warm spare.

    Call every method from the dispatcher's thread (see the module doc).
    """

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.spare: subprocess.Popen | None = None
        self._said = _Announcement()  # what the current spare said

    def start(self, name: str, claim: str, log_path: Path) -> DriverProcess:
        """A driver of study ``name`` under ``claim``, writing to ``log_path``: the spare
        if one is alive, else a new process."""
        proc = self._take_spare(f"{name} {claim} {log_path}\n")
        if proc is None:
            with open(log_path, "ab") as log_file:
                proc = start_batch([*WORKER, name, claim], stdin=subprocess.PIPE,
                                   stdout=log_file, stderr=subprocess.STDOUT, env=self._env())
        return DriverProcess(name, claim, proc, log_path)

    def keep_warm(self) -> None:
        """Start a spare unless one is alive (or spares are off): it imports Ray and torch,
        joins the cluster, says ``ready`` and waits for a study on its stdin."""
        if self.settings.warm_drivers and (self.spare is None or self.spare.poll() is not None):
            said = _Announcement()
            self.spare = start_batch([*WORKER, "--warm"], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                     env=self._env())
            self._said = said
            threading.Thread(target=said.read, args=(self.spare,), daemon=True,
                             name="hpo-warm-driver").start()

    def wait_ready(self, timeout_s: float) -> bool:
        """Wait up to ``timeout_s`` seconds for the spare's line; whether it came."""
        return self._said.done.wait(timeout_s)

    def state(self) -> str:
        """The spare's state: ``ready`` (imports done, cluster joined), ``unjoined``
        (imports done, the cluster could not be joined: a study handed to it tries again),
        ``starting``, or ``none`` (none is kept while studies run here, or it exited)."""
        spare, said = self.spare, self._said
        if spare is None or spare.poll() is not None:
            return "none"
        return said.state if said.done.is_set() else "starting"

    def close(self, grace_s: float) -> None:
        """Stop the spare (it has no study)."""
        if self.spare is not None:
            stop_process(self.spare, grace_s)

    def _take_spare(self, assignment: str) -> subprocess.Popen | None:
        spare, self.spare = self.spare, None
        if spare is None or spare.poll() is not None:
            return None
        try:
            spare.stdin.write(assignment.encode())
            spare.stdin.flush()
        except OSError:
            spare.kill()
            return None
        return spare

    def _env(self) -> dict[str, str]:
        return child_env(self.settings.worker_env())


class _Announcement:
    """The one line a spare writes on its stdout; ``done`` is set once it came."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.state = "starting"

    def read(self, spare: subprocess.Popen) -> None:
        """Read the line (in a thread of its own); the pipe then reaches end of file."""
        with contextlib.suppress(OSError, ValueError), spare.stdout:
            said = spare.stdout.readline().strip().decode(errors="replace")
            if said in ("ready", "unjoined"):
                self.state = said
                self.done.set()
            spare.stdout.read()


# -- the driver's end of the pipes ------------------------------------------------------


def watch_for_interrupt(event: threading.Event) -> None:
    """Set ``event`` when the service writes ``interrupt`` to this process's stdin, or
    closes it. Without a pipe on stdin (a driver started by hand) nothing interrupts."""
    if not stat.S_ISFIFO(os.fstat(sys.stdin.fileno()).st_mode):
        return

    def watch() -> None:
        for line in sys.stdin:
            if line.strip() == "interrupt":
                break
        event.set()

    threading.Thread(target=watch, name="hpo-interrupt", daemon=True).start()


def wait_for_study() -> list[str] | None:
    """A spare: import Ray, torch and the driver now, join the cluster, write ``ready`` or
    ``unjoined`` on stdout (the only line it ever writes there), then read ``NAME CLAIM LOG``
    from stdin and send this process's output to ``LOG``; ``[NAME, CLAIM]``, or ``None`` at
    end of input. A connection gone stale meanwhile makes it a cold driver (module doc)."""
    announce = os.fdopen(os.dup(1), "w")
    _redirect_output(os.devnull)  # whatever the imports or Ray print stays off that pipe
    from hpo import board, storage
    from hpo.errors import ClusterError
    from hpo.ray_private import ray_connection_alive
    from hpo.tune.driver import init_ray  # the seconds of imports a cold driver would spend

    # and what a study's first seconds would import or load: its dashboard note's and
    # charts' libraries, Optuna's schema migrations (3 s on 2 cores, after the claim before).
    # Only a head start: one that fails (a broken install) fails again in the study, where
    # its error reaches the study's log, instead of killing the spare with no log at all
    with contextlib.suppress(Exception):
        board.preload()
        storage.preload()

    address = Settings.from_env().ray_address
    joined = False
    if address:
        with contextlib.suppress(ClusterError):
            init_ray(address)
            joined = True
    with contextlib.suppress(OSError):
        announce.write("ready\n" if joined or not address else "unjoined\n")
        announce.close()
    line = sys.stdin.readline().split()
    if len(line) != 3:
        return None
    name, claim, log_path = line
    _redirect_output(log_path)
    if joined and not ray_connection_alive():
        print(f"warm driver: its connection to the Ray cluster at {address} is stale (the "
              f"cluster restarted or is gone); starting afresh", file=sys.stderr, flush=True)
        os.execv(sys.executable, [*WORKER, name, claim])
    return [name, claim]


def _redirect_output(path: str) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2) at ``path``."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


class HangWatch:
    """Which drivers started here have hung (helper-39: SIGSTOP standing in for a deadlock,
    a driver held its study RUNNING and its slot for good, its stop ignored), judged on the
    dispatcher's own clock from what its rounds saw: a driver's heartbeat unchanged, or its
    study asked to stop and still running, for ``patience`` seconds. After a database
    outage no driver could beat: none is taken for hung before it had the patience to beat
    again (helper-40). Killed drivers are kept until they exit (:meth:`reap`).
    """

    def __init__(self) -> None:
        self._beats: dict[str, tuple] = {}  # study: (heartbeat, seen since)
        self._stop_seen: dict[str, float] = {}  # study: since when seen asked to stop
        self._dying: list[DriverProcess] = []  # killed, not yet exited

    def hung(self, rows, patience: float) -> dict[str, str]:
        """The studies of ``rows`` (``(name, heartbeat_at, stop_requested)`` of the RUNNING
        studies driven here; the studies not in them are forgotten) whose driver hung,
        with why: ``{name: "sent no heartbeat" | "ignored the study's stop"}``."""
        now = time.monotonic()
        self._beats = {name: self._beats[name] if name in self._beats
                       and self._beats[name][0] == beat else (beat, now)
                       for name, beat, _ in rows}
        self._stop_seen = {name: self._stop_seen.get(name, now)
                           for name, _, stop in rows if stop}
        out = {}
        for name, _, _ in rows:
            if now - self._beats[name][1] >= patience:
                out[name] = "sent no heartbeat"
            elif now - self._stop_seen.get(name, now) >= patience:
                out[name] = "ignored the study's stop"
        for name in out:
            del self._beats[name]
            self._stop_seen.pop(name, None)
        return out

    def kill(self, driver: DriverProcess) -> None:
        """SIGKILL ``driver``; one stuck in the kernel (a hung NFS read) dies when that
        returns, and does not block the caller past 5 s."""
        driver.proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            driver.proc.wait(5)
        self._dying.append(driver)

    def reap(self) -> None:
        """Close the killed drivers that exited (no zombie)."""
        for driver in [d for d in self._dying if d.exit_code() is not None]:
            self._dying.remove(driver)
            driver.close()
