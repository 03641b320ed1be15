"""Ray Tune schedulers built from a spec, with their STOP decisions recorded.

Budgets are counted in optimizer updates: every scheduler uses
``time_attr="step"``, the ``step`` metric that ``trainers.fit`` reports.
Each Ray scheduler is subclassed with :class:`_RecordStops`, which notes who
stopped a trial (the record's ``stopped_by`` attribute); whether a stopped trial
counts as PRUNED is decided by the record from the budget it reached.
"""

from __future__ import annotations

from ray.tune.schedulers import (
    AsyncHyperBandScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    TrialScheduler,
)

from hpo.record import StudyRecord
from hpo.space import build_pruner
from hpo.spec import StudySpec

TIME_ATTR = "step"


class _RecordStops:
    """Mixin: note every STOP decision of the scheduler in the study record."""

    record: StudyRecord
    label: str

    def on_trial_result(self, tune_controller, trial, result):
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.STOP:
            self.record.note_stop(trial.trial_id, self.label)
        return decision

    def on_trial_remove(self, tune_controller, trial):
        # Tune calls this when a scheduler stops a PAUSED or PENDING trial (Hyperband
        # discarding a paused trial of its bracket): no result marks that stop.
        self.record.note_stop(trial.trial_id, self.label)
        return super().on_trial_remove(tune_controller, trial)


def _recording(base: type, record: StudyRecord, label: str, **kwargs) -> TrialScheduler:
    """``base`` with its stops recorded (``base`` may already be a recording subclass)."""
    cls = base if issubclass(base, _RecordStops) else type(
        f"Recording{base.__name__}", (_RecordStops, base), {})
    scheduler = cls(**kwargs)
    scheduler.record, scheduler.label = record, label
    return scheduler


class RecordingHyperBand(_RecordStops, HyperBandScheduler):
    """Ray's synchronous Hyperband, with fixes at its pause and trial-removal seams.

    * A trial that reached ``max_t`` is stopped, not paused to wait for its
      bracket-mates: it has nothing left to train, and a pause decided while its
      checkpoint is being saved is applied after the bracket is cleaned up, which
      left it PAUSED forever and Tune waiting on it (seen with ray 2.60; the
      paused-forever lineage of ray#6780 and ray#39157).
    * A trial that ends by itself (it trained to its end) is removed from its
      bracket without being noted as stopped: Ray routes ``on_trial_complete``
      through ``on_trial_remove``, which also serves for the trials it stops.
    * When a removal finishes the bracket, its PAUSED trials are stopped. Ray's
      ``on_trial_remove`` skips a bracket that the removal finished.
    """

    def on_trial_result(self, tune_controller, trial, result):
        decision = super().on_trial_result(tune_controller, trial, result)
        if decision == TrialScheduler.PAUSE and result.get(self._time_attr, 0) >= self._max_t_attr:
            self.record.note_stop(trial.trial_id, self.label)
            return TrialScheduler.STOP
        return decision

    def on_trial_complete(self, tune_controller, trial, result):
        self._remove(tune_controller, trial)

    def on_trial_error(self, tune_controller, trial):
        self._remove(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial):
        self.record.note_stop(trial.trial_id, self.label)
        self._remove(tune_controller, trial)

    def _remove(self, tune_controller, trial) -> None:
        bracket, _ = self._trial_info[trial]
        HyperBandScheduler.on_trial_remove(self, tune_controller, trial)
        if bracket.finished():
            bracket.cleanup_full(tune_controller)


class OptunaPrunerScheduler(FIFOScheduler):
    """Lets any Optuna pruner stop Ray Tune trials: on every result, ask ``pruner.prune``.

    The result is first written as the trial's intermediate value (the pruner
    reads the study from the storage), so the pruner sees exactly what the
    dashboard shows.
    """

    def __init__(self, record: StudyRecord, pruner, label: str) -> None:
        super().__init__()
        self.record, self.pruner, self.label = record, pruner, label

    def on_trial_result(self, tune_controller, trial, result):
        if not self.record.knows(trial.trial_id) or TIME_ATTR not in result:
            return TrialScheduler.CONTINUE
        self.record.result(trial.trial_id, result)
        if self.pruner.prune(self.record.study, self.record.frozen(trial.trial_id)):
            self.record.note_stop(trial.trial_id, self.label)
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE


def build_scheduler(spec: StudySpec, record: StudyRecord, planned_updates: int
                    ) -> TrialScheduler:
    """The spec's scheduler; ``planned_updates`` is the default ``max_t``.

    Metric and mode are not given here: Tune passes those of ``TuneConfig``.
    """
    s = spec.scheduler
    if s.name == "asha":
        return _recording(AsyncHyperBandScheduler, record, "asha", time_attr=TIME_ATTR,
                          max_t=s.max_t or planned_updates, grace_period=s.grace_period,
                          reduction_factor=s.reduction_factor, brackets=s.brackets)
    if s.name == "hyperband":
        return _recording(RecordingHyperBand, record, "hyperband", time_attr=TIME_ATTR,
                          max_t=s.max_t or planned_updates, reduction_factor=s.reduction_factor)
    if s.name == "median":
        return _recording(MedianStoppingRule, record, "median", time_attr=TIME_ATTR,
                          grace_period=s.grace_period,
                          min_samples_required=s.min_samples_required,
                          min_time_slice=s.min_time_slice, hard_stop=s.hard_stop)
    if s.name == "optuna-pruner":
        return OptunaPrunerScheduler(record, build_pruner(s.pruner), f"optuna-{s.pruner.name}")
    if s.name == "fifo":
        return FIFOScheduler()
    raise ValueError(f"scheduler {s.name!r} is not run by build_scheduler")
