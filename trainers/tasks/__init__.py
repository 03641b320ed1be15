"""The task registry: built-in tasks plus tasks installed through the ``hpo.trainers`` entry points.

A package registers its own task in its ``pyproject.toml``::

    [project.entry-points."hpo.trainers"]
    mytask = "mypackage.tasks:MyTask"

where ``MyTask`` subclasses :class:`trainers.tasks.Task`. Modules are imported
only when their task is asked for (``digits`` pulls in scikit-learn).
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import time
from collections.abc import Mapping
from typing import Any

from trainers.config import TrainConfig
from trainers.errors import ConfigError, UnknownTaskError
from trainers.fields import build, describe
from trainers.tasks.base import Direction, NoOptions, Task

__all__ = [
    "ENTRY_POINT_GROUP",
    "Direction",
    "NoOptions",
    "Task",
    "create",
    "get_task",
    "list_tasks",
    "load_task",
    "task_target",
]

ENTRY_POINT_GROUP = "hpo.trainers"

_BUILTIN = {
    "digits": "trainers.tasks.digits:DigitsTask",
    "charlm": "trainers.tasks.charlm:CharLMTask",
}


# The installed entry points, as last read: ``importlib.metadata.entry_points`` reads every
# installed distribution's metadata (about 2 ms here, an eighth of the service's CPU per
# create under bench/load.py). A name not found, or a reading older than
# ENTRY_POINTS_MAX_AGE_S, reads them again: a package installed while the process runs is
# found at once, a changed one within that time.
ENTRY_POINTS_MAX_AGE_S = 30.0
_installed: tuple[float, dict[str, str]] | None = None
_twice_warned: set[tuple[str, str, str]] = set()  # a name registered twice, warned of once
_log = logging.getLogger(__name__)


def _targets(fresh: bool = True) -> dict[str, str]:
    """Every task name and its target; ``fresh=False`` may answer from the last reading."""
    global _installed
    if fresh or _installed is None or (
            time.monotonic() - _installed[0] > ENTRY_POINTS_MAX_AGE_S):
        found: dict[str, str] = {}
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            # in sys.path order: the first registration of a name wins, as the first
            # module on the path does (helper-41: the last one won, silently)
            twice = (ep.name, found.setdefault(ep.name, ep.value), ep.value)
            if twice[1] != twice[2] and twice not in _twice_warned:
                _twice_warned.add(twice)
                _log.warning("task %r is registered twice: %s is used, %s is not", *twice)
        _installed = (time.monotonic(), found)
    targets = dict(_installed[1])
    targets.update(_BUILTIN)  # an installed package cannot shadow a built-in task
    return targets


def list_tasks() -> list[str]:
    """Names of every built-in and installed task, sorted."""
    return sorted(_targets())


def task_target(name: str) -> str:
    """The ``"module:Class"`` target registered under the task name ``name``.

    Raises:
        UnknownTaskError: no such task.
    """
    if name in _BUILTIN:
        return _BUILTIN[name]
    targets = _targets(fresh=False)
    if name not in targets:
        targets = _targets()
    if name not in targets:
        raise UnknownTaskError(name, list(targets))
    return targets[name]


def get_task(name: str) -> type[Task]:
    """The task class registered under ``name``.

    Raises:
        UnknownTaskError: no such task.
        TypeError: the entry point does not name a ``Task`` subclass.
    """
    target = task_target(name)
    try:
        return _load(name, target)
    except (ImportError, AttributeError):
        if name in _BUILTIN:
            raise
        # the target came from a cached reading of the entry points: the package may have
        # been removed, or its entry point moved, since; read them again
        fresh = _targets()
        if name not in fresh:
            raise UnknownTaskError(name, list(fresh)) from None
        if fresh[name] == target:
            raise
        return _load(name, fresh[name])


def _load(name: str, target: str) -> type[Task]:
    try:
        return load_task(target)
    except TypeError as e:
        raise TypeError(f"entry point {name!r} = {target!r} is not a trainers Task subclass"
                        ) from e


def load_task(target: str) -> type[Task]:
    """The ``Task`` subclass at ``target`` (``"package.module:Class"``), imported directly.

    This is how a trial loads its task from the code Ray shipped to it (issue 12):
    the worker's own entry points need not list the task. Never call it with a
    target that came from a request: it imports whatever module it names.

    Raises:
        ValueError: ``target`` is not of the form ``module:Class``.
        ImportError: the module cannot be imported (its own error, e.g.
            ``ModuleNotFoundError`` for a dependency missing on this machine).
        AttributeError: the module has no such attribute.
        TypeError: the attribute is not a ``Task`` subclass.
    """
    module_name, sep, attr = target.partition(":")
    if not (sep and module_name and attr):
        raise ValueError(f"a task target is 'module:Class', got {target!r}")
    cls = importlib.import_module(module_name)
    for part in attr.split("."):
        cls = getattr(cls, part)
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TypeError(f"{target!r} is not a trainers Task subclass")
    return cls


def shadowed_options(cls: type[Task]) -> list[str]:
    """The task's options named like a ``TrainConfig`` field, sorted: one value of a flat
    mapping would set both (:func:`create` refuses such a task)."""
    return sorted({f.name for f in cls.fields()} & {f.name for f in describe(TrainConfig)})


def create(name: str | type[Task], params: Mapping[str, Any] | None = None, *,
           registered: str | None = None) -> tuple[Task, TrainConfig]:
    """A task instance and its ``TrainConfig`` from one flat mapping of parameters.

    ``name`` is a registered task's name, or a task class (``load_task``); for a class,
    ``registered`` is the name it is registered under, if any (a trial loads its class from
    the code Ray shipped). The task's ``name`` is that registered name, whatever its class
    says: checkpoints and model files record it, and ``trainers evaluate`` looks it up.

    Each key is either a ``TrainConfig`` field or one of the task's options;
    ``TrainConfig`` starts from the task's ``default_config``.

    Raises:
        UnknownTaskError: no such task.
        ConfigError: a key is neither a ``TrainConfig`` field nor a task option,
            or a value is invalid (the error names the key), or the task has an option
            named like a ``TrainConfig`` field.
    """
    cls, name = (get_task(name), name) if isinstance(name, str) else (
        name, registered or name.name)
    params = dict(params or {})
    config_names = {f.name for f in describe(TrainConfig)}
    option_names = {f.name for f in cls.fields()}
    shadowed = shadowed_options(cls)
    if shadowed:  # one value would set both (helper-41): which one a spec meant is unknown;
        # the task class's fault, no value's (field "task", as Task.check_config's objective)
        raise ConfigError("task", f"the task class {cls.__module__}.{cls.__qualname__} has an "
                                  f"option named like the TrainConfig field "
                                  f"{shadowed[0]!r}: rename the option")
    unknown = sorted(set(params) - config_names - option_names)
    if unknown:
        raise ConfigError(unknown[0], f"not a training option nor an option of task {name!r}")
    config_values = {**cls.default_config, **{k: v for k, v in params.items() if k in config_names}}
    options = build(cls.Options, {k: v for k, v in params.items() if k in option_names})
    config = build(TrainConfig, config_values)
    cls.check_config(config)
    task = cls(options)
    if task.name != name:  # a class registered under another name than its own
        task.name = name
    return task, config
