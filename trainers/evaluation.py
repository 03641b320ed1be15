"""Evaluation over the validation set, sharded across ranks and reduced exactly."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import torch
from torch import nn
from torch.utils.data import Dataset

from trainers.components import move_to
from trainers.data import loader, micro_batches
from trainers.distributed import DistInfo, all_reduce_sums
from trainers.errors import TrainersError
from trainers.fsdp import is_fsdp_module
from trainers.tasks.base import Task


@torch.no_grad()
def evaluate(task: Task, model: nn.Module, dataset: Dataset, info: DistInfo,
             autocast: Callable[[], ContextManager], batch_size: int) -> dict[str, float]:
    """The task's evaluation metrics of ``model`` on ``dataset``.

    Rank ``r`` evaluates samples ``r, r + world_size, ...`` (no padding, so every
    sample counts once); the task's additive statistics are summed over ranks
    and turned into metrics by ``task.eval_metrics``. The model is left in eval
    mode; the caller switches it back.

    A rank with no sample of its own (a validation set smaller than the world
    size) evaluates sample 0 and discards its statistics, so that it sums the
    same statistics, at zero, as the other ranks. An FSDP-sharded model
    all-gathers its parameters in every forward, a collective: a rank with fewer
    batches than rank 0 runs forwards on its first batch (or sample 0) to match,
    and discards their statistics; the model is resharded at the end (FSDP2
    keeps a root's parameters gathered after a forward, awaiting its backward).

    Args:
        batch_size: samples per evaluation batch (>= 1).

    Raises:
        TrainersError: the validation set is empty (on every rank).
    """
    if len(dataset) == 0:
        raise TrainersError(f"the validation set of task {task.name!r} is empty")
    model.eval()
    order = list(range(info.rank, len(dataset), info.world_size))
    batches = micro_batches(order, batch_size)
    n_real = len(batches)
    most = max(n_real, 1)
    if is_fsdp_module(model) and info.enabled:
        most = len(micro_batches(range(0, len(dataset), info.world_size), batch_size))
    batches += [batches[0] if batches else [0]] * (most - n_real)
    sums: dict[str, float] = {}
    for i, batch in enumerate(loader(dataset, batches, task.collate)):
        with autocast():
            stats = task.eval_sums(model, move_to(batch, info.device))
        for key, value in stats.items():
            sums[key] = sums.get(key, 0.0) + (float(value) if i < n_real else 0.0)
    if is_fsdp_module(model):  # a root stays unsharded after a forward without backward
        model.reshard()
    return task.eval_metrics(all_reduce_sums(sums, info))
