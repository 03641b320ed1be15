"""More than one API process on one listening socket (``HPO_API_PROCESSES``).

One Python process answers requests on one core at most (its GIL): under
``bench/load.py`` (20 clients, PostgreSQL) the API process held the GIL nearly all the
time while the machine's other core ran PostgreSQL and the trials. With
``HPO_API_PROCESSES=N``, ``hpo serve`` starts N - 1 more API processes that accept
connections on the socket it bound (the kernel hands each new connection to one of
them), as uvicorn's and gunicorn's ``--workers`` do. The first process keeps everything
else: the dispatcher, the study drivers, the local Ray. The others run the same app
without a dispatcher and read its state from a small file it rewrites after each round
(:class:`DispatcherStatus`), so that ``/readyz`` and ``/metrics`` answer alike whichever
process a request reaches. A create answered by another process wakes the dispatcher with
``SIGUSR1`` (its next round would otherwise start the study within
``HPO_DISPATCH_INTERVAL_S``).

``/metrics`` adds up every process's HTTP counters and histograms through
prometheus-client's multiprocess mode (``PROMETHEUS_MULTIPROC_DIR``, a directory made for
the server's lifetime, set before ``prometheus_client`` is imported and kept out of the
study drivers' environment). An API process that dies is started again; its counts stay.
Each process keeps its own database pools (``HPO_API_THREADS`` connections each).
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from service.errors import ServiceError
from service.process import child_env, describe_exit, stop_process

log = logging.getLogger(__name__)
METRICS_ENV = "PROMETHEUS_MULTIPROC_DIR"  # prometheus-client's own variable
STATUS_ENV = "HPO_DISPATCHER_STATUS"  # where the first process publishes its dispatcher
WAKE_SIGNAL = signal.SIGUSR1
RESTART_DELAY_S = 1.0
STOP_TIMEOUT_S = 15.0


METRICS_DIR_PREFIX = "hpo-api-"


def new_metrics_dir() -> Path:
    """A new folder for the API processes' shared metrics (``use_shared_metrics``), named
    after this process (``hpo-api-<pid>-XXXXXXXX`` in the temporary folder), after removing
    those whose process is gone: ``hpo serve`` removes its own on the way out, but a
    ``kill -9`` left one behind at each crash (helper-39)."""
    from trainers.process import process_alive  # the project's one pid check

    tmp = Path(tempfile.gettempdir())
    for old in tmp.glob(f"{METRICS_DIR_PREFIX}*-*"):
        pid = old.name[len(METRICS_DIR_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not process_alive(int(pid)):
            shutil.rmtree(old, ignore_errors=True)
    return Path(tempfile.mkdtemp(prefix=f"{METRICS_DIR_PREFIX}{os.getpid()}-", dir=tmp))


def use_shared_metrics(directory: Path) -> None:
    """Put prometheus-client in multiprocess mode on ``directory`` for this process and the
    API processes it starts.

    Raises:
        ServiceError: ``prometheus_client`` was imported before (its values would stay
            per process: the variable is read once, at import).
    """
    os.environ[METRICS_ENV] = str(directory)
    from prometheus_client import values

    if values.ValueClass.__name__ != "MmapedValue":
        raise ServiceError("HPO_API_PROCESSES > 1 needs prometheus_client imported after "
                           f"{METRICS_ENV} is set; it was imported before")


def shared_metrics_dir() -> str | None:
    """The multiprocess metrics directory of this process, or ``None`` (one process)."""
    return os.environ.get(METRICS_ENV) or None


class DispatcherStatus:
    """The dispatcher's state in a JSON file: written by the process that runs it after each
    round, read by the other API processes with the interface ``service.health`` and
    ``service.metrics`` read of a ``Dispatcher`` (``alive``, ``warm_driver``,
    ``last_round_at``, ``restarts``, ``takeovers``).

    Args:
        path: the file (replaced whole at each write, never read half-written).
        stale_after_s: a reader calls the dispatcher dead when the file is older (seconds of
            ``time.monotonic``, one clock for every process of the machine on Linux).
    """

    def __init__(self, path: Path, stale_after_s: float = 30.0) -> None:
        self.path = Path(path)
        self.stale_after_s = stale_after_s

    def publish(self, dispatcher) -> None:
        """Write ``dispatcher``'s state; a failed write is logged, never raised (it must not
        stop the dispatcher's loop)."""
        state = {"written_at": time.monotonic(), "alive": dispatcher.alive(),
                 "last_round_at": dispatcher.last_round_at, "restarts": dispatcher.restarts,
                 "takeovers": dispatcher.takeovers, "warm_driver": dispatcher.warm_driver()}
        tmp = self.path.with_name(f".{self.path.name}.{os.getpid()}")
        try:
            tmp.write_text(json.dumps(state))
            os.replace(tmp, self.path)
        except OSError as e:
            log.warning("dispatcher status not written to %s: %s", self.path, e.strerror)

    def _read(self) -> dict:
        try:
            return json.loads(self.path.read_text())
        except (OSError, ValueError):
            return {}

    def alive(self) -> bool:
        state = self._read()
        fresh = time.monotonic() - state.get("written_at", float("-inf")) <= self.stale_after_s
        return bool(state.get("alive")) and fresh

    def warm_driver(self) -> str:
        return self._read().get("warm_driver") or "none"

    @property
    def last_round_at(self) -> float | None:
        return self._read().get("last_round_at")

    @property
    def restarts(self) -> int:
        return int(self._read().get("restarts", 0))

    @property
    def takeovers(self) -> int:
        return int(self._read().get("takeovers", 0))


