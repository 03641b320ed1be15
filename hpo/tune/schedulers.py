"""Ray Tune schedulers built from a spec, each wrapped in :class:`RecordingScheduler`.

Budgets are counted in optimizer updates: every scheduler uses
``time_attr="step"``, the ``step`` metric that ``trainers.fit`` reports.
:class:`RecordingScheduler` sits between Tune and the spec's scheduler: it writes
each result into the study record exactly once, then the scheduler's decision on
it; whether a stopped trial counts as PRUNED is decided by the record from what
it was told (``hpo.record``).

A new driver of a study refills the scheduler's state from the stored study where it
can (``hpo.tune.restore``).
"""

from __future__ import annotations

from ray.tune.schedulers import (
    AsyncHyperBandScheduler,
    FIFOScheduler,
    MedianStoppingRule,
    TrialScheduler,
)

from hpo.ray_private import (
    HyperBand,
    asha_bracket_of,
    asha_brackets,
    asha_place,
    median_stopped,
)
from hpo.record import StudyRecord
from hpo.space import build_pruner
from hpo.spec import StudySpec
from hpo.tune.mo_asha import MultiObjectiveASHA
from hpo.tune.restore import (
    drop_restored_repeat,
    rekey_asha,
    rekey_median,
    restore_asha,
    restore_median,
    restored_key,
    stored_brackets,
    stored_curves,
    stored_median_stops,
    stored_rungs,
)

TIME_ATTR = "step"


class RecordingScheduler(TrialScheduler):
    """Tune's scheduler: ``inner`` decides, the study record is told.

    Every public hook of Ray's ``TrialScheduler`` is delegated to ``inner``.
    On each result of a trial the record knows, the result is recorded first
    (``record.result``: an Optuna pruner then reads it from the storage), then
    ``inner`` decides, then the decision is recorded (``record.decided``). A trial
    that Tune removes while PAUSED or PENDING (Hyperband discarding a paused
    trial of its bracket) was stopped by ``inner`` when ``removal_stops``: no
    result marks that stop, so it is recorded as a STOP at removal.

    Args:
        inner: the scheduler that decides (ASHA, Hyperband, PBT, ...).
        record: the study's record.
        label: who stopped a trial, as the record's ``stopped_by`` attribute says.
        removal_stops: whether a removal counts as ``inner``'s STOP (the
            early-stopping schedulers; not FIFO, an Optuna pruner or PBT).
    """

    def __init__(self, inner: TrialScheduler, record: StudyRecord, label: str,
                 removal_stops: bool = False) -> None:
        # TrialScheduler.__init__ only tags usage; ``inner`` did that for itself
        self.inner, self.record, self.label = inner, record, label
        self.removal_stops = removal_stops
        self._resumed_median: set[str] = set()  # rekeyed, their first report not yet seen

    @property
    def metric(self):
        return self.inner.metric

    @property
    def supports_buffered_results(self) -> bool:
        return self.inner.supports_buffered_results

    def set_search_properties(self, metric, mode, **spec) -> bool:
        return self.inner.set_search_properties(metric, mode, **spec)

    def on_trial_add(self, tune_controller, trial) -> None:
        self.inner.on_trial_add(tune_controller, trial)
        restorable = isinstance(self.inner, (AsyncHyperBandScheduler, MedianStoppingRule))
        if restorable and self.record.knows(trial.trial_id):  # one a new driver resumes
            old = restored_key(self.record.rung_key(trial.trial_id))  # keeps its past
            if isinstance(self.inner, AsyncHyperBandScheduler):
                if asha_brackets(self.inner) > 1:  # its own bracket, where its values are
                    drawn = asha_bracket_of(self.inner, trial.trial_id)
                    kept = self.record.asha_bracket(trial.trial_id, drawn)
                    if kept != drawn and kept < asha_brackets(self.inner):
                        asha_place(self.inner, trial.trial_id, kept)
                rekey_asha(self.inner, old, trial.trial_id)
            elif rekey_median(self.inner, old, trial):
                self._resumed_median.add(trial.trial_id)
                if trial not in median_stopped(self.inner):  # resumed before its stop: to
                    self.record.median_stopped(trial.trial_id, None)  # be judged again

    def on_trial_result(self, tune_controller, trial, result) -> str:
        if trial.trial_id in self._resumed_median:  # its first report since the rekey
            self._resumed_median.discard(trial.trial_id)
            drop_restored_repeat(self.inner, trial, result, TIME_ATTR)
        known = self.record.knows(trial.trial_id)
        if known:
            self.record.result(trial.trial_id, result)
        median = isinstance(self.inner, MedianStoppingRule)
        judged = median and trial not in median_stopped(self.inner)
        decision = self.inner.on_trial_result(tune_controller, trial, result)
        if known:
            self.record.decided(trial.trial_id, decision, self.label)
            if judged and decision == TrialScheduler.PAUSE and trial in median_stopped(
                    self.inner):  # hard_stop: false stopped it (unjudged from now on)
                self.record.median_stopped(trial.trial_id, result[TIME_ATTR])
        return decision

    def on_trial_complete(self, tune_controller, trial, result) -> None:
        self.inner.on_trial_complete(tune_controller, trial, result)

    def on_trial_error(self, tune_controller, trial) -> None:
        self.inner.on_trial_error(tune_controller, trial)

    def on_trial_remove(self, tune_controller, trial) -> None:
        if self.removal_stops and self.record.knows(trial.trial_id):
            self.record.decided(trial.trial_id, TrialScheduler.STOP, self.label)
        self.inner.on_trial_remove(tune_controller, trial)

    def choose_trial_to_run(self, tune_controller):
        return self.inner.choose_trial_to_run(tune_controller)

    def debug_string(self) -> str:
        return self.inner.debug_string()

    def save(self, checkpoint_path: str) -> None:
        self.inner.save(checkpoint_path)

    def restore(self, checkpoint_path: str) -> None:
        self.inner.restore(checkpoint_path)


