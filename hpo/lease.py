"""One driver per study: a lease kept in the study's user attributes.

A second driver started on a study that another live driver is running would
take that driver's RUNNING trials for orphans and run them twice. The lease
(user attribute ``driver``: id, host, pid, heartbeat time) is taken when a
driver starts, renewed every ``HEARTBEAT_S`` seconds by a thread, and released
when it ends. A lease is stale, and may be taken over, when its heartbeat is
older than ``STALE_AFTER_S`` or when its process is gone from this host (a
driver killed with SIGKILL and started again on the same machine goes on at
once).

The check-then-write is not atomic (Optuna has no compare-and-set); two
drivers starting within the same instant are caught by reading the lease back
after writing it, which leaves one of them the loser.
"""

from __future__ import annotations

import os
import socket
import threading
import time
import uuid

import optuna

from hpo.errors import StudyBusyError

LEASE_ATTR = "driver"
HEARTBEAT_S = 5.0
STALE_AFTER_S = 30.0
SETTLE_S = 0.3  # time for a concurrent starter's write to land before reading back


def _alive_here(lease: dict) -> bool:
    if lease.get("host") != socket.gethostname():
        return True  # cannot tell: trust the heartbeat
    try:
        os.kill(int(lease["pid"]), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, KeyError):
        return True
    return True


def is_live(lease: dict | None, now: float | None = None) -> bool:
    """Whether ``lease`` belongs to a driver that may still be running."""
    if not lease:
        return False
    now = time.time() if now is None else now
    return now - float(lease.get("heartbeat", 0)) < STALE_AFTER_S and _alive_here(lease)


class DriverLease:
    """Context manager holding a study's driver lease (see module doc).

    Raises:
        StudyBusyError: on entry, when a live driver holds the study.
    """

    def __init__(self, study: optuna.Study) -> None:
        self.study = study
        self.lease = {"id": uuid.uuid4().hex, "host": socket.gethostname(), "pid": os.getpid()}
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._renew, name="hpo-lease", daemon=True)

    def _held_by_other(self) -> dict | None:
        current = self.study.user_attrs.get(LEASE_ATTR)  # user_attrs reads the storage
        if current and current.get("id") != self.lease["id"] and is_live(current):
            return current
        return None

    def _write(self) -> None:
        self.study.set_user_attr(LEASE_ATTR, {**self.lease, "heartbeat": time.time()})

    def __enter__(self) -> DriverLease:
        for attempt in range(2):
            other = self._held_by_other()
            if other is not None:
                age = time.time() - float(other.get("heartbeat", 0))
                raise StudyBusyError(
                    f"study {self.study.study_name!r} is being run by another driver (pid "
                    f"{other.get('pid')} on {other.get('host')}, heartbeat {age:.0f} s ago); "
                    f"it is free again {STALE_AFTER_S:.0f} s after that driver stops")
            if attempt == 0:
                self._write()
                time.sleep(SETTLE_S)
        self._thread.start()
        return self

    def _renew(self) -> None:
        while not self._done.wait(HEARTBEAT_S):
            try:
                self._write()
            except Exception:  # noqa: BLE001 - a missed beat is retried; staleness is 30 s
                continue

    def __exit__(self, *exc) -> None:
        self._done.set()
        self._thread.join(timeout=HEARTBEAT_S)
        try:
            if self.study.user_attrs.get(LEASE_ATTR, {}).get("id") == self.lease["id"]:
                self.study.set_user_attr(LEASE_ATTR, {})
        except Exception:  # noqa: BLE001 - an unreleased lease goes stale by itself
            pass
