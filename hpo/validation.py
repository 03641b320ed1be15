"""Checks of a structurally valid spec against its task, sampler and scheduler.

:func:`check_against_task` runs at the boundary (:func:`hpo.spec.parse_spec`),
before anything is stored, so that a bad spec fails with the path of each
offending field, never at the first trial. The checks that need the task's
datasets (:func:`check_budgets`) run where the datasets are: in the driver, when
the study starts; a failure there ends the study FAILED with the same kind of
field-naming reason. Whether the sampler and scheduler can serve the spec is
:mod:`hpo.algochecks` (its names are exported here too).
"""

from __future__ import annotations

import functools
import re
import sys
from typing import Any

import trainers
import trainers.fields
from hpo.algochecks import (
    MAX_GRID_SIZE,
    MUTABLE_IN_TRAINING,
    SINGLE_OBJECTIVE_SAMPLERS,
    check_sampler_and_scheduler,
)
from hpo.algorithms import MAX_COUNT, rungs_problem
from hpo.errors import SpecError, public_message
from hpo.params import CategoricalParam, FloatParam, IntParam
from hpo.spec import (
    MAX_ERRORS,
    POPULATION_SCHEDULERS,
    Objective,
    StudySpec,
    WarmStartStudy,
)
from hpo.suggest import did_you_mean
from trainers.config import MAX_NUM_WORKERS
from trainers.contract import creation_violations, process_state_kept

__all__ = ["INT_OPTION_LIMITS", "MANAGED_FIELDS", "MAX_GRID_SIZE", "MUTABLE_IN_TRAINING",
           "SINGLE_OBJECTIVE_SAMPLERS", "check_against_task", "check_budgets", "check_paths",
           "in_distribution", "out_of_range"]

# Set per trial by the service; a spec may not fix or search them.
MANAGED_FIELDS = {"checkpoint_dir": "set per trial by the service",
                  "checkpoint_fsync": "set per trial by the service",
                  "device": "follows resources.gpus",
                  "parallelism": "set by resources.parallelism"}
# int options bounded otherwise than by MAX_COUNT: TrainConfig's seed range, and the
# DataLoader processes each trial starts
INT_OPTION_LIMITS = {"seed": 2**32 - 1, "num_workers": MAX_NUM_WORKERS}


def check_against_task(spec: StudySpec, *, allow_paths: bool = True) -> StudySpec:
    """:func:`_check_against_task`, the task's code run with the process state it may
    change put back (``trainers.contract.process_state_kept``)."""
    with process_state_kept(f"task {spec.task!r}"):
        return _check_against_task(spec, allow_paths=allow_paths)


def _check_against_task(spec: StudySpec, *, allow_paths: bool = True) -> StudySpec:
    """Validate ``spec`` against its task; return it with objective directions filled in.

    The task class is looked up once (a scan of the installed entry points) and
    handed to every check. ``allow_paths=False`` first refuses the fields that
    name a file-system path (:func:`check_paths`), before any check reads them.

    Raises:
        SpecError: every problem found (unknown task, metric or parameter, a
            value the task refuses, a sampler or scheduler that cannot serve
            this search space or objective), or only the path fields.
    """
    try:
        task_cls = trainers.get_task(spec.task)
    except trainers.UnknownTaskError as e:
        raise SpecError.at("task", str(e)) from None
    except trainers.USER_CODE_ERRORS as e:  # an installed task's package may raise anything
        raise SpecError.at("task", _contract_msg(spec.task, "import", _exc(e))) from None
    fields = _task_fields(task_cls)
    if not allow_paths:
        check_paths(spec, fields)
    errors: list[dict[str, str]] = []
    try:
        errors += _check_config(spec, task_cls, fields)
        if not errors:
            errors += _check_contract(spec, task_cls)
    except trainers.USER_CODE_ERRORS as e:  # the task's own __init__ or check_config raised
        # something other than ConfigError (a 500 before: the breaker's task)
        errors.append({"loc": "task", "msg": _contract_msg(
            spec.task, "build", f"creating it with this spec's config raised {_exc(e)}")})
    if not errors:  # values of the search space are checked on top of a valid config
        errors += _check_search_space(spec, task_cls, fields)
    objectives, objective_errors = _check_objectives(spec, task_cls)
    errors += objective_errors
    errors += check_sampler_and_scheduler(spec, task_cls)
    errors += _check_warm_start(spec)
    errors += _check_constraints(spec, task_cls)
    if errors:
        raise SpecError(errors)
    return spec.model_copy(update={"objectives": objectives})


