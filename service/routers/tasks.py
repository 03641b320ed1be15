"""``/v1/tasks``: the registered training tasks, their options and metrics."""

from __future__ import annotations

import functools
import time

from fastapi import APIRouter

import trainers
from hpo.errors import public_message
from service.api_errors import documented
from service.deps import Reader
from service.schemas import FieldOut, TaskOut, TasksOut
from trainers.contract import process_state_kept
from trainers.tasks import ENTRY_POINTS_MAX_AGE_S

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])


def _fields(infos: list[trainers.FieldInfo]) -> list[FieldOut]:
    return [FieldOut(**{**info.to_dict(), "choices": list(info.choices)
                        if info.choices is not None else None}) for info in infos]


def _task(name: str) -> TaskOut:
    """One task's description; a task that cannot be loaded or described (any error at
    import, in its class attributes or its options' schema) is listed with its error, so
    that one broken installed package does not take ``/v1/tasks`` down for everyone."""
    try:
        with process_state_kept(f"task {name!r}"):
            cls = trainers.get_task(name)
        return TaskOut(name=name, objective=cls.objective, metrics=dict(cls.metrics),
                       options=_fields(cls.fields()))
    except trainers.USER_CODE_ERRORS as e:  # an installed package may raise anything
        return TaskOut(name=name, objective=None, metrics={}, options=[],
                       error=public_message(f"{type(e).__name__}: {e}"))  # no module paths


@functools.lru_cache(maxsize=4)
def describe_tasks(targets: tuple[tuple[str, str], ...], period: int) -> TasksOut:
    """The tasks of ``targets`` (name, ``module:Class``), described once for each set of
    installed tasks and each ``ENTRY_POINTS_MAX_AGE_S`` period: a package installed,
    removed or mended while the service runs shows here as it does at study creation
    (helper-41: the first description was kept for the process's life)."""
    return TasksOut(training_fields=_fields(trainers.describe(trainers.TrainConfig)),
                    tasks=[_task(name) for name, _ in targets])


def current_tasks() -> TasksOut:
    """:func:`describe_tasks` of the tasks installed now."""
    names = trainers.list_tasks()  # reads the entry points anew
    targets = tuple((name, trainers.task_target(name)) for name in names)
    return describe_tasks(targets, int(time.monotonic() // ENTRY_POINTS_MAX_AGE_S))


@router.get("", response_model=TasksOut, responses=documented(401, 503))
def list_tasks(who: Reader) -> TasksOut:
    """The built-in and installed tasks (entry-point group ``hpo.trainers``)."""
    return current_tasks()
