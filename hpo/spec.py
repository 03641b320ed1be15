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

import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BeforeValidator,
    Discriminator,
    Field,
    PrivateAttr,
    StrictFloat,
    StrictInt,
    Tag,
    ValidationError,
    field_serializer,
    field_validator,
    model_validator,
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
from hpo.errors import SpecError, printable
from hpo.params import CategoricalParam, Choice, FloatParam, IntParam, Param
from hpo.speclimits import (
    MAX_ERRORS,
    MAX_PARAMETERS,
    NAME_PATTERN,
    NAME_RULE,
    key_errors,
    text_errors,
)
from hpo.specpaths import field_path, problems, tag_problem, walk
from hpo.spectext import parse_text
from hpo.suggest import did_you_mean

__all__ = ["FSDP_SCRATCH_DIR", "NAME_PATTERN", "POPULATION_SCHEDULERS", "CategoricalParam",
           "FloatParam", "IntParam", "StudySpec", "load_spec", "load_stored", "parse_spec",
           "parse_text"]

# under the results directory, shared by every study's FSDP trials: no study takes the name
# (hpo.models.study_dir_clash)
FSDP_SCRATCH_DIR = "fsdp-checkpoints"
BUILTIN_RESOURCES = ("CPU", "GPU", "MEMORY")  # Ray's own; not custom resources
RESOURCE_PATTERN = re.compile(r"[A-Za-z0-9_.:/-]{1,64}")
"""Custom resource names: 1-64 ASCII letters, digits, ``_ . : / -``. Ray itself checks no
characters (``node:10.0.0.1``, ``accelerator_type:A100`` are its own); a name outside this
set could not be stored by every database (NUL) or asked of a node by ``ray start``."""
MAX_TIMEOUT_S = 10 * 365.25 * 86400  # ten years
# -- objective ---------------------------------------------------------------------------


class Objective(Strict):
    """A metric the task reports, and whether to maximize it (default: the task's direction)."""

    metric: str
    direction: Literal["minimize", "maximize"] | None = None


