"""Search spaces and samplers: the spec's parameters as Optuna distributions and samplers."""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import (
    BaseDistribution,
    CategoricalDistribution,
    FloatDistribution,
    IntDistribution,
)

from hpo.spec import CategoricalParam, FloatParam, IntParam, StudySpec


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


def grid_values(param: FloatParam | IntParam | CategoricalParam) -> list[Any]:
    """The points of a parameter on a grid: its choices, or ``low, low + step, ..., high``."""
    if isinstance(param, CategoricalParam):
        return list(param.choices)
    n = round((param.high - param.low) / param.step)
    if isinstance(param, IntParam):
        return [param.low + k * param.step for k in range(n + 1)]
    return [round(param.low + k * param.step, 12) for k in range(n + 1)]


def grid_size(spec: StudySpec) -> int:
    """Number of points of the spec's full grid."""
    size = 1
    for p in spec.search_space.values():
        size *= len(grid_values(p))
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
        return optuna.samplers.TPESampler(seed=s.seed, n_startup_trials=s.n_startup_trials,
                                          multivariate=s.multivariate,
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
