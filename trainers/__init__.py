"""trainers: the training-engineering loop every trial runs, in pure PyTorch.

AMP (bf16, fp16 with loss scaling), exact gradient accumulation, clipping, EMA,
LR schedules with warmup, atomic checkpoints with bit-exact resume, early
stopping, activation checkpointing and DDP, behind one entry point::

    task, config = trainers.create("digits", {"lr": 1e-3})
    result = trainers.fit(task, config, reporter=my_reporter)

This package imports only torch, numpy and the standard library (scikit-learn
inside the ``digits`` task); it knows nothing of Ray, Optuna or FastAPI and
talks to them through :class:`Reporter`.
"""

from trainers.components import planned_updates
from trainers.config import TrainConfig
from trainers.errors import (
    USER_CODE_ERRORS,
    CheckpointError,
    ConfigError,
    NonFiniteError,
    TrainersError,
    UnknownTaskError,
)
from trainers.fields import FieldInfo, describe
from trainers.loop import LOOP_METRICS, TrainResult, fit
from trainers.reporting import Decision, ListReporter, NullReporter, Reporter
from trainers.tasks import (
    ENTRY_POINT_GROUP,
    Task,
    create,
    get_task,
    list_tasks,
    load_task,
    task_target,
)

__all__ = [
    "ENTRY_POINT_GROUP",
    "LOOP_METRICS",
    "CheckpointError",
    "ConfigError",
    "Decision",
    "FieldInfo",
    "ListReporter",
    "NonFiniteError",
    "NullReporter",
    "Reporter",
    "Task",
    "TrainConfig",
    "TrainResult",
    "TrainersError",
    "UnknownTaskError",
    "USER_CODE_ERRORS",
    "create",
    "describe",
    "fit",
    "get_task",
    "list_tasks",
    "load_task",
    "planned_updates",
    "task_target",
]