class OptunaPrunerScheduler(FIFOScheduler):
    """Lets any Optuna pruner stop Ray Tune trials: on every result, ask ``pruner.prune``.

    Run inside :class:`RecordingScheduler`, which writes the result as the
    trial's intermediate value first (the pruner reads the study from the
    storage), so the pruner sees exactly what the dashboard shows.
    """

    def __init__(self, record: StudyRecord, pruner) -> None:
        super().__init__()
        self.record, self.pruner = record, pruner

    def on_trial_result(self, tune_controller, trial, result):
        if not self.record.knows(trial.trial_id) or TIME_ATTR not in result:
            return TrialScheduler.CONTINUE
        if self.pruner.prune(self.record.study, self.record.frozen(trial.trial_id)):
            return TrialScheduler.STOP
        return TrialScheduler.CONTINUE


def build_scheduler(spec: StudySpec, record: StudyRecord, planned_updates: int
                    ) -> RecordingScheduler:
    """The spec's scheduler, recording; ``planned_updates`` is the default ``max_t``.

    Metric and mode are not given here: Tune passes those of ``TuneConfig``.
    Population schedulers (PBT, PB2) are built by ``hpo.tune.pbt.build_pbt``.

    Raises:
        ValueError: ``spec.scheduler.name`` is not one of asha, mo-asha, hyperband,
            median, optuna-pruner, fifo.
    """
    s = spec.scheduler
    if s.name == "asha":
        inner = AsyncHyperBandScheduler(
            time_attr=TIME_ATTR, max_t=s.max_t or planned_updates,
            grace_period=s.grace_period, reduction_factor=s.reduction_factor,
            brackets=s.brackets)
        if record is not None:  # a restarted driver's rungs
            maximize = spec.objectives[0].direction == "maximize"
            restore_asha(inner, s.max_t or planned_updates, stored_curves(record),
                         1.0 if maximize else -1.0, stored_brackets(record))
    elif s.name == "mo-asha":
        inner = MultiObjectiveASHA(
            [(o.metric, o.direction) for o in spec.objectives], TIME_ATTR,
            grace_period=s.grace_period, max_t=s.max_t or planned_updates,
            reduction_factor=s.reduction_factor,
            key=record.rung_key if record is not None else None)
        if record is not None:  # a restarted driver ranks against the earlier vectors
            inner.rungs.restore(stored_rungs(record))
            inner.rungs.on_record = record.rung_recorded
    elif s.name == "hyperband":
        inner = HyperBand(time_attr=TIME_ATTR, max_t=s.max_t or planned_updates,
                          reduction_factor=s.reduction_factor)
    elif s.name == "median":
        inner = MedianStoppingRule(
            time_attr=TIME_ATTR, grace_period=s.grace_period,
            min_samples_required=s.min_samples_required, min_time_slice=s.min_time_slice,
            hard_stop=s.hard_stop)
        if record is not None:  # a restarted driver's running means
            restore_median(inner, TIME_ATTR, spec.objectives[0].metric,
                           stored_curves(record), stored_median_stops(record))
    elif s.name == "optuna-pruner":
        return RecordingScheduler(OptunaPrunerScheduler(record, build_pruner(s.pruner)),
                                  record, f"optuna-{s.pruner.name}")
    elif s.name == "fifo":
        return RecordingScheduler(FIFOScheduler(), record, s.name)
    else:
        raise ValueError(f"scheduler {s.name!r} is not run by build_scheduler")
    return RecordingScheduler(inner, record, s.name, removal_stops=True)