def check_paths(spec: StudySpec, fields: dict[str, trainers.FieldInfo] | None = None) -> None:
    """Refuse the fields of ``spec`` that name a file-system path of the training machines
    (``config.corpus``, ``search_space.cache_dir``, ...): a service lets only admins set them.

    Raises:
        SpecError: naming each such field.
    """
    if fields is None:
        try:
            fields = _task_fields(trainers.get_task(spec.task))
        except trainers.USER_CODE_ERRORS:  # unknown or broken: check_against_task says which
            return
    paths = {name for name, info in fields.items() if info.path}
    locs = [f"config.{name}" for name in spec.config if name in paths]
    locs += [f"search_space.{name}" for name in spec.search_space if name in paths]
    if locs:
        raise SpecError([{"loc": loc, "msg": "a file-system path on the training machines; "
                          "only an admin token may set it"} for loc in locs])


@functools.lru_cache(maxsize=256)
def _task_fields(task_cls: type[trainers.Task]) -> dict[str, trainers.FieldInfo]:
    """The training options and the task's options by name (fixed for a class: cached)."""
    infos = trainers.describe(trainers.TrainConfig) + task_cls.fields()
    return {info.name: info for info in infos}


def _exc(e: BaseException) -> str:
    return public_message(f"{type(e).__name__}: {e}")


def _contract_msg(task: str, rule: str, detail: str) -> str:
    return (f"task {task!r} breaks the task contract, rule {rule!r}: {public_message(detail)} "
            f"(`hpo task check {task}` runs every rule)")


@functools.lru_cache(maxsize=256)
def _creation_violations(task_cls: type[trainers.Task], options: Any,
                         config: trainers.TrainConfig) -> tuple:
    return tuple(creation_violations(task_cls(options), config))


def _check_contract(spec: StudySpec, task_cls: type[trainers.Task]) -> list[dict]:
    """The cheap part of the task contract (issue 12): the task builds and reports the
    metrics it declares. Built-in tasks are held to it by this project's own tests."""
    if task_cls.__module__.startswith("trainers."):
        return []
    task, config = trainers.create(task_cls, spec.config)
    try:
        found = _creation_violations(task_cls, task.options, config)
    except TypeError:  # options that cannot be hashed: not cached
        found = creation_violations(task, config)
    return [{"loc": "task", "msg": _contract_msg(spec.task, r.rule, r.detail)} for r in found]


def _try_create(task_cls: type[trainers.Task], params: dict[str, Any]
                ) -> trainers.ConfigError | None:
    try:
        trainers.create(task_cls, params)
    except trainers.ConfigError as e:
        return e
    return None


class _ValueCheck:
    """``_try_create(task_cls, {**config, name: value})`` for one value after another, on a
    ``config`` that ``trainers.create`` accepted: only the dataclass that ``name`` belongs
    to is built again (the other is the accepted one), about 14 us for a ``TrainConfig``
    field and 4 us for a task option instead of 27 us."""

    def __init__(self, task_cls: type[trainers.Task], config: dict[str, Any]) -> None:
        self.task_cls = task_cls
        self.config_names = {f.name for f in trainers.describe(trainers.TrainConfig)}
        self.option_names = {f.name for f in task_cls.fields()}
        self.config = {**task_cls.default_config,
                       **{k: v for k, v in config.items() if k in self.config_names}}
        self.options = {k: v for k, v in config.items() if k in self.option_names}

    def __call__(self, name: str, value: Any) -> trainers.ConfigError | None:
        try:
            if name in self.option_names:  # as trainers.create: options, then the config
                self.task_cls(trainers.fields.build(self.task_cls.Options,
                                                    {**self.options, name: value}))
            if name in self.config_names:
                self.task_cls.check_config(trainers.fields.build(
                    trainers.TrainConfig, {**self.config, name: value}))
        except trainers.ConfigError as e:
            return e
        except trainers.USER_CODE_ERRORS as e:  # the task's own code, for this one value
            return trainers.ConfigError(name, f"the task raised {_exc(e)} for this value (a "
                                              "task refuses a value with trainers.ConfigError)")
        return None


