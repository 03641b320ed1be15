"""How the training loop talks to the outside: the ``Reporter`` protocol.

At every evaluation the loop calls ``reporter.report(metrics, save_checkpoint)``
and obeys the returned :class:`Decision`. A reporter that wants the state of
this very step persisted (Ray Tune attaches a checkpoint to a result; PBT needs
one to exploit) calls ``save_checkpoint()``, which writes a complete checkpoint
atomically and returns its directory.

Under DDP every rank calls ``report`` with the same, already reduced metrics;
``save_checkpoint`` writes only on rank 0 (it returns ``None`` elsewhere), and
rank 0's decision is the one every rank follows.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

# Result keys of a report besides the loop's own (``trainers.loop.LOOP_METRICS``) that a
# task's metric must not be named: Ray Tune's (``ray.tune.result``: ``done``,
# ``should_checkpoint``, ``trial_id``, ``experiment_tag`` and its ``AUTO_RESULT_KEYS``) and
# what the product's trainable adds (``node_id``, ``stop_reason``). A task metric ``done``
# ended its trial at the first report, one named ``step`` moved its curve (helper-41).
RESERVED_RESULT_KEYS = frozenset({
    "done", "should_checkpoint", "trial_id", "experiment_tag", "training_iteration",
    "time_total_s", "episodes_total", "timesteps_total", "node_ip", "hostname", "pid",
    "time_this_iter_s", "timestamp", "date", "time_since_restore", "timesteps_since_restore",
    "iterations_since_restore", "config", "checkpoint_dir_name", "node_id", "stop_reason"})

Metrics = Mapping[str, float]
SaveCheckpoint = Callable[[], "Path | None"]


class Decision(enum.Enum):
    """What the loop does after a report."""

    CONTINUE = "continue"
    STOP = "stop"


@runtime_checkable
class Reporter(Protocol):
    """Receives the metrics of every evaluation and decides whether training goes on."""

    def report(self, metrics: Metrics, save_checkpoint: SaveCheckpoint) -> Decision:
        """Take one evaluation's metrics.

        Args:
            metrics: see ``trainers.loop`` for the keys (``step`` = optimizer
                updates so far, ``epoch``, ``train_loss``, the task's evaluation
                metrics, ``lr``, ``grad_norm``, ...).
            save_checkpoint: call it to write a checkpoint of the current state;
                returns the checkpoint directory (``None`` on ranks other than 0
                or when the run has no ``checkpoint_dir``).

        Returns:
            ``Decision.STOP`` to end training after this evaluation.
        """
        ...

    # Optional, not part of the protocol's check: ``stopping(reason: str) -> None`` is
    # called just before the run's last report with why the run stops (``max_updates``,
    # ``max_epochs`` or ``early_stopping``); hpo's reporters pass it on to the record.
    # Optional attribute ``checkpoints_on_request = True``: the loop then writes no
    # checkpoint by itself (neither at evaluations nor at ``checkpoint_interval``), only
    # when the reporter calls ``save_checkpoint`` (hpo's Tune reporter decides which
    # reports carry one).


class NullReporter:
    """A reporter that keeps nothing and never stops training."""

    def report(self, metrics: Metrics, save_checkpoint: SaveCheckpoint) -> Decision:
        return Decision.CONTINUE


class ListReporter:
    """Keeps every report in ``self.reports``; handy in tests and notebooks. Why the run
    stopped is kept in ``self.stops`` as ``(index of the report it came before, reason)``."""

    def __init__(self) -> None:
        self.reports: list[dict[str, float]] = []
        self.stops: list[tuple[int, str]] = []

    def stopping(self, reason: str) -> None:
        """The optional hook (see ``Reporter``): the next report is the run's last."""
        self.stops.append((len(self.reports), reason))

    def report(self, metrics: Metrics, save_checkpoint: SaveCheckpoint) -> Decision:
        self.reports.append(dict(metrics))
        return Decision.CONTINUE
