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
import re
from collections.abc import Mapping
from decimal import Decimal
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    Field,
    StrictBool,
    StrictFloat,
    StrictInt,
    StrictStr,
    ValidationError,
    ValidationInfo,
    field_validator,
)

from hpo.algorithms import (
    MAX_COUNT,
    POPULATION_SCHEDULERS,
    FifoSchedulerSpec,
    SamplerSpec,
    SchedulerSpec,
    Strict,
    TPESamplerSpec,
)
from hpo.errors import SpecError, printable, unprintable

__all__ = ["NAME_PATTERN", "POPULATION_SCHEDULERS", "StudySpec", "load_spec", "parse_spec",
           "parse_text"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""Study names: 1-64 characters, letters, digits, ``_ . -``, not starting with a symbol."""
BUILTIN_RESOURCES = ("CPU", "GPU", "MEMORY")  # Ray's own; not custom resources
RESOURCE_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
"""Custom resource names: 1-64 ASCII letters, digits, ``_ . : / -``. Ray itself checks no
characters (``node:10.0.0.1``, ``accelerator_type:A100`` are its own); a name outside this
set could not be stored by every database (NUL) or asked of a node by ``ray start``."""
MAX_CHOICES = 1000  # choices of one categorical parameter
MAX_GRID_POINTS = 1e9  # values of one stepped float parameter
MAX_EXACT_INT = 2**53  # ints of a search space: exact in float64, as Optuna's samplers compute
MAX_TIMEOUT_S = 10 * 365.25 * 86400  # ten years


# -- search space ------------------------------------------------------------------------


SearchInt = Annotated[StrictInt, Field(ge=-MAX_EXACT_INT, le=MAX_EXACT_INT)]


class FloatParam(Strict):
    """A float in ``[low, high]``, optionally log-uniform or on a grid of ``step``."""

    type: Literal["float"]
    log: StrictBool = False
    low: StrictFloat
    high: StrictFloat
    step: StrictFloat | None = None

    @field_validator("low")
    @classmethod
    def _low(cls, v: float, info: ValidationInfo) -> float:
        if info.data.get("log") and v <= 0:
            raise ValueError(f"must be > 0 when log is true, got {v}")
        return v

    @field_validator("high")
    @classmethod
    def _high(cls, v: float, info: ValidationInfo) -> float:
        low = info.data.get("low")
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
            if not math.isfinite(n) or n > MAX_GRID_POINTS:  # (high - low) may overflow
                raise ValueError(f"{v} makes more than {MAX_GRID_POINTS:.0e} grid points in "
                                 f"[{low}, {high}]")
            # Optuna's test, in decimal (FloatDistribution moves such a high down, with a
            # warning): the grid that runs is the one the spec shows, on every path
            d_low, d_high, d_step = (Decimal(str(x)) for x in (low, high, v))
            if (d_high - d_low) % d_step:
                fit = float((d_high - d_low) // d_step * d_step + d_low)
                raise ValueError(f"{v} does not divide the range [{low}, {high}]; the grid's "
                                 f"last point below high is {fit}")
        return v


class IntParam(Strict):
    """An integer in ``[low, high]`` with ``step``, optionally log-uniform."""

    type: Literal["int"]
    log: StrictBool = False
    low: SearchInt
    high: SearchInt
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


class CategoricalParam(Strict):
    """One of ``choices``: numbers, strings, booleans and null may be mixed (optuna#3129)."""

    type: Literal["categorical"]
    # each choice is checked against the task (a few ms each): a bounded list
    choices: list[Choice] = Field(..., max_length=MAX_CHOICES)

    @field_validator("choices")
    @classmethod
    def _choices(cls, v: list[Any]) -> list[Any]:
        if not v:
            raise ValueError("must not be empty")
        for i, c in enumerate(v):
            if isinstance(c, int) and abs(c) > MAX_EXACT_INT:
                raise ValueError(f"choice {i} is beyond +-2**53 (Optuna computes in float64)")
            # Optuna finds a choice by ==: 1, 1.0 and True would be one choice
            if any(c == other for other in v[:i]):
                raise ValueError(f"{c!r} equals an earlier choice (Optuna compares choices "
                                 f"with ==: 1, 1.0 and True are the same); got {v}")
        return v


Param = Annotated[FloatParam | IntParam | CategoricalParam, Field(discriminator="type")]


# -- objective ---------------------------------------------------------------------------


class Objective(Strict):
    """A metric the task reports, and whether to maximize it (default: the task's direction)."""

    metric: str
    direction: Literal["minimize", "maximize"] | None = None


# -- budget and resources ------------------------------------------------------------


class Budget(Strict):
    n_trials: StrictInt = Field(..., ge=1, le=100_000)
    timeout_s: StrictFloat | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    max_concurrent_trials: StrictInt = Field(1, ge=1, le=1024)


class Resources(Strict):
    """Per trial: CPUs and GPUs of each worker (fractions share a device) and DDP workers.

    ``custom`` asks each worker for custom Ray resources (``{"special": 1}``),
    which only the nodes started with them provide.
    """

    cpus: StrictFloat = Field(1.0, gt=0, le=1024)
    gpus: StrictFloat = Field(0.0, ge=0, le=64)
    workers: StrictInt = Field(1, ge=1, le=1024)
    custom: dict[str, StrictFloat] = Field(default_factory=dict)

    @field_validator("custom")
    @classmethod
    def _custom(cls, v: dict[str, float]) -> dict[str, float]:
        for name, amount in v.items():
            if not RESOURCE_PATTERN.fullmatch(name):
                raise ValueError(f"{printable(name)!r} is not a resource name: 1-64 ASCII "
                                 "letters, digits, _ . : / -")
            if name.upper() in BUILTIN_RESOURCES:
                raise ValueError(f"{name!r} is not a custom resource; use cpus or gpus")
            if not 0 < amount <= MAX_COUNT:
                raise ValueError(f"{name}: must be in (0, {MAX_COUNT}], got {amount}")
        return v

    @field_validator("gpus")
    @classmethod
    def _gpus(cls, v: float) -> float:
        if v > 1 and not float(v).is_integer():
            raise ValueError(f"a fraction of a GPU must be < 1; above 1, whole GPUs; got {v}")
        return v


class WarmStartStudy(Strict):
    """Try first the ``top_k`` best COMPLETE trials of an earlier study in the same storage."""

    study: str = Field(..., pattern=NAME_PATTERN)
    top_k: StrictInt = Field(5, ge=1, le=1000)


class WarmStartPoint(Strict):
    """Try first this point (parameters absent from it are sampled)."""

    params: dict[str, Choice]


WarmStart = WarmStartStudy | WarmStartPoint


class StudySpec(Strict):
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
    max_failures: StrictInt = Field(0, ge=0, le=100)
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
_MEMBER_NAMES = {"Objective", "list[Objective]", "WarmStartStudy", "WarmStartPoint",
                 "bool", "int", "float", "str", "none"}


def _loc(parts: tuple) -> str:
    """Dotted path of a pydantic error, without the names pydantic adds for union members
    (tags of tagged unions, model and type names of plain ones)."""
    out: list[str] = []
    for i, part in enumerate(parts):
        inner = i > 0 and i + 1 < len(parts) and isinstance(part, str)
        is_tag = inner and (parts[i - 1] in _UNION_FIELDS
                            or (i == 2 and parts[0] == "search_space"))
        is_member = i > 0 and isinstance(part, str) and part in _MEMBER_NAMES and (
            parts[i - 1] in ("objective", "choices", "params")
            or isinstance(parts[i - 1], int))
        if not (is_tag or is_member):
            out.append(str(part))
    return ".".join(out)


def _msg(text: str) -> str:
    return text.removeprefix("Value error, ")


def _text_errors(value: Any, loc: str) -> list[dict[str, str]]:
    """Every key or string of the spec holding a control character or a lone surrogate:
    no database keeps them all (PostgreSQL refuses NUL, UTF-8 has no surrogates)."""
    def bad(text: str, where: str) -> list[dict[str, str]]:
        c = unprintable(text)
        return [] if c is None else [{"loc": where, "msg": f"holds U+{ord(c):04X} "
                                      f"(a control character or lone surrogate); "
                                      f"only printable text is accepted"}]

    if isinstance(value, str):
        return bad(value, loc)
    errors: list[dict[str, str]] = []
    items = (value.items() if isinstance(value, Mapping)
             else enumerate(value) if isinstance(value, list | tuple) else ())
    for key, item in items:
        where = f"{loc}.{key}" if loc else str(key)
        errors += bad(key, where) if isinstance(key, str) else []
        errors += _text_errors(item, where)
    return errors


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
    if errors := _text_errors(data, ""):
        raise SpecError(errors)
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
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise SpecError.at("", f"cannot read {path}: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise SpecError.at("", f"{path} is not UTF-8 text: {e}") from None
    return parse_spec(parse_text(text, json_only=path.suffix == ".json"), check_task=check_task)


def parse_text(text: str, *, json_only: bool = False) -> Any:
    """Parse spec text: JSON, or YAML (a superset of JSON) unless ``json_only``.

    Raises:
        SpecError: the text is not valid JSON/YAML.
    """
    kind = "JSON" if json_only else "YAML"
    try:
        if json_only:
            return json.loads(text, object_pairs_hook=_unique_keys)
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except RecursionError:
        raise SpecError.at("", f"not valid {kind}: nested too deeply") from None
    except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError, integers over 4300 digits
        raise SpecError.at("", f"not valid {kind}: {e}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping key given twice (it keeps the last silently)
    and aliases (``*name``: a few hundred bytes of nested aliases expand to gigabytes)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not supported in a spec",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