def out_of_range(info: trainers.FieldInfo, value: Any) -> str | None:
    """Why a number is too large for a training option (``None`` if it is not).

    Every ``int`` option is a count, a size or a seed: at most
    :data:`~hpo.algorithms.MAX_COUNT` in absolute value (``seed``: TrainConfig's
    own ``2**32 - 1``; ``num_workers``: 256 processes), so that the run's
    products of counts stay within int64;
    a ``float`` option takes what a float64 holds. Ranges of the option itself
    (``>= 1``, ...) are the task's to check.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    if info.kind == "int":
        limit = INT_OPTION_LIMITS.get(info.name, MAX_COUNT)
        if abs(value) > limit:
            return f"must be at most {limit} in absolute value, got {_number(value)}"
    elif info.kind == "float" and isinstance(value, int) and abs(value) > sys.float_info.max:
        return f"must be a finite float64, got {_number(value)}"
    return None


def _number(value: int | float) -> str:
    digits = len(str(abs(value))) if isinstance(value, int) else 0
    return f"an integer of {digits} digits" if digits > 20 else repr(value)


def _check_config(spec: StudySpec, task_cls: type[trainers.Task],
                  fields: dict[str, trainers.FieldInfo]) -> list[dict]:
    errors = []
    for name, value in spec.config.items():
        if len(errors) >= MAX_ERRORS:
            errors.append(_unchecked("config"))
            break
        if name in MANAGED_FIELDS:
            errors.append({"loc": f"config.{name}", "msg": MANAGED_FIELDS[name]})
        elif name not in fields:
            errors.append({"loc": f"config.{name}",
                           "msg": f"not a training option nor an option of task {spec.task!r}"
                                  f"{did_you_mean(name, fields)}"})
        elif (why := out_of_range(fields[name], value)) is not None:
            errors.append({"loc": f"config.{name}", "msg": why})
    if not errors:
        e = _try_create(task_cls, spec.config)
        if e is not None:  # field "task": the task class itself (trainers.Task.check_config)
            errors.append({"loc": "task" if e.field == "task" else f"config.{e.field}",
                           "msg": e.reason})
    return errors


def _param_values(param) -> list[tuple[str, Any]]:
    if isinstance(param, CategoricalParam):
        return [(f"choices.{i}", c) for i, c in enumerate(param.choices)]
    return [("low", param.low), ("high", param.high)]


def _check_search_space(spec: StudySpec, task_cls: type[trainers.Task],
                        fields: dict[str, trainers.FieldInfo]) -> list[dict]:
    errors = []
    check = _ValueCheck(task_cls, spec.config)
    for name, param in spec.search_space.items():
        loc = f"search_space.{name}"
        if len(errors) >= MAX_ERRORS:
            errors.append(_unchecked("search_space"))
            break
        if name in MANAGED_FIELDS:
            errors.append({"loc": loc, "msg": MANAGED_FIELDS[name]})
            continue
        if name not in fields:
            known = sorted(set(fields) - set(MANAGED_FIELDS))
            errors.append({"loc": loc, "msg": f"not a parameter of task {spec.task!r}"
                                              f"{did_you_mean(name, known)}; "
                                              f"parameters: {', '.join(known)}"})
            continue
        if name in spec.config:
            errors.append({"loc": loc, "msg": "also fixed in config; remove one of the two"})
            continue
        kind = fields[name].kind
        if isinstance(param, FloatParam) and kind == "int":
            errors.append({"loc": f"{loc}.type", "msg": "the task's field is an int: use int"})
            continue
        if isinstance(param, FloatParam | IntParam) and kind not in ("int", "float"):
            errors.append({"loc": f"{loc}.type",
                           "msg": f"the task's field is {kind}: use categorical"})
            continue
        for where, value in _param_values(param):
            if len(errors) >= MAX_ERRORS:
                return [*errors, _unchecked("search_space")]
            why = out_of_range(fields[name], value)
            e = None if why else check(name, value)
            if why or e is not None:
                errors.append({"loc": f"{loc}.{where}", "msg": why or e.reason})
    return errors


def _check_objectives(spec: StudySpec, task_cls) -> tuple[list[Objective], list[dict]]:
    errors, filled = [], []
    many = isinstance(spec.objective, list)
    for i, objective in enumerate(spec.objectives):
        loc = f"objective.{i}" if many else "objective"
        if objective.metric not in task_cls.metrics:
            errors.append({"loc": f"{loc}.metric",
                           "msg": f"task {spec.task!r} reports {sorted(task_cls.metrics)}, "
                                  f"not {objective.metric!r}"
                                  f"{did_you_mean(objective.metric, task_cls.metrics)}"})
            filled.append(objective)
            continue
        direction = objective.direction or task_cls.metrics[objective.metric]
        filled.append(objective.model_copy(update={"direction": direction}))
    return filled, errors


def _check_constraints(spec: StudySpec, task_cls) -> list[dict]:
    """Each constraint's metric is one the trials report: a metric never reported
    violates its bound (``hpo.record``), so every trial would be infeasible."""
    known = {*task_cls.metrics, *trainers.LOOP_METRICS}
    if task_cls.item_unit != "token" and "tokens_per_s" not in task_cls.metrics:
        known.discard("tokens_per_s")  # not offered where it is refused (helper-36)
    workers = spec.resources.workers
    errors = []
    for i, c in enumerate(spec.constraints):
        rank = re.fullmatch(r"peak_memory_bytes_rank([0-9]+)", c.metric)
        msg = None
        if rank is not None:
            if spec.resources.parallelism != "fsdp" or workers < 2 or int(rank[1]) >= workers:
                msg = (f"{c.metric} is reported under resources.parallelism fsdp with 2 "
                       f"workers or more, for ranks 0 to workers - 1; this study has "
                       f"{spec.resources.parallelism} with {workers} worker"
                       f"{'s' if workers != 1 else ''}")
        elif c.metric == "tokens_per_s" and c.metric not in known:
            msg = (f"tokens_per_s is reported by token tasks only; task {spec.task!r} "
                   f"counts {task_cls.item_unit}s (samples_per_s)")
        elif c.metric not in known:
            msg = (f"task {spec.task!r} and the loop report {sorted(known)}, not "
                   f"{c.metric!r}{did_you_mean(c.metric, known)}")
        if msg is not None:
            errors.append({"loc": f"constraints.{i}.metric", "msg": msg})
    return errors


def in_distribution(param, value: Any) -> bool:
    """Whether ``value`` is a point of the search-space parameter ``param``."""
    if isinstance(param, CategoricalParam):
        return any(type(c) is type(value) and c == value for c in param.choices)
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    if isinstance(param, IntParam) and not isinstance(value, int):  # 2.0 is a float
        return False
    if not param.low <= value <= param.high:
        return False
    if param.step is not None and not (isinstance(param, IntParam) and param.step == 1):
        n = (value - param.low) / param.step
        return abs(n - round(n)) < 1e-8
    return True


def _unchecked(loc: str) -> dict[str, str]:
    return {"loc": loc, "msg": f"not checked further: the first {MAX_ERRORS} problems "
                               "are listed"}


def _in_space(param, value: Any, choices: dict[str, frozenset], name: str) -> bool:
    """:func:`in_distribution`, with a categorical's choices looked up in a set (a warm
    start of 1000 points over 1000 choices: 2 ms, not 2 s)."""
    if not isinstance(param, CategoricalParam):
        return in_distribution(param, value)
    if name not in choices:  # (type, value): 1, 1.0 and True are distinct points
        choices[name] = frozenset((type(c), c) for c in param.choices)
    return value == value and (type(value), value) in choices[name]  # NaN is no point


def _check_warm_start(spec: StudySpec) -> list[dict]:
    errors = []
    choices: dict[str, frozenset] = {}  # the categoricals' choices, each built once
    most = sum(e.top_k if isinstance(e, WarmStartStudy) else 1 for e in spec.warm_start)
    if most > spec.budget.n_trials:
        errors.append({"loc": "warm_start", "msg": f"up to {most} points (counting top_k) "
                       f"but budget.n_trials is {spec.budget.n_trials}: some would never run"})
    for i, entry in enumerate(spec.warm_start):
        if len(errors) >= MAX_ERRORS:
            errors.append(_unchecked("warm_start"))
            break
        if spec.scheduler.name in POPULATION_SCHEDULERS:
            # Ray's variant generator draws the population; points enqueued in the Optuna
            # study would be recorded for trials that never ran them
            errors.append({"loc": f"warm_start.{i}",
                           "msg": f"{spec.scheduler.name} samples its own population: "
                                  "warm start needs a sampler-driven scheduler"})
            continue
        if isinstance(entry, WarmStartStudy):
            continue
        for name, value in entry.params.items():
            loc = f"warm_start.{i}.params.{name}"
            if name not in spec.search_space:
                errors.append({"loc": loc, "msg": "not a parameter of the search space"})
            elif not _in_space(spec.search_space[name], value, choices, name):
                errors.append({"loc": loc, "msg": f"{value!r} is outside the search space"})
    return errors


def first_judgement(s, at: str = "scheduler") -> tuple[str, int] | None:
    """Where a scheduler (or Optuna pruner) first judges a trial: the field that sets it
    (``scheduler.grace_period``, ``scheduler.pruner.n_warmup_steps``, ...) and the update
    before which it never stops one; ``None`` for the others (FIFO, Hyperband, PBT, and
    a pruner that starts at once)."""
    name = s.name
    if at == "scheduler" and name in ("asha", "mo-asha", "median"):
        return f"{at}.grace_period", s.grace_period
    if at == "scheduler":
        return first_judgement(s.pruner, f"{at}.pruner") if name == "optuna-pruner" else None
    if name in ("median", "percentile") and s.n_warmup_steps:
        return f"{at}.n_warmup_steps", s.n_warmup_steps
    if name == "successive-halving" and isinstance(s.min_resource, int):  # its first rung
        return f"{at}.min_resource", s.min_resource * s.reduction_factor ** (
            s.min_early_stopping_rate)
    if name == "hyperband" and isinstance(s.min_resource, int):
        return f"{at}.min_resource", s.min_resource
    if name == "wilcoxon" and s.n_startup_steps:
        return f"{at}.n_startup_steps", s.n_startup_steps
    if name == "patient" and s.wrapped is not None:
        return first_judgement(s.wrapped, f"{at}.wrapped")
    return None


def most_planned_updates(spec: StudySpec, planned: int) -> int:
    """The most updates a trial of ``spec`` may plan: ``planned`` (the spec's config's), or
    more where a searched value (``max_epochs``, ``micro_batch_size``, a task's data
    option...) gives more, each parameter at its ends (``low``, ``high``) or choices with
    the others at the config's values (a value the task refuses is left out). The review's
    finding: a spec whose space raises the budget was refused on the config's alone."""
    most = planned
    for name, param in spec.search_space.items():
        values = getattr(param, "choices", None) or [param.low, param.high]
        for value in values:
            try:
                task, config = trainers.create(spec.task, {**spec.config, name: value})
                most = max(most, trainers.planned_updates(task, config))
            except trainers.USER_CODE_ERRORS:  # a value this task or config refuses
                continue
    return most