class Constraint(Strict):
    """A bound on a metric the trial reports (the task's, or the loop's such as
    ``peak_memory_bytes``), read from its last report: ``max`` (value <= max) or ``min``
    (value >= min), one of the two. Recorded as an Optuna constraint (``hpo.record``)."""

    metric: str = Field(..., min_length=1, max_length=200)
    max: StrictFloat | None = Field(None, allow_inf_nan=False)
    min: StrictFloat | None = Field(None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_bound(self) -> Constraint:
        if (self.max is None) == (self.min is None):
            raise ValueError("give one bound: max or min")
        return self

    @property
    def key(self) -> str:
        """The constraint's name in Optuna (``peak_memory_bytes.max``)."""
        return f"{self.metric}.{'max' if self.max is not None else 'min'}"

    def violation(self, value: float) -> float:
        """Optuna's constraint value: <= 0 when ``value`` is within the bound, else by how
        much it is beyond (in the metric's units)."""
        return value - self.max if self.max is not None else self.min - value


# -- budget and resources ------------------------------------------------------------


class StopWhen(Strict):
    """Study-level stopping rules (``hpo.stopping``); either or both.

    ``target``: stop once a COMPLETE trial's objective reaches this value.
    ``no_improvement_trials``: stop after this many finished (COMPLETE or PRUNED) trials
    in a row without the best objective improving by more than ``min_delta`` (>= 0, in
    the objective's units).
    """

    no_improvement_trials: StrictInt | None = Field(None, ge=1, le=100_000)
    min_delta: StrictFloat = Field(0.0, ge=0, allow_inf_nan=False)
    target: StrictFloat | None = Field(None, allow_inf_nan=False)

    @model_validator(mode="after")
    def _one_rule(self) -> StopWhen:
        if self.target is None and self.no_improvement_trials is None:
            raise ValueError("give no_improvement_trials (with min_delta) or target, or both")
        if self.min_delta and self.no_improvement_trials is None:
            raise ValueError("min_delta applies to no_improvement_trials, which is not set")
        return self


class Budget(Strict):
    n_trials: StrictInt = Field(..., ge=1, le=100_000)
    timeout_s: StrictFloat | None = Field(None, gt=0, le=MAX_TIMEOUT_S)
    max_concurrent_trials: StrictInt = Field(1, ge=1, le=1024)
    stop_when: StopWhen | None = None


class Resources(Strict):
    """Per trial: CPUs and GPUs of each worker (fractions share a device) and DDP workers.

    ``custom`` asks each worker for custom Ray resources (``{"special": 1}``),
    which only the nodes started with them provide. ``parallelism`` is how
    several workers share the model: ``ddp`` replicates it, ``fsdp`` shards it
    with FSDP2 and checkpoints with ``torch.distributed.checkpoint``
    (``TrainConfig.parallelism``, set from here).
    """

    cpus: StrictFloat = Field(1.0, gt=0, le=1024)
    gpus: StrictFloat = Field(0.0, ge=0, le=64)
    workers: StrictInt = Field(1, ge=1, le=1024)
    parallelism: Literal["ddp", "fsdp"] = "ddp"
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


def _warm_start_kind(entry: Any) -> str | None:
    """The tag of a warm-start entry: ``study`` (an earlier study) or ``params`` (a point)."""
    if isinstance(entry, WarmStartStudy | WarmStartPoint):
        return "study" if isinstance(entry, WarmStartStudy) else "params"
    if isinstance(entry, Mapping):
        return "study" if "study" in entry else "params" if "params" in entry else None
    return None


WarmStart = Annotated[
    Annotated[WarmStartStudy, Tag("study")] | Annotated[WarmStartPoint, Tag("params")],
    Discriminator(_warm_start_kind, custom_error_type="warm_start_kind",
                  custom_error_message="give study (an earlier study to start from) or "
                                       "params (a point to try first)")]


def _as_list(value: Any) -> list:
    """One objective (a mapping) as a list of one; a list as it is."""
    if isinstance(value, Mapping | Objective):
        return [value]
    if not isinstance(value, list):
        raise ValueError(f"must be an objective ({{metric: ..., direction: ...}}) or a list of "
                         f"them, got {type(value).__name__}")
    return value


Objectives = Annotated[list[Objective], BeforeValidator(
    _as_list, json_schema_input_type=Objective | list[Objective])]


class StudySpec(Strict):
    """A study: a task, a search space, an objective, a sampler, a scheduler and a budget."""

    name: str = Field(..., pattern=NAME_PATTERN)
    task: str
    config: dict[str, Any] = Field(default_factory=dict)
    search_space: dict[str, Param] = Field(default_factory=dict)
    # one objective or a list, normalized to a list before validation; ``objective`` and
    # ``to_dict`` give it back in the shape it was given
    objectives: Objectives = Field(alias="objective")
    objective_reduce: Literal["last", "best"] = "last"
    sampler: SamplerSpec = Field(default_factory=lambda: TPESamplerSpec(name="tpe"))
    scheduler: SchedulerSpec = Field(default_factory=lambda: FifoSchedulerSpec(name="fifo"))
    budget: Budget
    resources: Resources = Field(default_factory=Resources)
    max_failures: StrictInt = Field(0, ge=0, le=100)
    warm_start: list[WarmStart] = Field(default_factory=list, max_length=1000)
    # the final models of the best k COMPLETE trials are kept as Optuna artifacts
    # (hpo.models); 0 keeps none
    keep_models: StrictInt = Field(3, ge=0, le=1000)
    # a single-worker trial's report carries a checkpoint once its training went this many
    # seconds past its last one (besides those its last report, the scheduler's max_t and
    # pausing or exploiting schedulers need: hpo.tune.trainable.CheckpointPolicy); 0: every
    # report. A crash loses at most this much training plus one evaluation.
    checkpoint_interval_s: StrictFloat = Field(0.5, ge=0, le=86_400, allow_inf_nan=False)
    # feasibility of a trial (hpo.record): every bound holds at its last report
    constraints: list[Constraint] = Field(default_factory=list, max_length=32)
    _one_objective: bool = PrivateAttr(False)  # given as a mapping, not as a list

    @model_validator(mode="wrap")
    @classmethod
    def _note_objective_shape(cls, data: Any, handler) -> StudySpec:
        spec = handler(data)
        if isinstance(data, Mapping) and isinstance(data.get("objective"), Mapping):
            spec._one_objective = True
        return spec

    @field_validator("objectives")
    @classmethod
    def _objectives(cls, v: list[Objective]) -> list[Objective]:
        if not v:
            raise ValueError("must name at least one metric")
        if len({o.metric for o in v}) < len(v):
            raise ValueError("a metric appears twice")
        return v

    @field_validator("constraints")
    @classmethod
    def _constraints(cls, v: list[Constraint]) -> list[Constraint]:
        keys = [c.key for c in v]
        for key in keys:
            if keys.count(key) > 1:
                raise ValueError(f"two bounds named {key}: give each metric one max and "
                                 "one min at most")
        highs = {c.metric: c.max for c in v if c.max is not None}
        for c in v:
            if c.min is not None and c.metric in highs and c.min > highs[c.metric]:
                raise ValueError(f"{c.metric}: min {c.min:g} is above max "
                                 f"{highs[c.metric]:g}, so no trial could be feasible")
        return v

    @field_serializer("objectives", mode="wrap")
    def _objective_as_given(self, v: list[Objective], handler) -> Any:
        out = handler(v)
        return out[0] if self._one_objective else out

    @property
    def objective(self) -> Objective | list[Objective]:
        """The objective as given: one :class:`Objective`, or the list of them."""
        return self.objectives[0] if self._one_objective else self.objectives

    @property
    def is_multi_objective(self) -> bool:
        return len(self.objectives) > 1

    def to_dict(self) -> dict[str, Any]:
        """JSON-compatible dict that :func:`parse_spec` and :func:`load_stored` read back
        to an equal spec."""
        return self.model_dump(mode="json", by_alias=True)


# -- error paths ---------------------------------------------------------------------------

def _error(err: dict, data: Any) -> dict[str, str]:
    """One pydantic error as ``{"loc", "msg"}``: an unknown field gets "did you mean", a
    name that breaks ``NAME_PATTERN`` the rule in words."""
    msg = _msg(err["msg"])
    if err["type"] == "extra_forbidden":
        _, allowed = walk(StudySpec.__pydantic_core_schema__, err["loc"])
        msg = f"not a field here{did_you_mean(str(err['loc'][-1]), allowed)}" + (
            f"; fields here: {', '.join(allowed)}" if allowed else "")
    elif err["type"] == "string_pattern_mismatch" and \
            err.get("ctx", {}).get("pattern") == NAME_PATTERN:
        msg = NAME_RULE
    elif err["type"] in ("union_tag_invalid", "union_tag_not_found"):
        return tag_problem(StudySpec.__pydantic_core_schema__, err, data)
    return {"loc": field_path(StudySpec.__pydantic_core_schema__, err["loc"], data),
            "msg": msg}


def _msg(text: str) -> str:
    return text.removeprefix("Value error, ")


def _kind(data: Any) -> str:
    """What a JSON or YAML document holds, in its own terms (not Python's type names)."""
    if data is None:
        return "an empty document (null)"
    for types, words in ((bool, "a boolean"), ((int, float), "a number"), (str, "a string"),
                         ((list, tuple), "a list")):
        if isinstance(data, types):
            return words
    return "a value of another kind"


def parse_spec(data: Mapping[str, Any], *, check_task: bool = True,
               allow_paths: bool = True,
               bound: Callable[[StudySpec], None] | None = None) -> StudySpec:
    """Validate a spec given as a mapping: the boundary, where a spec is parsed once.

    What is handed on and stored is the returned spec (``to_dict``); what reads it
    back uses :func:`load_stored`, which checks nothing again. Checks that need the
    task's datasets run where the datasets are, when the study starts
    (:func:`hpo.validation.check_datasets`).

    Args:
        data: the spec (parsed JSON or YAML).
        check_task: also check the spec against its task (metric, parameters,
            values) and fill in the objectives' directions; see
            :func:`hpo.validation.check_against_task`.
        allow_paths: ``False`` refuses, before the task's checks read them, the
            fields that name a file-system path of the training machines
            (:func:`hpo.validation.check_paths`); a service lets only admins.
        bound: called with the structurally valid spec before the task's checks,
            which build the training configuration once per value of the search
            space (4 to 14 us each): a caller's limits on the spec's size (it
            raises ``SpecError`` to refuse) hold before that work starts.

    Raises:
        SpecError: every problem found, each with the dotted path of its field.
    """
    if not isinstance(data, Mapping):
        raise SpecError.at("", f"a study spec must be a mapping of fields, got {_kind(data)}")
    if errors := text_errors(data, ""):
        raise SpecError(errors[:MAX_ERRORS])
    space = data.get("search_space")
    if isinstance(space, Mapping) and len(space) > MAX_PARAMETERS:  # before validating each
        raise SpecError.at("search_space", f"{len(space):,} parameters; at most "
                                           f"{MAX_PARAMETERS:,}")
    if errors := key_errors(data):
        raise SpecError(errors)
    spec = _validate(data)
    if bound is not None:
        bound(spec)
    if check_task or not allow_paths:
        from hpo.validation import check_against_task, check_paths

        if not check_task:
            check_paths(spec)
            return spec
        spec = check_against_task(spec, allow_paths=allow_paths)
    return spec


def load_stored(data: Mapping[str, Any]) -> StudySpec:
    """A spec that :func:`parse_spec` validated and that was stored as ``to_dict`` (the
    service's ``hpo_studies.spec``, the Optuna study's ``hpo_spec`` attribute), read back.

    Only deserialized: no text scan, no task checks (its directions are already filled
    in), so a study stored by an earlier version keeps loading when checks grow stricter.

    Raises:
        SpecError: the data is not a spec's structure (each field named).
    """
    return _validate(data)


def _validate(data: Mapping[str, Any]) -> StudySpec:
    try:
        return StudySpec.model_validate(dict(data))
    except ValidationError as e:
        # without the inputs and links: building them for 60,000 unknown keys took 0.1 s
        found = e.errors(include_url=False, include_input=False)
        raise SpecError(problems(found, lambda err: _error(err, data))) from None


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
