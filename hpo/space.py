"""Search spaces and samplers: the spec's parameters as Optuna distributions and samplers."""

from __future__ import annotations

import math
from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from hpo.params import CategoricalParam, FloatParam, IntParam
from hpo.spec import StudySpec


def distribution(param: FloatParam | IntParam | CategoricalParam) -> BaseDistribution:
    """The Optuna distribution of one search-space parameter."""
    if isinstance(param, FloatParam):
        return FloatDistribution(param.low, param.high, log=param.log, step=param.step)
    if isinstance(param, IntParam):
        return IntDistribution(param.low, param.high, log=param.log, step=param.step)
    return CategoricalDistribution(param.choices)


def distributions(spec: StudySpec) -> dict[str, BaseDistribution]:
    """Every parameter of the spec's search space, in spec order."""
    return {name: distribution(p) for name, p in spec.search_space.items()}


def grid_count(param: FloatParam | IntParam) -> int | None:
    """Number of points ``low + k*step`` (k = 0, 1, ...) of a numeric parameter's grid.

    Every int parameter has one (``step`` defaults to 1, log ones too); a float
    parameter only with a ``step``: ``None`` for a continuous one. The spec's
    validation guarantees that ``step`` divides ``high - low``.
    """
    if isinstance(param, FloatParam) and param.step is None:
        return None
    return round((param.high - param.low) / param.step) + 1


def grid_point(param: FloatParam | IntParam, k: int) -> int | float:
    """The grid's ``k``-th value, ``low + k*step`` for ``0 <= k < grid_count(param)``.

    A float is rounded 12 digits below the step's own, so that ``0.1 + 2*0.1``
    is ``0.3`` on every path (Ray's domains, PBT's explore, the grid sampler).
    """
    if isinstance(param, IntParam):
        return param.low + k * param.step
    digits = 12 - min(0, math.floor(math.log10(param.step)))
    return min(round(param.low + k * param.step, digits), param.high)


def snap(param: FloatParam | IntParam | CategoricalParam, value: Any) -> Any:
    """The point of ``param`` nearest to ``value``: clipped into ``[low, high]``, then
    put on the grid (an int, or a float on ``low + k*step``). Categorical values pass
    unchanged. Used for values that come from outside the spec's own draws (PBT's
    perturbation by 0.8 or 1.2, PB2's GP-chosen values)."""
    if isinstance(param, CategoricalParam):
        return value
    value = min(max(value, param.low), param.high)
    n = grid_count(param)
    if n is None:
        return float(value)
    k = min(max(round((value - param.low) / param.step), 0), n - 1)
    return grid_point(param, k)


def grid_values(param: FloatParam | IntParam | CategoricalParam) -> list[Any]:
    """The points of a parameter on a grid: its choices, or ``low, low + step, ..., high``.

    Raises:
        ValueError: a float parameter without a step (it has no grid).
    """
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    n = grid_count(param)
    if n is None:
        raise ValueError(f"a float parameter without a step has no grid: {param}")
    return [grid_point(param, k) for k in range(n)]


def grid_size(spec: StudySpec) -> int | None:
    """Number of points of the spec's full grid (counted, not built); ``None`` when a
    float parameter has no step (no grid)."""
    size = 1
    for p in spec.search_space.values():
        n = len(p.choices) if isinstance(p, CategoricalParam) else grid_count(p)
        if n is None:
            return None
        size *= n
    return size


class GridSampler(optuna.samplers.GridSampler):
    """Optuna's grid sampler, without ``study.stop()`` once the grid is exhausted.

    ``study.stop()`` raises outside ``study.optimize`` (our trials are told
    through ask/tell); the study's budget (``n_trials``) bounds it instead, and
    trials beyond the grid's size revisit grid points.
    """

    def after_trial(self, study, trial, state, values) -> None:
        return None


def build_sampler(spec: StudySpec, seed_offset: int = 0) -> optuna.samplers.BaseSampler:
    """The Optuna sampler named by ``spec.sampler``, seeded from the spec.

    TPE runs with ``constant_liar`` by default so that concurrent trials do not
    all sample the same region (Optuna's recommendation for parallel studies).
    ``seed_offset`` moves the seed on when a study continues after a restart.
    """
    s = spec.sampler.model_copy(update={"seed": None if spec.sampler.seed is None
                                        else spec.sampler.seed + seed_offset})
    if s.name == "tpe":
        return optuna.samplers.TPESampler(seed=s.seed,
                                          n_startup_trials=s.startup_trials(
                                              spec.budget.n_trials),
                                          multivariate=s.is_multivariate,
                                          constant_liar=s.constant_liar)
    if s.name == "random":
        return optuna.samplers.RandomSampler(seed=s.seed)
    if s.name == "grid":
        grid = {name: grid_values(p) for name, p in spec.search_space.items()}
        return GridSampler(grid, seed=s.seed)
    if s.name == "gp":
        return optuna.samplers.GPSampler(seed=s.seed, n_startup_trials=s.n_startup_trials)
    if s.name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=s.seed, n_startup_trials=s.n_startup_trials,
                                            sigma0=s.sigma0)
    return optuna.samplers.NSGAIISampler(population_size=s.population_size, seed=s.seed)


def build_pruner(spec) -> optuna.pruners.BasePruner:
    """The Optuna pruner of an ``optuna-pruner`` scheduler spec (or a nested ``wrapped``)."""
    p = spec
    if p.name == "median":
        return optuna.pruners.MedianPruner(p.n_startup_trials, p.n_warmup_steps, p.interval_steps,
                                           n_min_trials=p.n_min_trials)
    if p.name == "percentile":
        return optuna.pruners.PercentilePruner(p.percentile, p.n_startup_trials,
                                               p.n_warmup_steps, p.interval_steps,
                                               n_min_trials=p.n_min_trials)
    if p.name == "successive-halving":
        return optuna.pruners.SuccessiveHalvingPruner(p.min_resource, p.reduction_factor,
                                                      p.min_early_stopping_rate)
    if p.name == "hyperband":
        return optuna.pruners.HyperbandPruner(p.min_resource, p.max_resource, p.reduction_factor)
    if p.name == "wilcoxon":
        return optuna.pruners.WilcoxonPruner(p_threshold=p.p_threshold,
                                             n_startup_steps=p.n_startup_steps)
    wrapped = build_pruner(p.wrapped) if p.wrapped is not None else None
    return optuna.pruners.PatientPruner(wrapped, p.patience, p.min_delta)
