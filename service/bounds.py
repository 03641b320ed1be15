"""Bounds on the costly options of a study, for tokens that are not admins (issue 15.4).

A member could otherwise queue a study that takes the cluster down: a million DataLoader
processes, a micro-batch of 1e12 samples, a 39-billion-parameter model, a search space
whose validation alone takes a minute. The admin sets each bound in
:class:`~service.settings.Settings`:

- ``HPO_MAX_TRIAL_WORKERS``: ``resources.workers`` (the DDP processes of a trial);
- ``HPO_MAX_DATA_WORKERS``: ``num_workers`` (DataLoader processes of each trial worker);
- ``HPO_MAX_MICRO_BATCH_SIZE``: ``micro_batch_size`` and ``eval_batch_size``;
- ``HPO_MAX_MODEL_PARAMETERS``: the task's model, counted at the extremes of the space;
- ``HPO_MAX_TRIALS`` and ``HPO_MAX_CONCURRENT_TRIALS``: the ``budget``;
- ``HPO_MAX_SEARCH_PARAMETERS``: the parameters of ``search_space``;
- ``HPO_MAX_SEARCH_CHOICES``: the choices of its categoricals, summed.

Each bound applies to the spec's ``config`` and to every value its search space may draw
(a numeric parameter's ``high``, each categorical choice). A refusal is a
:class:`~hpo.errors.SpecError` naming the field, the limit and its variable (422).
Admin tokens are not bounded.

The size and option bounds are checked on the structurally valid spec, before the task's
checks (which build the training configuration once per value of the search space, about
4 to 14 us each), so that a refusal costs milliseconds whatever the body's size; the model's
size is counted last, on a spec the task accepted, without building the model
(:meth:`trainers.Task.parameter_count`).
"""

from __future__ import annotations

import contextlib
import functools
import math
from collections.abc import Iterator, Mapping
from typing import Any

import trainers
from hpo.errors import SpecError, public_message
from hpo.params import CategoricalParam, FloatParam, IntParam
from hpo.spec import StudySpec, parse_spec
from service.auth import Principal
from service.settings import Settings

__all__ = ["check_model", "check_size", "model_parameters", "parse_bounded"]

# training options bounded by a setting: {option: (Settings field, variable)}
OPTION_BOUNDS = {"num_workers": ("max_data_workers", "HPO_MAX_DATA_WORKERS"),
                 "micro_batch_size": ("max_micro_batch_size", "HPO_MAX_MICRO_BATCH_SIZE"),
                 "eval_batch_size": ("max_micro_batch_size", "HPO_MAX_MICRO_BATCH_SIZE")}
NOT_ADMIN = "for a non-admin token"


def parse_bounded(data: Mapping[str, Any], owner: Principal, settings: Settings) -> StudySpec:
    """The one parse of a submitted spec, with ``owner``'s bounds: none for an admin.

    For any other token, fields that name a path of the training machines are refused
    (:func:`hpo.spec.parse_spec`'s ``allow_paths``), the size and option bounds are
    checked before the task's checks (:func:`check_size`) and the model's size after
    them (:func:`check_model`).

    Raises:
        hpo.errors.SpecError: the spec is invalid, or over a bound (each field named,
            with the limit and its variable).
    """
    if owner.is_admin:
        return parse_spec(data, allow_paths=True)
    spec = parse_spec(data, allow_paths=False,
                      bound=functools.partial(check_size, settings=settings))
    check_model(spec, settings)
    return spec


def check_size(spec: StudySpec, settings: Settings) -> None:
    """Refuse a structurally valid spec over the bounds that need no task: the budget,
    the trial's processes, the batch sizes and the search space's size.

    Linear in the spec's size, and cheap: about 1 us per categorical choice.

    Raises:
        hpo.errors.SpecError: one entry per field over its bound.
    """
    errors = []

    def over(loc: str, value: Any, field: str, variable: str) -> None:
        limit = getattr(settings, field)
        if _number(value) and value > limit:
            errors.append({"loc": loc, "msg": f"must be at most {limit:,} {NOT_ADMIN} "
                                              f"({variable}), got {_show(value)}"})

    over("budget.n_trials", spec.budget.n_trials, "max_trials", "HPO_MAX_TRIALS")
    over("budget.max_concurrent_trials", spec.budget.max_concurrent_trials,
         "max_concurrent_trials", "HPO_MAX_CONCURRENT_TRIALS")
    over("resources.workers", spec.resources.workers, "max_trial_workers",
         "HPO_MAX_TRIAL_WORKERS")
    for name, (field, variable) in OPTION_BOUNDS.items():
        if name in spec.config:
            over(f"config.{name}", spec.config[name], field, variable)
        if name in spec.search_space:
            for where, value in _largest(spec.search_space[name]):
                over(f"search_space.{name}.{where}", value, field, variable)
    space = spec.search_space
    if len(space) > settings.max_search_parameters:
        errors.append({"loc": "search_space",
                       "msg": f"{len(space):,} parameters; at most "
                              f"{settings.max_search_parameters:,} {NOT_ADMIN} "
                              "(HPO_MAX_SEARCH_PARAMETERS)"})
    choices = sum(len(p.choices) for p in space.values() if isinstance(p, CategoricalParam))
    if choices > settings.max_search_choices:
        errors.append({"loc": "search_space",
                       "msg": f"{choices:,} categorical choices in all; at most "
                              f"{settings.max_search_choices:,} {NOT_ADMIN} "
                              "(HPO_MAX_SEARCH_CHOICES)"})
    if errors:
        raise SpecError(errors)


