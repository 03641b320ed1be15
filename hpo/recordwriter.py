"""Write-behind of a study record's intermediate values, off Ray Tune's event loop.

Tune's function trainables report synchronously: a trial waits after each report
until the driver's event loop has handled it. Every storage write done there (an
intermediate value: a transaction, a network round trip on PostgreSQL) therefore
lengthens every evaluation of every trial. :class:`RecordWriter` does those writes on a
thread of its own, in the order they were queued.

What a ``kill -9`` of the driver can lose, and why that is safe: only values still in
the queue. The record writes a trial's checkpoint location itself, after waiting for the
queue (``StudyRecord.checkpointed``), and only while every value of that trial was
stored, so the stored location is never ahead of the stored curve. A new driver resumes
the trial from that checkpoint; the trial reports the steps after it again, with the same
values (resume is bit for bit), and the curve goes on without a gap or a duplicate (an
intermediate value is keyed by its step; later steps are dropped first, ``drop_after``).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import optuna

from hpo.storage import drop_intermediate_values_after

log = logging.getLogger(__name__)

MAX_QUEUED = 1024  # writes; a full queue makes the caller wait (the storage is behind)
RETRY_WAITS_S = (0.1, 0.5, 2.0)  # a failed write is tried again after each of these


class RecordWriter:
    """One thread doing a storage's intermediate-value writes in order, bounded queue.

    Args:
        storage: the Optuna storage (thread-safe: Optuna's RDBStorage opens a
            session per call).
        max_queued: writes queued at most, >= 1; a write blocks while it is full.
        retry_waits_s: seconds to wait before each new try of a failed write.

    A write that still fails after its retries breaks its trial's stream: that trial's
    later writes are skipped (so nothing of it is stored past the gap) and
    ``flush(trial_id)`` returns the error, once; other trials go on. The thread starts
    with the first write.
    """

    def __init__(self, storage: optuna.storages.BaseStorage, max_queued: int = MAX_QUEUED,
                 retry_waits_s: tuple[float, ...] = RETRY_WAITS_S) -> None:
        self.storage = storage
        self.retry_waits_s = retry_waits_s
        self._queue: queue.Queue[tuple[int, Callable[[], Any]] | None] = queue.Queue(
            max_queued)
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._failed: dict[int, BaseException] = {}  # trial id -> the write's error

    def intermediate_value(self, trial_id: int, step: int, value: float) -> None:
        """Queue ``storage.set_trial_intermediate_value(trial_id, step, value)``."""
        self._put(trial_id,
                  lambda: self.storage.set_trial_intermediate_value(trial_id, step, value))

    def drop_after(self, trial_id: int, step: int) -> None:
        """Queue the removal of the trial's intermediate values after ``step`` (a trial
        resumed from an older checkpoint reports them again)."""
        self._put(trial_id, lambda: drop_intermediate_values_after(self.storage, trial_id,
                                                                   step))

    def failed(self, trial_id: int) -> bool:
        """Whether a write of the trial failed (its later writes are skipped)."""
        return trial_id in self._failed

    def flush(self, trial_id: int | None = None) -> BaseException | None:
        """Wait until every queued write is done; with ``trial_id``, return (and forget)
        the error that broke that trial's stream, if any."""
        if self._thread is not None:
            self._queue.join()
        return self._failed.pop(trial_id, None) if trial_id is not None else None

    def close(self) -> None:
        """Flush, then end the thread (a later write starts a new one). Errors of trials
        that did not end here are logged: their stored checkpoint stops at the gap."""
        self.flush()
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._queue.put(None)
            thread.join()
        for trial_id, error in self._failed.items():
            log.error("trial id %s: its results after a failed write were not stored: %s",
                      trial_id, error)

    def _put(self, trial_id: int, write: Callable[[], Any]) -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="hpo-record-writer",
                                                daemon=True)
                self._thread.start()
        self._queue.put((trial_id, write))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            try:
                if item is None:
                    return
                trial_id, write = item
                if trial_id not in self._failed:
                    self._write(trial_id, write)
            finally:
                self._queue.task_done()

    def _write(self, trial_id: int, write: Callable[[], Any]) -> None:
        for attempt in range(len(self.retry_waits_s) + 1):
            try:
                write()
                return
            except (optuna.exceptions.UpdateFinishedTrialError, KeyError) as e:
                error = e  # not transient: the trial ended, or is gone
                break
            except Exception as e:  # noqa: BLE001 - a lost connection, a locked database
                error = e
                if attempt < len(self.retry_waits_s):
                    time.sleep(self.retry_waits_s[attempt])
        log.error("trial id %s: a result could not be stored: %s", trial_id, error)
        self._failed[trial_id] = error
