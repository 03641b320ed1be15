"""The study record's value types: a live trial's progress, an orphan, counts by state,
and the listener protocol (``hpo.record`` re-exports them)."""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import optuna


class TrialListener(Protocol):
    """Told of every trial the record changes (e.g. a summary kept current elsewhere)."""

    def trial_changed(self, trial: optuna.trial.FrozenTrial) -> None:
        """``trial`` as stored right after the change; an exception is logged and ignored."""


@dataclasses.dataclass
class TrialProgress:
    """What the record keeps about one live trial."""

    number: int
    trial_id: int
    started: float | None = None
    wall_time_s: float = 0.0
    last: dict[str, Any] = dataclasses.field(default_factory=dict)
    values: list[tuple[int, float]] = dataclasses.field(default_factory=list)  # (step, objective)
    stopped_by: str | None = None  # who stopped it from outside, if anyone
    decision: str | None = None  # the scheduler's decision on the last result
    told: bool = False
    checkpoint: str | None = None  # the ``checkpoint`` attribute as last written


@dataclasses.dataclass(frozen=True)
class Orphan:
    """A trial a previous driver left RUNNING: its Optuna identity and its last checkpoint."""

    number: int
    trial_id: int
    params: dict[str, Any]
    checkpoint: str | None
    values: list[tuple[int, float]]


@dataclasses.dataclass(frozen=True)
class Counts:
    """Trials of the study by state; ``failed`` excludes requeued trials, counted apart."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    requeued: int = 0

    @property
    def finished(self) -> int:
        """Trials that count against ``budget.n_trials``."""
        return self.complete + self.pruned + self.failed


