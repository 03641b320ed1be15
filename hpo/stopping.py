"""Study-level stopping (spec ``budget.stop_when``): end a study before its trial budget.

Two rules, either or both:

- ``target``: a COMPLETE trial whose objective value reaches the target (``>=`` when
  maximizing, ``<=`` when minimizing) fires it.
- ``no_improvement_trials: N`` (with ``min_delta: d``, default 0): ``N`` finished trials
  in a row, in the order they finished, none of which improved the best objective
  value by more than ``d``, fire it. Finished means COMPLETE or PRUNED (a pruned trial
  improved nothing); FAIL trials do not count, nor a trial PRUNED by the end of a run
  rather than judged (``stopped_by`` in :data:`RUN_ENDS`: a user's stop, the timeout, a
  queued trial never started), which a later run of the study would otherwise count.
  Only a COMPLETE trial's value (a full budget's result) can improve the best; an
  improvement of ``d`` or less leaves the best as it was (Keras' ``EarlyStopping`` rule
  for ``min_delta``).

With spec ``constraints``, an infeasible trial's value is no result either: it fires
no target and improves nothing (it counts as a finished trial that did not improve).

The trials are the study's, those of earlier runs of its driver included. When a rule
fires no new trial starts; the trials running then go on as their scheduler decides
(they complete, or are pruned), so none is left RUNNING, and the study ends COMPLETED
with the rule's ``stop_reason``. Our own rule: ``optuna.terminator`` leaves Optuna's
core in v6, and its regret-bound rule needs a Gaussian process per check.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Sequence

import optuna
from optuna.trial import FrozenTrial, TrialState

__all__ = ["RUN_ENDS", "STOP_REASON_ATTR", "StudyStopRule", "stop_reason"]

STOP_REASON_ATTR = "stop_reason"  # the Optuna study's user attribute, once a rule fired
# stopped_by of trials ended PRUNED by their run's end, not by a scheduler's judgement
# (hpo.tune.driver: end_open_trials, run_study's end_waiting)
RUN_ENDS = ("user", "timeout", "budget", "stop_when", "study_failed")
_FAR_FUTURE = dt.datetime.max


def _value(t: FrozenTrial) -> float | None:
    """The trial's objective value where it is a result: COMPLETE, finite and feasible
    (an infeasible trial, spec ``constraints``, is never the best: ``hpo.summary``)."""
    if t.state != TrialState.COMPLETE or not t.values or not math.isfinite(t.values[0]):
        return None
    if not all(c <= 0.0 for c in t.constraints.values()):
        return None
    return t.values[0]


def _fmt(x: float) -> str:
    return f"{x:.6g}"


def stop_reason(trials: Sequence[FrozenTrial], *, metric: str, maximize: bool,
                target: float | None = None, no_improvement_trials: int | None = None,
                min_delta: float = 0.0) -> str | None:
    """Why the study should stop now, or ``None`` while no rule fires.

    Args:
        trials: the study's trials, any order and states (only COMPLETE and PRUNED
            count, in the order of ``datetime_complete``, then number; not those PRUNED
            by a run's end, :data:`RUN_ENDS`).
        metric: the objective's name, for the reason's text.
        maximize: the objective's direction.
        target: the ``target`` rule's value, if set.
        no_improvement_trials: the ``no_improvement_trials`` rule's ``N`` (>= 1), if set.
        min_delta: the smallest change that counts as an improvement (>= 0), in the
            objective's units.

    Returns:
        One line naming the rule (``stop_when.target`` or
        ``stop_when.no_improvement_trials``), the trials it looked at and the values.
    """
    finished = sorted((t for t in trials if t.state == TrialState.COMPLETE or (
                           t.state == TrialState.PRUNED
                           and t.user_attrs.get("stopped_by") not in RUN_ENDS)),
                      key=lambda t: (t.datetime_complete or _FAR_FUTURE, t.number))
    best: FrozenTrial | None = None
    since = 0  # finished trials since the best one (since the first, before any best)
    infeasible = False  # an infeasible COMPLETE trial was seen
    for count, t in enumerate(finished, start=1):
        value = _value(t)
        infeasible = infeasible or (value is None and t.state == TrialState.COMPLETE
                                    and bool(t.constraints))
        if value is not None and target is not None and (
                value >= target if maximize else value <= target):
            return (f"stop_when.target: trial {t.number}'s {metric} {_fmt(value)} reached "
                    f"the target {_fmt(target)} (when {_trials(count)} had finished)")
        if value is not None and (best is None or (
                value > best.values[0] + min_delta if maximize
                else value < best.values[0] - min_delta)):
            best, since = t, 0
            continue
        since += 1
        if no_improvement_trials is not None and since >= no_improvement_trials:
            if best is None:
                return (f"stop_when.no_improvement_trials: {_trials(since)} finished, none "
                        f"of them COMPLETE{' and feasible' if infeasible else ''} "
                        f"(when {_trials(count)} had finished)")
            delta = f" by more than {_fmt(min_delta)}" if min_delta else ""
            return (f"stop_when.no_improvement_trials: {_trials(since)} finished since "
                    f"trial {best.number} set the best {metric} {_fmt(best.values[0])}, none "
                    f"improving it{delta} (when {_trials(count)} had finished)")
    return None


def _trials(n: int) -> str:
    return f"{n} trial" if n == 1 else f"{n} trials"


class StudyStopRule:
    """The spec's ``budget.stop_when`` over one study, checked before each new trial.

    Args:
        study: the Optuna study (its trials are read at each :meth:`check`).
        metric, maximize, target, no_improvement_trials, min_delta: as
            :func:`stop_reason` takes them.
    """

    def __init__(self, study: optuna.Study, *, metric: str, maximize: bool,
                 target: float | None, no_improvement_trials: int | None,
                 min_delta: float) -> None:
        self.study = study
        self.rule = dict(metric=metric, maximize=maximize, target=target,
                         no_improvement_trials=no_improvement_trials, min_delta=min_delta)
        self.reason: str | None = None
        self._seen = -1  # finished trials at the last check

    def check(self) -> str | None:
        """The reason the study stops (kept once a rule fired), or ``None``; the trials
        are read only when more have finished since the last check."""
        if self.reason is not None:
            return self.reason
        trials = self.study.get_trials(deepcopy=False,
                                       states=(TrialState.COMPLETE, TrialState.PRUNED))
        if len(trials) != self._seen:
            self._seen = len(trials)
            self.reason = stop_reason(trials, **self.rule)
            if self.reason is not None:
                self.study.set_user_attr(STOP_REASON_ATTR, self.reason)
        return self.reason