def check_model(spec: StudySpec, settings: Settings) -> None:
    """Refuse a spec whose task's model has more than ``HPO_MAX_MODEL_PARAMETERS``
    parameters at some point of the search space (:func:`model_parameters`).

    Call it on a spec the task accepted (after :func:`hpo.spec.parse_spec`).

    Raises:
        hpo.errors.SpecError: naming ``config`` (the fixed options make the model too
            large), ``search_space.NAME`` (that parameter's range does) or
            ``search_space`` (their largest values together do); or ``task`` when the
            task cannot count its model's parameters.
    """
    try:
        count, loc = model_parameters(spec)
    except SpecError:
        raise
    except Exception as e:  # noqa: BLE001 - an installed task's count may raise anything
        raise SpecError.at("task", "the task could not count its model's parameters: "
                                   f"{public_message(f'{type(e).__name__}: {e}')}") from None
    limit = settings.max_model_parameters
    if count > limit:
        raise SpecError.at(loc, f"the model has {count:,} parameters; at most {limit:,} "
                                f"{NOT_ADMIN} (HPO_MAX_MODEL_PARAMETERS)")


def model_parameters(spec: StudySpec) -> tuple[int, str]:
    """The largest parameter count of ``spec``'s model, and the field that gives it.

    Counted (:meth:`trainers.Task.parameter_count`, no model allocated) at the fixed
    ``config``; with each searched task option at each of its extreme values (a numeric
    parameter's ``low`` and ``high``, a categorical's smallest and largest numbers and
    each of its other choices); and with every searched option at its largest number at
    once, when the task accepts that point. Options only: ``TrainConfig``'s fields shape
    no model.

    Raises:
        trainers.ConfigError: the fixed config gives no model (the spec was not
            accepted by its task).
    """
    task_cls = trainers.get_task(spec.task)
    options = {info.name for info in task_cls.fields()}
    searched = {name: list(_extremes(p)) for name, p in spec.search_space.items()
                if name in options}
    best = (_count(task_cls, spec.config), "config")
    for name, values in searched.items():
        for value in values:
            best = max(best, (_count(task_cls, {**spec.config, name: value}),
                              f"search_space.{name}"))
    if len(searched) > 1:
        corner = {name: max((v for v in values if _number(v)), default=values[0])
                  for name, values in searched.items()}
        try:
            best = max(best, (_count(task_cls, {**spec.config, **corner}), "search_space"))
        except trainers.ConfigError:
            # the task refuses the corner (the largest n_head may not divide the largest
            # d_model): the points next to it, one parameter moved to another of its
            # extremes, bound it; none valid: the size cannot be bounded, refused
            near = []
            for name, values in searched.items():
                for value in values:
                    if value != corner[name]:
                        with contextlib.suppress(trainers.ConfigError):
                            near.append(_count(task_cls, {**spec.config, **corner,
                                                          name: value}))
            if not near:
                raise SpecError.at("search_space", "the model's size cannot be bounded: the "
                                   "task accepts neither the searched options' largest values "
                                   "together nor any point next to them; narrow the search "
                                   f"space {NOT_ADMIN}") from None
            best = max(best, (max(near), "search_space"))
    return best


def _count(task_cls: type[trainers.Task], params: Mapping[str, Any]) -> int:
    task, config = trainers.create(task_cls, params)
    try:
        return _cached_count(task_cls, task.options, config)
    except TypeError:  # options that cannot be hashed: not cached
        return task.parameter_count(config)


@functools.lru_cache(maxsize=1024)
def _cached_count(task_cls: type[trainers.Task], options: Any,
                  config: trainers.TrainConfig) -> int:
    return int(task_cls(options).parameter_count(config))


def _extremes(param: FloatParam | IntParam | CategoricalParam) -> Iterator[Any]:
    """The values of a parameter that bound what it costs: ``low`` and ``high``; or a
    categorical's smallest and largest numbers and each of its other choices."""
    if not isinstance(param, CategoricalParam):
        yield from (param.low, param.high)
        return
    numbers = [c for c in param.choices if _number(c)]
    if numbers:
        yield from {min(numbers), max(numbers)}
    yield from (c for c in param.choices if not _number(c))


def _largest(param: FloatParam | IntParam | CategoricalParam) -> Iterator[tuple[str, Any]]:
    """``(where, value)`` of the largest value a parameter may draw: ``high``, or its
    largest numeric choice."""
    if isinstance(param, CategoricalParam):
        numbers = [(c, i) for i, c in enumerate(param.choices) if _number(c)]
        if numbers:
            value, i = max(numbers)
            yield f"choices.{i}", value
    else:
        yield "high", param.high


def _number(value: Any) -> bool:
    return (isinstance(value, int | float) and not isinstance(value, bool)
            and not (isinstance(value, float) and math.isnan(value)))


def _show(value: Any) -> str:
    if isinstance(value, int) and abs(value) >= 10**20:
        return f"an integer of {len(str(abs(value)))} digits"
    return repr(value)
