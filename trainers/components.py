"""Everything the loop needs, decided once before it starts (the nanoGPT habit).

:func:`build_run` turns a task and a config into a :class:`Run`: model on its
device (DDP-wrapped or FSDP-sharded, and compiled when asked), optimizer, LR scheduler, loss
scaler, EMA, autocast factory and datasets. Features that are off are no-op
objects, so the loop itself has no feature flags.
"""

from __future__ import annotations

import dataclasses
import os
import random
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.utils.data import Dataset

from trainers.config import TrainConfig
from trainers.data import n_updates_per_epoch
from trainers.distributed import DistInfo, dist_info
from trainers.ema import EMA
from trainers.errors import ConfigError
from trainers.fsdp import build_loss_scaler, grad_sync_factory, shard_ema_shadow, wrap_model
from trainers.optim import build_optimizer
from trainers.precision import autocast_factory
from trainers.schedules import build_scheduler
from trainers.tasks.base import Task


@dataclasses.dataclass
class Run:
    """The components of one training run (see module doc)."""

    task: Task
    config: TrainConfig
    dist: DistInfo
    model: nn.Module            # raw module (FSDP: the sharded one): checkpoints, EMA, evaluation
    train_model: nn.Module      # what the forward pass calls: DDP and/or compiled
    grad_sync: Callable[[bool], ContextManager]  # grad_sync(last micro-batch of the group)
    optimizer: torch.optim.Optimizer
    scheduler: torch.optim.lr_scheduler.LambdaLR
    scaler: torch.amp.GradScaler
    ema: EMA | None
    autocast: Callable[[], ContextManager]
    train_set: Dataset
    val_set: Dataset
    samples_per_rank: int       # per epoch
    updates_per_epoch: int
    total_steps: int            # optimizer updates the schedule spans
    early_stopping_metric: str
    checkpoint_root: Path | None
    sharded_checkpoints: bool   # parallelism fsdp: DCP checkpoints (trainers.dcp), any world size


def seed_everything(seed: int) -> None:
    """Seed Python's, NumPy's and torch's global generators (CPU and CUDA)."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)


def _check_writable(directory: Path) -> None:
    """Fail before training, not at the first checkpoint, when checkpoints cannot be written."""
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-probe-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        raise ConfigError("checkpoint_dir", f"cannot write to {directory}: {e.strerror}") from None


def total_steps(config: TrainConfig, samples_per_rank: int, step: int = 0, epoch: int = 0,
                position: int = 0) -> int:
    """Optimizer updates of a run, if nothing stops it early: of a new run (the defaults),
    or of one after ``step`` applied updates, ``position`` samples into its epoch
    ``epoch`` (0-based). Those updates, then one for each update group of the rest of
    this epoch and the later ones counted under ``config``'s micro-batch size and
    accumulation; the smaller with ``max_updates``. With the sizes of the whole run and
    no fp16 update skipped, a resume's count is the one the run was built with; each
    skipped group makes the count of a run bound by ``max_epochs`` one smaller.

    A resume counts from its position where it changed those sizes (PBT's exploit of a
    ``micro_batch_size``, ``trainers --resume --grad-accum-steps``): counted from zero
    under the new sizes instead, the span could end before the step the run resumed
    at, and the LR was 0 from there on (helper-32's finding).
    """
    per_epoch = n_updates_per_epoch(samples_per_rank, config.micro_batch_size,
                                    config.grad_accum_steps)
    limits = [] if config.max_updates is None else [config.max_updates]
    if config.max_epochs is not None:
        rest = n_updates_per_epoch(max(0, samples_per_rank - position),
                                   config.micro_batch_size, config.grad_accum_steps)
        later = max(0, config.max_epochs - epoch - 1) * per_epoch
        limits.append(step + (rest + later if epoch < config.max_epochs else 0))
    return max(1, min(limits))


def planned_updates(task: Task, config: TrainConfig, world_size: int = 1) -> int:
    """Optimizer updates a run of ``config`` makes if nothing stops it early.

    The smaller of ``max_updates`` and ``max_epochs`` x updates per epoch (with
    ``world_size`` ranks sharing each epoch), counted before the run: fp16 updates
    skipped for overflow do not count toward ``max_updates``, and a run bound by
    ``max_epochs`` makes one update fewer for each (the run's own ``planned_updates``
    metric says so as it goes).
    """
    train_set, _ = task.datasets(config.seed)
    return total_steps(config, -(-len(train_set) // world_size))


def build_run(task: Task, config: TrainConfig) -> Run:
    """Build every component of a run.

    Raises:
        ConfigError: an option the task cannot honour (``Task.check_config``), or
            the device is not available.
    """
    task.check_config(config)
    try:
        info = dist_info(config.device)
    except ValueError as e:
        raise ConfigError("device", str(e)) from e
    if config.checkpoint_dir is not None and info.is_main:
        _check_writable(Path(config.checkpoint_dir))
    train_set, val_set = task.datasets(config.seed)
    seed_everything(config.seed)
    model = task.build_model(config).to(info.device)
    # Dropout and other runtime randomness get their own stream per rank.
    torch.manual_seed(config.seed * 1_000_003 + 1 + info.rank)
    train_model, shadow = wrap_model(model, task, config, info)
    if shadow is not None:
        shadow = shard_ema_shadow(shadow, task, config)
    if config.compile:
        train_model = torch.compile(train_model)
    optimizer = build_optimizer(model, config)
    samples_per_rank = -(-len(train_set) // info.world_size)
    per_epoch = n_updates_per_epoch(samples_per_rank, config.micro_batch_size,
                                    config.grad_accum_steps)
    total = total_steps(config, samples_per_rank)
    return Run(
        task=task, config=config, dist=info, model=model, train_model=train_model,
        grad_sync=grad_sync_factory(train_model, model, config, info),
        optimizer=optimizer, scheduler=build_scheduler(optimizer, config, total),
        scaler=build_loss_scaler(config, info),
        ema=EMA(model, config.ema_decay, shadow) if config.ema_decay is not None else None,
        autocast=autocast_factory(config, info.device), train_set=train_set, val_set=val_set,
        samples_per_rank=samples_per_rank, updates_per_epoch=per_epoch, total_steps=total,
        early_stopping_metric=config.early_stopping_metric or task.objective,
        checkpoint_root=Path(config.checkpoint_dir) if config.checkpoint_dir else None,
        sharded_checkpoints=config.parallelism == "fsdp",
    )


def move_to(batch: Any, device: torch.device) -> Any:
    """Move every tensor of a (nested) batch to ``device``."""
    if isinstance(batch, torch.Tensor):
        return batch.to(device, non_blocking=True)
    if isinstance(batch, tuple | list):
        return type(batch)(move_to(b, device) for b in batch)
    if isinstance(batch, dict):
        return {k: move_to(v, device) for k, v in batch.items()}
    return batch
