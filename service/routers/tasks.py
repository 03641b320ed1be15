"""``/v1/tasks``: the registered training tasks, their options and metrics."""

from __future__ import annotations

import functools

from fastapi import APIRouter

import trainers
from hpo.errors import public_message
from service.api_errors import documented
from service.deps import Reader
from service.schemas import FieldOut, TaskOut, TasksOut

router = APIRouter(prefix="/v1/tasks", tags=["tasks"])


def _fields(infos: list[trainers.FieldInfo]) -> list[FieldOut]:
    return [FieldOut(**{**info.to_dict(), "choices": list(info.choices)
                        if info.choices is not None else None}) for info in infos]


def _task(name: str) -> TaskOut:
    """One task's description; a task that cannot be loaded or described (any error at
    import, in its class attributes or its options' schema) is listed with its error, so
    that one broken installed package does not take ``/v1/tasks`` down for everyone."""
    try:
        cls = trainers.get_task(name)
        return TaskOut(name=name, objective=cls.objective, metrics=dict(cls.metrics),
                       options=_fields(cls.fields()))
    except trainers.USER_CODE_ERRORS as e:  # noqa: BLE001 - an installed package may raise anything
        return TaskOut(name=name, objective=None, metrics={}, options=[],
                       error=public_message(f"{type(e).__name__}: {e}"))  # no module paths


@functools.cache
def describe_tasks() -> TasksOut:
    """Every task known to this process (entry points are read once per process)."""
    return TasksOut(training_fields=_fields(trainers.describe(trainers.TrainConfig)),
                    tasks=[_task(name) for name in trainers.list_tasks()])


@router.get("", response_model=TasksOut, responses=documented(401, 503))
def list_tasks(who: Reader) -> TasksOut:
    """The built-in and installed tasks (entry-point group ``hpo.trainers``)."""
    return describe_tasks()
