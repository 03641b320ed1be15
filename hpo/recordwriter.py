"""Write-behind of a study record's per-result writes, off Ray Tune's event loop.

Tune's function trainables report synchronously: a trial waits after each report
until the driver's event loop has handled it. Every storage write done there (an
intermediate value, a checkpoint location: a transaction each, a network round trip
on PostgreSQL) therefore lengthens every evaluation of every trial. :class:`RecordWriter`
does those writes on a thread of its own, in the order they were queued.

What a ``kill -9`` of the driver can lose, and why that is safe: only writes still in the
queue. They are done in order, and a trial's checkpoint location is queued after the
values it reported up to that checkpoint, so the stored location never runs ahead of the
stored curve. A new driver resumes the trial from that checkpoint (``StudyRecord.adopt``);
the trial reports the steps after it again, with the same values (resume is bit for bit),
and the curve goes on without a gap or a duplicate (an intermediate value is keyed by its
step).
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable
from typing import Any

import optuna

log = logging.getLogger(__name__)

MAX_QUEUED = 1024  # writes; a full queue makes the caller wait (the storage is behind)


class RecordWriter:
    """One thread doing a storage's result writes in order, with a bounded queue.

    Args:
        storage: the Optuna storage (thread-safe: Optuna's RDBStorage opens a
            session per call).
        max_queued: writes queued at most, >= 1; ``write_*`` blocks while full.

    A write that raises is logged; the first such error is raised again, once, by the
    next ``flush`` (the record's caller then sees it, as it did when writes were
    synchronous). The writer's thread starts with the first write.
    """

    def __init__(self, storage: optuna.storages.BaseStorage,
                 max_queued: int = MAX_QUEUED) -> None:
        self.storage = storage
        self._queue: queue.Queue[Callable[[], Any] | None] = queue.Queue(max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._error: BaseException | None = None

    def intermediate_value(self, trial_id: int, step: int, value: float) -> None:
        """Queue ``storage.set_trial_intermediate_value(trial_id, step, value)``."""
        self._put(lambda: self.storage.set_trial_intermediate_value(trial_id, step, value))

    def user_attr(self, trial_id: int, key: str, value: Any) -> None:
        """Queue ``storage.set_trial_user_attr(trial_id, key, value)``."""
        self._put(lambda: self.storage.set_trial_user_attr(trial_id, key, value))

    def flush(self) -> None:
        """Wait until every queued write is done.

        Raises:
            the first exception a write raised since the last flush (once).
        """
        if self._thread is not None:
            self._queue.join()
        error, self._error = self._error, None
        if error is not None:
            raise error

    def close(self) -> None:
        """Flush, then end the thread (a later write starts a new one).

        Raises:
            as ``flush``; the thread ends either way.
        """
        try:
            self.flush()
        finally:
            with self._lock:
                thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.put(None)
                thread.join()

    def _put(self, write: Callable[[], Any]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hpo-record-writer",
                                                daemon=True)
                self._thread.start()
        self._queue.put(write)

    def _run(self) -> None:
        while True:
            write = self._queue.get()
            try:
                if write is None:
                    return
                write()
            except Exception as e:  # noqa: BLE001 - kept for flush, which raises it
                log.exception("a queued record write failed")
                if self._error is None:
                    self._error = e
            finally:
                self._queue.task_done()
