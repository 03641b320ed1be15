"""The trial gate: an optional hook that lets a driver's trials start only when allowed.

``run_study(gate=...)`` asks the gate before each trial starts and tells it when the trial
ends; a gate that refuses makes the trial wait (never fail): Tune asks again a moment
later. The service implements it with per-owner quotas (``service.quotas``, issue 15.2);
hpo knows nothing of owners or databases. This module imports no Ray.

Where the driver asks (``hpo.tune``):

* a searcher study (TPE, random, ...): :class:`hpo.tune.searcher.StudySearcher` asks before
  it asks Optuna for a trial (or adopts an orphan to resume), and returns ``None`` when
  refused, so no Optuna trial is created for a trial that cannot start;
* a population study (PBT, PB2: Ray refuses any searcher there):
  :class:`hpo.tune.searcher.GatedVariants`, Ray's variant generator, asks before it
  creates each member of the population; a member not yet created waits.

A trial holds its slot from then until Tune reports its end (complete, pruned, error,
removed), or, for trials Tune stops with the whole experiment (a stop, an interrupt, the
time budget, an exception), until ``run_study`` returns. A PAUSED trial (Hyperband, PBT
between perturbations) keeps its slot.
"""

from __future__ import annotations

import dataclasses
import itertools
import time
from collections.abc import Callable
from typing import Protocol

from hpo.summary import devices_held

RETRY_S = 1.0  # after a refusal, the gate is not asked again for this long


@dataclasses.dataclass(frozen=True)
class TrialResources:
    """What one trial holds while it runs.

    Attributes:
        gpus: GPUs of the whole trial (``resources.gpus`` times ``resources.workers``;
            fractions allowed), >= 0.
        devices: devices counted by device-seconds: its GPUs, else its CPUs, times its
            workers (``hpo.summary.devices_held``), > 0.
    """

    gpus: float
    devices: float

    @classmethod
    def of(cls, resources) -> TrialResources:
        """From a spec's ``resources`` (``hpo.spec.Resources``)."""
        return cls(gpus=resources.gpus * resources.workers, devices=devices_held(resources))


class TrialGate(Protocol):
    """What ``run_study(gate=...)`` asks; the service's ``QuotaGate`` is one."""

    def acquire(self, trial_id: str, resources: TrialResources) -> bool:
        """Whether trial ``trial_id`` may start now; True means it holds a slot until
        ``release``. Called again for the same id only after a refusal."""

    def release(self, trial_id: str, device_seconds: float) -> None:
        """Trial ``trial_id`` ended (or will not start) after holding its slot for
        ``device_seconds`` (seconds held times ``resources.devices``, >= 0)."""


class GateKeeper:
    """The driver's side of a gate: slots held by this run, their start times, and a pause
    of ``retry_s`` seconds after a refusal (Tune asks for a trial about ten times a
    second; the gate is asked at most once per ``retry_s`` while it refuses).

    Args:
        gate: the gate, or ``None`` (every trial may start; nothing is held).
        resources: what each trial of the study holds.
        clock: monotonic seconds (tests pass their own).
    """

    def __init__(self, gate: TrialGate | None, resources: TrialResources,
                 retry_s: float = RETRY_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.gate, self.resources = gate, resources
        self.retry_s, self.clock = retry_s, clock
        self.held: dict[str, float] = {}  # trial key -> when its slot was taken
        self.refused_at: float | None = None
        self.aliases: dict[str, str] = {}  # Ray trial id -> the key its slot was taken under
        self._keys = itertools.count()

    def __getstate__(self) -> dict:  # Tune pickles its search algorithm; a gate is not state
        return {**self.__dict__, "gate": None, "_keys": None}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._keys = itertools.count()

    def new_key(self) -> str:
        """A key for a slot taken before Tune names its trial (``bind`` names it later)."""
        return f"slot-{next(self._keys)}"

    def acquire(self, key: str) -> bool:
        """Take a slot for ``key``; False (without asking the gate) within ``retry_s`` of a
        refusal."""
        if self.gate is None:
            return True
        now = self.clock()
        if self.refused_at is not None and now - self.refused_at < self.retry_s:
            return False
        if not self.gate.acquire(key, self.resources):
            self.refused_at = now
            return False
        self.refused_at = None
        self.held[key] = now
        return True

    def bind(self, key: str, trial_id: str) -> None:
        """The slot taken under ``key`` is trial ``trial_id``'s."""
        if key != trial_id:
            self.aliases[trial_id] = key

    def release(self, trial_id: str) -> None:
        """Give back the slot of ``trial_id`` (or of the key it was bound to); nothing if it
        holds none."""
        key = self.aliases.pop(trial_id, trial_id)
        started = self.held.pop(key, None)
        if started is None or self.gate is None:
            return
        self.refused_at = None  # a slot is free now: the next ask need not wait
        self.gate.release(key, max(0.0, self.clock() - started) * self.resources.devices)

    def release_all(self) -> None:
        """Give back every slot still held (the run is ending)."""
        for key in list(self.held):
            self.release(key)
        self.aliases.clear()

    @property
    def n_held(self) -> int:
        return len(self.held)
