"""Sampler, pruner and scheduler specs: the algorithms a study spec names, with their options.

Each is a pydantic model tagged by ``name`` and validated strictly (unknown
options are errors); budgets of schedulers count optimizer updates.
"""

from __future__ import annotations

import math
from typing import Annotated, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    ValidationInfo,
    field_validator,
)


class Strict(BaseModel):
    """Base of every spec model: unknown fields are errors, instances are immutable."""

    # no inf/nan in any float option: the spec shown as JSON (where they become null)
    # must be the spec that runs
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


POPULATION_SCHEDULERS = ("pbt", "pb2")  # they sample their own population, no searcher

MAX_COUNT = 2**31 - 1
"""Largest count a spec may hold (trials, optimizer updates, epochs, intervals, sizes,
factors): far beyond any real study, and small enough that a product of two of them
(``max_epochs`` x updates per epoch) stays within the int64 of Ray, numpy and torch."""


# -- samplers ----------------------------------------------------------------------------


class TPESamplerSpec(Strict):
    """Optuna's TPE. ``n_startup_trials`` (random trials before TPE models), left unset,
    is :meth:`startup_trials` of the study's budget; ``multivariate``, left unset, is
    :meth:`is_multivariate`'s ``False``."""

    name: Literal["tpe"]
    seed: StrictInt | None = Field(0, ge=0, lt=2**32)
    n_startup_trials: StrictInt | None = Field(None, ge=0, le=MAX_COUNT)
    multivariate: StrictBool | None = None
    constant_liar: StrictBool = True

    @property
    def is_multivariate(self) -> bool:
        """Whether TPE models the parameters jointly: the spec's ``multivariate``, else
        ``False``, the independent TPE (Bergstra et al., 2011), where Optuna 5 takes the
        multivariate one (Falkner et al., 2018) for a single objective.

        Measured with ``bench/ttt_samplers.py`` (the search alone, ASHA-stopped trials told
        PRUNED), on seeds neither default was chosen on: on ``time_to_target.py``'s task
        (6 parameters, 80 trials, 4 start-up trials, seeds 40-99) the median trials / epochs
        to the target were 26.5 / 72.0 independent against 33.0 / 90.0 multivariate, 8
        against 10 of 60 runs never reaching it (random search 40.5 / 82.5, 14 never); on a
        wide space of 11 parameters (``bench/ttt-wide.yaml``, 120 trials, 6 start-up
        trials, seeds 300-339) 27.0 / 81.0 against 40.0 / 131.5, and 2 against 13 of 40
        never (random 49.0 / 111.5, 4 never): the multivariate TPE settled on the region
        of one early good trial and sampled only there.
        """
        return bool(self.multivariate)

    def startup_trials(self, n_trials: int) -> int:
        """The random start-up trials of a study of ``n_trials`` trials: the spec's
        ``n_startup_trials``, else 5 % of the budget, at least 4 and at most Optuna's 10.

        Optuna's 10 spends an eighth of an 80-trial budget before TPE models anything. On
        ``bench/time_to_target.py``'s task (80 trials, ASHA), simulated over 20 seeds by
        ``bench/ttt_samplers.py``, the median trials to the target were 19 with 4 start-up
        trials, 35.5 with 6, 41.5 with 8 and 52.5 with 10 (random search: 60.5); budgets
        of 200 trials and more keep Optuna's 10, where it was chosen.
        """
        if self.n_startup_trials is not None:
            return self.n_startup_trials
        return min(10, max(4, n_trials // 20))


class RandomSamplerSpec(Strict):
    name: Literal["random"]
    seed: StrictInt | None = Field(0, ge=0, lt=2**32)


class GridSamplerSpec(Strict):
    name: Literal["grid"]
    seed: StrictInt | None = Field(0, ge=0, lt=2**32)


class GPSamplerSpec(Strict):
    name: Literal["gp"]
    seed: StrictInt | None = Field(0, ge=0, lt=2**32)
    n_startup_trials: StrictInt = Field(10, ge=0, le=MAX_COUNT)


class CmaEsSamplerSpec(Strict):
    name: Literal["cmaes"]
    seed: StrictInt | None = Field(0, ge=0, lt=2**32)
    n_startup_trials: StrictInt = Field(1, ge=0, le=MAX_COUNT)
    sigma0: StrictFloat | None = Field(None, gt=0)


class NSGA2SamplerSpec(Strict):
    name: Literal["nsga2"]
    seed: StrictInt | None = Field(0, ge=0, lt=2**32)
    population_size: StrictInt = Field(50, ge=2, le=MAX_COUNT)


SamplerSpec = Annotated[
    TPESamplerSpec | RandomSamplerSpec | GridSamplerSpec | GPSamplerSpec | CmaEsSamplerSpec
    | NSGA2SamplerSpec, Field(discriminator="name")]


# -- Optuna pruners (for scheduler: optuna-pruner) ------------------------------------


class MedianPrunerSpec(Strict):
    name: Literal["median"]
    n_startup_trials: StrictInt = Field(5, ge=0, le=MAX_COUNT)
    n_warmup_steps: StrictInt = Field(0, ge=0, le=MAX_COUNT)
    interval_steps: StrictInt = Field(1, ge=1, le=MAX_COUNT)
    n_min_trials: StrictInt = Field(1, ge=1, le=MAX_COUNT)


class PercentilePrunerSpec(Strict):
    name: Literal["percentile"]
    percentile: StrictFloat = Field(..., ge=0, le=100)
    n_startup_trials: StrictInt = Field(5, ge=0, le=MAX_COUNT)
    n_warmup_steps: StrictInt = Field(0, ge=0, le=MAX_COUNT)
    interval_steps: StrictInt = Field(1, ge=1, le=MAX_COUNT)
    n_min_trials: StrictInt = Field(1, ge=1, le=MAX_COUNT)


class SuccessiveHalvingPrunerSpec(Strict):
    name: Literal["successive-halving"]
    min_resource: StrictInt | Literal["auto"] = "auto"
    reduction_factor: StrictInt = Field(4, ge=2, le=MAX_COUNT)
    min_early_stopping_rate: StrictInt = Field(0, ge=0, le=MAX_COUNT)

    @field_validator("min_resource")
    @classmethod
    def _min_resource(cls, v):
        if isinstance(v, int) and not 1 <= v <= MAX_COUNT:
            raise ValueError(f"must be in [1, {MAX_COUNT}] or 'auto', got {v}")
        return v

    @field_validator("min_early_stopping_rate")
    @classmethod
    def _first_rung_reachable(cls, v, info: ValidationInfo):
        """Optuna's first rung is at step ``min_resource * reduction_factor **
        min_early_stopping_rate`` (``auto``: at least 1), computed at every report: a rate of
        2**31 - 1 made each report cost 30-40 s of big-integer arithmetic, and a rung beyond
        MAX_COUNT steps never prunes anything."""
        factor = info.data.get("reduction_factor")
        low = info.data.get("min_resource")
        low = low if isinstance(low, int) else 1
        if factor is None:
            return v
        most, step = 0, low * factor
        while step <= MAX_COUNT:
            most, step = most + 1, step * factor
        if v > most:
            raise ValueError(f"must be at most {most}: the first rung would be at step "
                             f"{low} x {factor}^{v}, beyond {MAX_COUNT}, and nothing would "
                             f"ever be pruned")
        return v


class HyperbandPrunerSpec(Strict):
    name: Literal["hyperband"]
    min_resource: StrictInt = Field(1, ge=1, le=MAX_COUNT)
    max_resource: StrictInt | Literal["auto"] = "auto"
    reduction_factor: StrictInt = Field(3, ge=2, le=MAX_COUNT)

    @field_validator("max_resource")
    @classmethod
    def _max_resource(cls, v, info: ValidationInfo):
        low = info.data.get("min_resource")
        if isinstance(v, int) and low is not None and v < low:
            raise ValueError(f"must be >= min_resource ({low}), got {v}")
        if isinstance(v, int) and v > MAX_COUNT:
            raise ValueError(f"must be <= {MAX_COUNT} or 'auto', got {v}")
        return v


class WilcoxonPrunerSpec(Strict):
    name: Literal["wilcoxon"]
    p_threshold: StrictFloat = Field(0.1, gt=0, lt=1)
    n_startup_steps: StrictInt = Field(2, ge=0, le=MAX_COUNT)


class PatientPrunerSpec(Strict):
    name: Literal["patient"]
    patience: StrictInt = Field(..., ge=0, le=MAX_COUNT)
    min_delta: StrictFloat = Field(0.0, ge=0)
    wrapped: PrunerSpec | None = None


PrunerSpec = Annotated[
    MedianPrunerSpec | PercentilePrunerSpec | SuccessiveHalvingPrunerSpec | HyperbandPrunerSpec
    | WilcoxonPrunerSpec | PatientPrunerSpec, Field(discriminator="name")]
PatientPrunerSpec.model_rebuild()


# -- Ray Tune schedulers (budgets in optimizer updates) -------------------------------


class FifoSchedulerSpec(Strict):
    name: Literal["fifo"]


MAX_RUNGS = 100
"""Most rungs a successive-halving schedule may have (per bracket; Hyperband: brackets).
Ray's schedulers, and ``hpo.tune.mo_asha``, build every rung up front: a
``reduction_factor`` just above 1 gave millions (1.00000001 up to 1000 updates: 7 million,
gigabytes, a driver killed for memory). 100 rungs of factor 1.1 span 13,780x."""


def rung_count(grace_period: int, max_t: int, reduction_factor: float) -> int:
    """The rungs ``grace_period * reduction_factor**k`` below ``max_t`` (k = 0, 1, ...)."""
    if max_t <= grace_period:
        return 0
    return math.ceil(math.log(max_t / grace_period) / math.log(reduction_factor))


def rungs_problem(grace_period: int, max_t: int, reduction_factor: float,
                  where: str = "max_t") -> str | None:
    """Why the rungs of a schedule are too many (:data:`MAX_RUNGS`), or None."""
    n = rung_count(grace_period, max_t, reduction_factor)
    if n <= MAX_RUNGS:
        return None
    least = (max_t / grace_period) ** (1 / MAX_RUNGS)
    return (f"{reduction_factor!r} makes {n} rungs from {grace_period} to {where} "
            f"({max_t}): at most {MAX_RUNGS}; use a reduction_factor of at least "
            f"{math.ceil(least * 1000) / 1000:g}")


class _SuccessiveHalving(Strict):
    """The rungs both ASHA schedulers share: ``grace_period * reduction_factor**k`` updates
    below ``max_t``, at most :data:`MAX_RUNGS` of them."""

    max_t: StrictInt | None = Field(None, ge=1, le=MAX_COUNT,
                                    description="default: the trials' planned updates")
    grace_period: StrictInt = Field(1, ge=1, le=MAX_COUNT)
    reduction_factor: StrictFloat = Field(4, gt=1, le=MAX_COUNT)

    @field_validator("reduction_factor")
    @classmethod
    def _few_rungs(cls, v: float, info: ValidationInfo) -> float:
        max_t, grace = info.data.get("max_t"), info.data.get("grace_period")
        if max_t is not None and grace is not None and (why := rungs_problem(grace, max_t, v)):
            raise ValueError(why)
        return v


class AshaSchedulerSpec(_SuccessiveHalving):
    """Asynchronous successive halving (Li et al., 2020), Ray's ``AsyncHyperBandScheduler``."""

    name: Literal["asha"]
    # Ray builds every bracket's rungs up front: 100,000 brackets took 200 MB
    brackets: StrictInt = Field(1, ge=1, le=MAX_RUNGS)


class MoAshaSchedulerSpec(_SuccessiveHalving):
    """Multi-objective ASHA (Schmucker et al., 2021): ``hpo.tune.mo_asha``; several objectives."""

    name: Literal["mo-asha"]


class HyperbandSchedulerSpec(Strict):
    """Synchronous Hyperband (Li et al., 2018), Ray's ``HyperBandScheduler`` (pauses trials)."""

    name: Literal["hyperband"]
    max_t: StrictInt | None = Field(None, ge=1, le=MAX_COUNT)
    reduction_factor: StrictFloat = Field(3, gt=1, le=MAX_COUNT)

    @field_validator("reduction_factor")
    @classmethod
    def _few_brackets(cls, v: float, info: ValidationInfo) -> float:
        # Ray's brackets: round(log(max_t) / log(reduction_factor)) + 1
        max_t = info.data.get("max_t")
        if max_t is not None and (why := rungs_problem(1, max_t, v)):
            raise ValueError(why)
        return v


class MedianSchedulerSpec(Strict):
    """Median stopping rule (Golovin et al., Vizier, 2017), Ray's ``MedianStoppingRule``."""

    name: Literal["median"]
    grace_period: StrictInt = Field(1, ge=0, le=MAX_COUNT)
    min_samples_required: StrictInt = Field(3, ge=1, le=MAX_COUNT)
    min_time_slice: StrictInt = Field(0, ge=0, le=MAX_COUNT)
    hard_stop: StrictBool = True


class PBTSchedulerSpec(Strict):
    """Population based training (Jaderberg et al., 2017), Ray's ``PopulationBasedTraining``."""

    name: Literal["pbt"]
    perturbation_interval: StrictInt = Field(..., ge=1, le=MAX_COUNT)
    quantile_fraction: StrictFloat = Field(0.25, gt=0, le=0.5)
    resample_probability: StrictFloat = Field(0.25, ge=0, le=1)


class PB2SchedulerSpec(Strict):
    """Population based bandits (Parker-Holder et al., 2020), Ray's ``PB2``; numeric spaces."""

    name: Literal["pb2"]
    perturbation_interval: StrictInt = Field(..., ge=1, le=MAX_COUNT)
    quantile_fraction: StrictFloat = Field(0.25, gt=0, le=0.5)


class OptunaPrunerSchedulerSpec(Strict):
    """Any Optuna pruner, asked on every result by a small Ray ``TrialScheduler``."""

    name: Literal["optuna-pruner"]
    pruner: PrunerSpec


SchedulerSpec = Annotated[
    FifoSchedulerSpec | AshaSchedulerSpec | MoAshaSchedulerSpec | HyperbandSchedulerSpec
    | MedianSchedulerSpec | PBTSchedulerSpec | PB2SchedulerSpec | OptunaPrunerSchedulerSpec,
    Field(discriminator="name")]