def wake_first_process() -> None:
    """Ask the first process's dispatcher for a round now (a study was queued here)."""
    parent = os.environ.get("HPO_PARENT_PID")
    if parent is not None and os.getppid() == int(parent):
        with contextlib.suppress(OSError):
            os.kill(int(parent), WAKE_SIGNAL)


class ApiProcesses:
    """``count`` API processes (``python -m service.server --api-process FD``) serving the
    listening socket ``fd``, started again when one exits while the server runs.

    One thread starts, watches and stops them all: each child asks Linux to stop it when
    that thread ends (``service.process.die_with_parent``), so a SIGKILLed server leaves
    none behind.

    Args:
        count: processes besides this one, >= 1.
        fd: the listening socket's file descriptor (inherited by the children).
        env: the children's settings, as environment variables.
    """

    def __init__(self, count: int, fd: int, env: dict[str, str]) -> None:
        self.count = count
        self.fd = fd
        self.env = env
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        self.procs: list[subprocess.Popen] = []

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="hpo-api-processes",
                                        daemon=True)
        self._thread.start()

    def signal_stop(self) -> None:
        """SIGTERM every child now (they finish their requests and exit), without waiting."""
        self._stopping.set()
        for proc in list(self.procs):
            with contextlib.suppress(OSError):
                proc.terminate()

    def stop(self) -> None:
        """Stop every child and wait for them (SIGKILL after ``STOP_TIMEOUT_S``)."""
        self.signal_stop()
        if self._thread is not None:
            self._thread.join()

    def _spawn(self) -> subprocess.Popen:
        argv = [sys.executable, "-m", "service.server", "--api-process", str(self.fd)]
        return subprocess.Popen(argv, env=child_env(self.env), pass_fds=(self.fd,))

    def _run(self) -> None:
        try:
            self.procs = [self._spawn() for _ in range(self.count)]
            while not self._stopping.wait(0.5):
                for i, proc in enumerate(self.procs):
                    code = proc.poll()
                    if code is None or self._stopping.is_set():
                        continue
                    _forget(proc.pid)
                    log.error("API process %d ended (%s); starting another", proc.pid,
                              describe_exit(code))
                    if self._stopping.wait(RESTART_DELAY_S):
                        break
                    self.procs[i] = self._spawn()
        finally:
            for proc in self.procs:
                stop_process(proc, STOP_TIMEOUT_S)
                _forget(proc.pid)


def _forget(pid: int) -> None:
    """Drop a dead process's live-gauge files (prometheus-client's multiprocess mode); its
    counters and histograms stay counted."""
    directory = shared_metrics_dir()
    if directory:
        from prometheus_client import multiprocess

        multiprocess.mark_process_dead(pid, directory)