def check_budgets(spec: StudySpec, new: bool = True) -> None:
    """Refuse scheduler budgets that the trials' planned updates make meaningless; ``new``:
    the study is not stored yet (a scheduler that would never judge a trial is refused
    then only: a stored study that ran so goes on so after a restart).

    Builds the task's datasets to count the planned updates, so it runs in the
    driver when the study starts (``hpo.tune.driver.run_study``), never on a
    request thread nor inside ``parse_spec``.

    Raises:
        SpecError: the task's training or validation set is empty with the spec's config
            (every trial would fail: helper-32 saw a study accepted and each of its
            trials fail), a scheduler's or pruner's first judgement beyond the most
            updates a trial may plan (:func:`first_judgement`, :func:`most_planned_updates`:
            it would never stop a trial),
            ASHA's (or MO-ASHA's) ``grace_period`` beyond ``max_t``, a
            ``reduction_factor`` that makes more than :data:`hpo.algorithms.MAX_RUNGS`
            rungs up to ``max_t`` (ASHA, MO-ASHA, Hyperband), or a PBT/PB2
            ``perturbation_interval`` not below the trials' planned updates.
    """
    task, config = trainers.create(spec.task, spec.config)
    for name, dataset in zip(("training", "validation"), task.datasets(config.seed),
                             strict=True):
        if len(dataset) == 0:
            raise SpecError.at("task", f"task {spec.task!r} gives an empty {name} set with "
                               "this config: every trial would fail")
    s = spec.scheduler
    first = first_judgement(s)
    rungs = s.name in ("asha", "mo-asha") or (s.name == "hyperband" and s.max_t is None)
    if first is None and not rungs and s.name not in POPULATION_SCHEDULERS:
        return  # (Hyperband with its max_t: judged by parse_spec already)
    planned = trainers.planned_updates(task, config)
    if rungs:
        max_t = s.max_t or planned
        where = "max_t" if s.max_t else "the trials' planned updates"
        grace = getattr(s, "grace_period", 1)  # Hyperband's least rung: 1 update
        if grace > max_t:
            raise SpecError.at("scheduler.grace_period", f"{grace} is beyond {where} ({max_t})")
        if why := rungs_problem(grace, max_t, s.reduction_factor, where):
            raise SpecError.at("scheduler.reduction_factor", why)
    elif s.name in POPULATION_SCHEDULERS and s.perturbation_interval >= planned:
        raise SpecError.at("scheduler.perturbation_interval",
                           f"{s.perturbation_interval} is not below the trials' {planned} "
                           f"planned updates: no trial would ever be perturbed")
    if new and first is not None and first[1] > planned and first[1] > (
            most := most_planned_updates(spec, planned)):  # (ASHA's under a larger max_t
        field, step = first                               # too: the breaker's finding)
        raise SpecError.at(field, f"{step} is beyond the trials' {most} planned updates: "
                                  "no trial would ever be judged (the study would run as "
                                  "fifo)")
