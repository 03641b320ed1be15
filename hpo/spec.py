"""``StudySpec``: what a study is, validated at the boundary with messages naming the field.

A spec is plain data (YAML or JSON)::

    name: digits-tpe-asha
    task: digits
    config: {max_epochs: 12}               # fixed TrainConfig fields and task options
    search_space:
      lr: {type: float, low: 1.0e-4, high: 0.1, log: true}
      width: {type: int, low: 8, high: 64, step: 8}
      optimizer: {type: categorical, choices: [adamw, sgd]}
    objective: {metric: val_accuracy}      # direction defaults to the task's
    sampler: {name: tpe, seed: 0}
    scheduler: {name: asha, grace_period: 46, reduction_factor: 3}
    budget: {n_trials: 24, max_concurrent_trials: 2}
    resources: {cpus: 1, gpus: 0, workers: 1}

:func:`parse_spec` checks the structure (pydantic), then the spec against the
task (:mod:`hpo.validation`); every problem becomes one entry of a
:class:`~hpo.errors.SpecError`. Budgets of schedulers (``max_t``,
``grace_period``, ...) are counted in optimizer updates.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from hpo.errors import SpecError

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
POPULATION_SCHEDULERS = ("pbt", "pb2")  # they sample their own population, no searcher
"""Study names: 1-64 characters, letters, digits, ``_ . -``, not starting with a symbol."""


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# -- search space ------------------------------------------------------------------------


class FloatParam(_Model):
    """A float in ``[low, high]``, optionally log-uniform or on a grid of ``step``."""

    type: Literal["float"]
    log: bool = False
    low: float
    high: float
    step: float | None = None

    @field_validator("low")
    @classmethod
    def _low(cls, v: float, info: ValidationInfo) -> float:
        if not math.isfinite(v):
            raise ValueError("must be finite")
        if info.data.get("log") and v <= 0:
            raise ValueError(f"must be > 0 when log is true, got {v}")
        return v

    @field_validator("high")
    @classmethod
    def _high(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
        if not math.isfinite(v):
            raise ValueError("must be finite")
        if low is not None and v <= low:
            raise ValueError(f"must be > low ({low}), got {v}")
        return v

    @field_validator("step")
    @classmethod
    def _step(cls, v: float | None, info: ValidationInfo) -> float | None:
        if v is None:
            return v
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        if info.data.get("log"):
            raise ValueError("cannot be combined with log: true")
        low, high = info.data.get("low"), info.data.get("high")
        if low is not None and high is not None:
            n = (high - low) / v
            if abs(n - round(n)) > 1e-8 * max(1.0, abs(n)):
                raise ValueError(f"{v} does not divide the range [{low}, {high}]")
        return v


class IntParam(_Model):
    """An integer in ``[low, high]`` with ``step``, optionally log-uniform."""

    type: Literal["int"]
    log: bool = False
    low: StrictInt
    high: StrictInt
    step: StrictInt = 1

    @field_validator("low")
    @classmethod
    def _low(cls, v: int, info: ValidationInfo) -> int:
        if info.data.get("log") and v <= 0:
            raise ValueError(f"must be > 0 when log is true, got {v}")
        return v

    @field_validator("high")
    @classmethod
    def _high(cls, v: int, info: ValidationInfo) -> int:
        low = info.data.get("low")
        if low is not None and v <= low:
            raise ValueError(f"must be > low ({low}), got {v}")
        return v

    @field_validator("step")
    @classmethod
    def _step(cls, v: int, info: ValidationInfo) -> int:
        if v <= 0:
            raise ValueError(f"must be > 0, got {v}")
        if info.data.get("log") and v != 1:
            raise ValueError("must be 1 when log is true")
        low, high = info.data.get("low"), info.data.get("high")
        if low is not None and high is not None and (high - low) % v:
            raise ValueError(f"{v} does not divide the range [{low}, {high}]")
        return v


Choice = StrictBool | StrictInt | StrictFloat | StrictStr | None


class CategoricalParam(_Model):
    """One of ``choices``: numbers, strings, booleans and null may be mixed (optuna#3129)."""

    type: Literal["categorical"]
    choices: list[Choice]

    @field_validator("choices")
    @classmethod
    def _choices(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("must not be empty")
        keys = [(type(c).__name__, c) for c in v]
        if len(set(map(repr, keys))) != len(keys):
            raise ValueError(f"must not repeat a value, got {v}")
        for c in v:
            if isinstance(c, float) and not math.isfinite(c):
                raise ValueError(f"must be finite numbers, got {c}")
        return v


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


# -- objective ---------------------------------------------------------------------------


class Objective(_Model):
    """A metric the task reports, and whether to maximize it (default: the task's direction)."""

    metric: str
    direction: Literal["minimize", "maximize"] | None = None


# -- samplers ----------------------------------------------------------------------------


class TPESamplerSpec(_Model):
    name: Literal["tpe"]
    seed: int | None = 0
    n_startup_trials: int = Field(10, ge=0)
    multivariate: bool = True
    constant_liar: bool = True


class RandomSamplerSpec(_Model):
    name: Literal["random"]
    seed: int | None = 0


class GridSamplerSpec(_Model):
    name: Literal["grid"]
    seed: int | None = 0


class GPSamplerSpec(_Model):
    name: Literal["gp"]
    seed: int | None = 0
    n_startup_trials: int = Field(10, ge=0)


class CmaEsSamplerSpec(_Model):
    name: Literal["cmaes"]
    seed: int | None = 0
    n_startup_trials: int = Field(1, ge=0)
    sigma0: float | None = Field(None, gt=0)


class NSGA2SamplerSpec(_Model):
    name: Literal["nsga2"]
    seed: int | None = 0
    population_size: int = Field(50, ge=2)


SamplerSpec = Annotated[
    TPESamplerSpec | RandomSamplerSpec | GridSamplerSpec | GPSamplerSpec | CmaEsSamplerSpec
    | NSGA2SamplerSpec, Field(discriminator="name")]


# -- Optuna pruners (for scheduler: optuna-pruner) ------------------------------------


class MedianPrunerSpec(_Model):
    name: Literal["median"]
    n_startup_trials: int = Field(5, ge=0)
    n_warmup_steps: int = Field(0, ge=0)
    interval_steps: int = Field(1, ge=1)
    n_min_trials: int = Field(1, ge=1)


class PercentilePrunerSpec(_Model):
    name: Literal["percentile"]
    percentile: float = Field(..., ge=0, le=100)
    n_startup_trials: int = Field(5, ge=0)
    n_warmup_steps: int = Field(0, ge=0)
    interval_steps: int = Field(1, ge=1)
    n_min_trials: int = Field(1, ge=1)


class SuccessiveHalvingPrunerSpec(_Model):
    name: Literal["successive-halving"]
    min_resource: int | Literal["auto"] = "auto"
    reduction_factor: int = Field(4, ge=2)
    min_early_stopping_rate: int = Field(0, ge=0)


class HyperbandPrunerSpec(_Model):
    name: Literal["hyperband"]
    min_resource: int = Field(1, ge=1)
    max_resource: int | Literal["auto"] = "auto"
    reduction_factor: int = Field(3, ge=2)


class WilcoxonPrunerSpec(_Model):
    name: Literal["wilcoxon"]
    p_threshold: float = Field(0.1, gt=0, lt=1)
    n_startup_steps: int = Field(2, ge=0)


class PatientPrunerSpec(_Model):
    name: Literal["patient"]
    patience: int = Field(..., ge=0)
    min_delta: float = Field(0.0, ge=0)
    wrapped: PrunerSpec | None = None


PrunerSpec = Annotated[
    MedianPrunerSpec | PercentilePrunerSpec | SuccessiveHalvingPrunerSpec | HyperbandPrunerSpec
    | WilcoxonPrunerSpec | PatientPrunerSpec, Field(discriminator="name")]
PatientPrunerSpec.model_rebuild()


# -- Ray Tune schedulers (budgets in optimizer updates) -------------------------------


class FifoSchedulerSpec(_Model):
    name: Literal["fifo"]


class AshaSchedulerSpec(_Model):
    """Asynchronous successive halving (Li et al., 2020), Ray's ``AsyncHyperBandScheduler``."""

    name: Literal["asha"]
    max_t: int | None = Field(None, ge=1, description="default: the trials' planned updates")
    grace_period: int = Field(1, ge=1)
    reduction_factor: float = Field(4, gt=1)
    brackets: int = Field(1, ge=1)


class HyperbandSchedulerSpec(_Model):
    """Synchronous Hyperband (Li et al., 2018), Ray's ``HyperBandScheduler`` (pauses trials)."""

    name: Literal["hyperband"]
    max_t: int | None = Field(None, ge=1)
    reduction_factor: float = Field(3, gt=1)


class MedianSchedulerSpec(_Model):
    """Median stopping rule (Golovin et al., Vizier, 2017), Ray's ``MedianStoppingRule``."""

    name: Literal["median"]
    grace_period: int = Field(1, ge=0)
    min_samples_required: int = Field(3, ge=1)
    min_time_slice: int = Field(0, ge=0)
    hard_stop: bool = True


class PBTSchedulerSpec(_Model):
    """Population based training (Jaderberg et al., 2017), Ray's ``PopulationBasedTraining``."""

    name: Literal["pbt"]
    perturbation_interval: int = Field(..., ge=1)
    quantile_fraction: float = Field(0.25, gt=0, le=0.5)
    resample_probability: float = Field(0.25, ge=0, le=1)


class PB2SchedulerSpec(_Model):
    """Population based bandits (Parker-Holder et al., 2020), Ray's ``PB2``; numeric spaces."""

    name: Literal["pb2"]
    perturbation_interval: int = Field(..., ge=1)
    quantile_fraction: float = Field(0.25, gt=0, le=0.5)


class OptunaPrunerSchedulerSpec(_Model):
    """Any Optuna pruner, asked on every result by a small Ray ``TrialScheduler``."""

    name: Literal["optuna-pruner"]
    pruner: PrunerSpec


SchedulerSpec = Annotated[
    FifoSchedulerSpec | AshaSchedulerSpec | HyperbandSchedulerSpec | MedianSchedulerSpec
    | PBTSchedulerSpec | PB2SchedulerSpec | OptunaPrunerSchedulerSpec,
    Field(discriminator="name")]


# -- budget and resources ------------------------------------------------------------


class Budget(_Model):
    n_trials: int = Field(..., ge=1, le=100_000)
    timeout_s: float | None = Field(None, gt=0)
    max_concurrent_trials: int = Field(1, ge=1, le=1024)


class Resources(_Model):
    """Per trial: CPUs and GPUs of each worker (fractions share a device) and DDP workers.

    ``custom`` asks each worker for custom Ray resources (``{"special": 1}``),
    which only the nodes started with them provide.
    """

    cpus: float = Field(1.0, gt=0, le=1024)
    gpus: float = Field(0.0, ge=0, le=64)
    workers: int = Field(1, ge=1, le=1024)
    custom: dict[str, float] = Field(default_factory=dict)

    @field_validator("custom")
    @classmethod
    def _custom(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if name.upper() in ("CPU", "GPU", "MEMORY") or not name:
                raise ValueError(f"{name!r} is not a custom resource; use cpus or gpus")
            if not amount > 0:
                raise ValueError(f"{name}: must be > 0, got {amount}")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: float) -> float:
        if v > 1 and not float(v).is_integer():
            raise ValueError(f"a fraction of a GPU must be < 1; above 1, whole GPUs; got {v}")
        return v


class WarmStartStudy(_Model):
    """Try first the ``top_k`` best COMPLETE trials of an earlier study in the same storage."""

    study: str = Field(..., pattern=NAME_PATTERN)
    top_k: int = Field(5, ge=1, le=1000)


class WarmStartPoint(_Model):
    """Try first this point (parameters absent from it are sampled)."""

    params: dict[str, Choice]


WarmStart = WarmStartStudy | WarmStartPoint


class StudySpec(_Model):
    """A study: a task, a search space, an objective, a sampler, a scheduler and a budget."""

    name: str = Field(..., pattern=NAME_PATTERN)
    task: str
    config: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, Param] = Field(default_factory=dict)
    objective: Objective | list[Objective]
    objective_reduce: Literal["last", "best"] = "last"
    sampler: SamplerSpec = Field(default_factory=lambda: TPESamplerSpec(name="tpe"))
    scheduler: SchedulerSpec = Field(default_factory=lambda: FifoSchedulerSpec(name="fifo"))
    budget: Budget
    resources: Resources = Field(default_factory=Resources)
    max_failures: int = Field(0, ge=0, le=100)
    warm_start: list[WarmStart] = Field(default_factory=list, max_length=1000)

    @property
    def objectives(self) -> list[Objective]:
        """The objectives as a list (one for a single-objective study)."""
        return self.objective if isinstance(self.objective, list) else [self.objective]

    @property
    def is_multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict that :func:`parse_spec` reads back to an equal spec."""
        return self.model_dump(mode="json")


_UNION_FIELDS = {"sampler", "scheduler", "pruner", "wrapped"}


def _loc(parts: tuple) -> str:
    """Dotted path of a pydantic error, without the tags pydantic adds for tagged unions."""
    out: list[str] = []
    for i, part in enumerate(parts):
        is_tag = i + 1 < len(parts) and isinstance(part, str) and i > 0 and (
            parts[i - 1] in _UNION_FIELDS or (i == 2 and parts[0] == "search_space"))
        if not is_tag:
            out.append(str(part))
    return ".".join(out)


def _msg(text: str) -> str:
    return text.removeprefix("Value error, ")


def parse_spec(data: Mapping[str, Any], *, check_task: bool = True) -> StudySpec:
    """Validate a spec given as a mapping.

    Args:
        data: the spec (parsed JSON or YAML).
        check_task: also check the spec against its task (metric, parameters,
            values); see :func:`hpo.validation.check_against_task`.

    Raises:
        SpecError: every problem found, each with the dotted path of its field.
    """
    if not isinstance(data, Mapping):
        raise SpecError.at("", f"a study spec must be a mapping, got {type(data).__name__}")
    try:
        spec = StudySpec.model_validate(dict(data))
    except ValidationError as e:
        raise SpecError([{"loc": _loc(err["loc"]), "msg": _msg(err["msg"])}
                         for err in e.errors()]) from None
    if check_task:
        from hpo.validation import check_against_task

        spec = check_against_task(spec)
    return spec


def load_spec(path: str | Path, *, check_task: bool = True) -> StudySpec:
    """Read and validate a spec from a ``.yaml``/``.yml`` or ``.json`` file.

    Raises:
        SpecError: unreadable file, bad YAML/JSON, or an invalid spec.
    """
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise SpecError.at("", f"cannot read {path}: {e.strerror}") from None
    return parse_spec(parse_text(text, json_only=path.suffix == ".json"), check_task=check_task)


def parse_text(text: str, *, json_only: bool = False) -> Any:
    """Parse spec text: JSON, or YAML (a superset of JSON) unless ``json_only``.

    Raises:
        SpecError: the text is not valid JSON/YAML.
    """
    try:
        return json.loads(text) if json_only else yaml.safe_load(text)
    except (json.JSONDecodeError, yaml.YAMLError) as e:
        raise SpecError.at("", f"not valid {'JSON' if json_only else 'YAML'}: {e}") from None
