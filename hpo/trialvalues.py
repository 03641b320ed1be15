"""A finished trial's values, taken from what it reported (``hpo.record``'s rules).

No storage reads; ``set_constraints`` writes the trial's constraints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import optuna

from hpo.spec import StudySpec


def last_values(spec: StudySpec, last: Mapping[str, Any]) -> dict[str, float | None] | None:
    """A multi-objective trial's last reported value of every objective, None where
    missing or not finite (Optuna keeps intermediate values of one objective only);
    None for one objective (its intermediate values hold it) or without a report."""
    if not spec.is_multi_objective or not last:
        return None
    values = {}
    for o in spec.objectives:
        try:
            v = float(last[o.metric])
        except (KeyError, TypeError, ValueError):
            v = math.nan
        values[o.metric] = v if math.isfinite(v) else None
    return values


def final_values(spec: StudySpec, last: Mapping[str, Any],
                 curve: Sequence[tuple[int, float]]) -> list[float] | None:
    """A COMPLETE trial's values: each objective's last reported value, or with
    ``objective_reduce: best`` the best finite value of its ``curve`` ((step, value) of
    the first objective); None when its last report lacks an objective."""
    metrics = [o.metric for o in spec.objectives]
    if not last or any(m not in last for m in metrics):
        return None
    if spec.objective_reduce == "best" and curve:
        pick = max if spec.objectives[0].direction == "maximize" else min
        finite = [v for _, v in curve if math.isfinite(v)]
        return [pick(finite)] if finite else [curve[-1][1]]
    return [float(last[m]) for m in metrics]


def set_constraints(study: optuna.Study, spec: StudySpec, trial_id: int,
                    last: Mapping[str, Any]) -> bool:
    """Record the spec's constraints of a trial from its last report as Optuna
    constraints (``Trial.set_constraint``: TPE and NSGA-II read them, ``best_trial``
    skips infeasible trials); a metric it never reported counts as violated
    (``inf``). Returns whether every bound holds."""
    trial = optuna.Trial(study, trial_id)
    feasible = True
    for c in spec.constraints:
        value = last.get(c.metric)
        try:
            violation = c.violation(float(value))
        except (TypeError, ValueError, OverflowError):  # not a number, or beyond float
            violation = math.inf
        if math.isnan(violation):
            violation = math.inf
        trial.set_constraint(c.key, violation)
        feasible = feasible and violation <= 0
    return feasible
