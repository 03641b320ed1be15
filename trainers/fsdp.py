"""FSDP2: how a run shards its model, syncs gradients, clips and scales them.

Decided once, before the loop (the nanoGPT habit): :func:`wrap_model` returns
the module the forward pass calls, :func:`grad_sync_factory` the context of a
micro-batch's backward, :func:`build_loss_scaler` the fp16 loss scaler. Under
``TrainConfig.parallelism = "ddp"`` (or in one process) they are DDP's or the
1-process identity; under ``"fsdp"`` with ``torch.distributed`` initialized:

* **Sharding.** ``fully_shard`` is applied to every block the task marks
  (``Task.blocks``, charlm: its transformer blocks), then to the root; a task
  without blocks shards the root only. Parameters become ``DTensor`` shards
  (dim 0 over the ranks); forward and backward all-gather a block at a time
  (Zhao et al., "PyTorch FSDP", VLDB 2023; the per-parameter FSDP2 of
  ``torch.distributed.fsdp.fully_shard``).
* **Precision.** bf16 and fp16 add a ``MixedPrecisionPolicy``: parameters are
  all-gathered and computed in the low precision, gradients reduced in fp32
  and kept in fp32 shards. fp16 uses ``ShardedGradScaler``, whose
  ``unscale_`` all-reduces the "found inf" flag, so every rank skips the same
  updates (``torch.amp.GradScaler`` checks only the local shard: a rank whose
  shard overflowed would skip alone).
* **Accumulation.** ``set_requires_gradient_sync(False)`` on all but the last
  micro-batch of a group (FSDP2's own switch, the counterpart of DDP's
  ``no_sync()``): gradients accumulate unsharded and are reduce-scattered once.
* **Clipping.** :func:`clip_grad_norm` measures the norm over ``DTensor``
  gradients and completes it across ranks (``full_tensor``), so the clip and
  the logged ``grad_norm`` use the true global norm.
* **EMA.** The shadow copy is taken before sharding and sharded the same way,
  so each rank keeps and updates only its own shard of the average.

``torch.distributed.fsdp`` and ``.tensor`` are imported only when a run shards
(about 1.4 s of import on these machines, which a DDP or 1-process run, and
every process that only lists tasks, should not pay).
"""

from __future__ import annotations

import contextlib
import copy
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager as ContextManager
from typing import Any

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.distributed import DistInfo, wrap_ddp
from trainers.errors import ConfigError
from trainers.precision import build_scaler
from trainers.tasks.base import Task

_LOW = {"bf16": torch.bfloat16, "fp16": torch.float16}


def is_sharded(config: TrainConfig, info: DistInfo) -> bool:
    """Whether this run shards its model: ``parallelism`` fsdp and more than one rank.

    Raises:
        ConfigError: ``parallelism`` is neither ddp nor fsdp (never taken for ddp).
    """
    if config.parallelism not in ("ddp", "fsdp"):
        raise ConfigError("parallelism", f"must be ddp or fsdp, got {config.parallelism!r}")
    return config.parallelism == "fsdp" and info.enabled


def is_dtensor(value: Any) -> bool:
    """Whether ``value`` is a ``DTensor`` (none exists before ``torch.distributed.tensor``
    is imported, so it is not imported to ask)."""
    module = sys.modules.get("torch.distributed.tensor")
    return module is not None and isinstance(value, module.DTensor)


def is_fsdp_module(module: nn.Module) -> bool:
    """Whether ``fully_shard`` was applied to ``module`` (without importing FSDP to ask)."""
    fsdp = sys.modules.get("torch.distributed.fsdp")
    return fsdp is not None and isinstance(module, fsdp.FSDPModule)


def mixed_precision_policy(precision: str):
    """Low-precision parameters and fp32 reduction for bf16/fp16; fp32 throughout otherwise
    (a ``torch.distributed.fsdp.MixedPrecisionPolicy``)."""
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if precision not in _LOW:
        return MixedPrecisionPolicy()
    return MixedPrecisionPolicy(param_dtype=_LOW[precision], reduce_dtype=torch.float32)


def shard(module: nn.Module, blocks: list[nn.Module], config: TrainConfig) -> nn.Module:
    """``fully_shard`` each of ``blocks`` (submodules of ``module``), then ``module``.

    Returns ``module`` itself: FSDP2 changes it in place (its class becomes an
    ``FSDPModule``, its parameters ``DTensor`` shards).
    """
    from torch.distributed.fsdp import fully_shard

    policy = mixed_precision_policy(config.precision)
    for block in blocks:
        fully_shard(block, mp_policy=policy)
    fully_shard(module, mp_policy=policy)
    return module


def wrap_model(model: nn.Module, task: Task, config: TrainConfig, info: DistInfo,
               ) -> tuple[nn.Module, nn.Module | None]:
    """The module the forward pass calls, and an unsharded copy for the EMA shadow.

    Under FSDP, ``model`` is sharded in place (and returned); the copy, taken
    before sharding when ``config.ema_decay`` is set, is for
    :func:`shard_ema_shadow`. Under DDP: ``DistributedDataParallel(model)``
    (or ``model`` in one process) and no copy.
    """
    if not is_sharded(config, info):
        return wrap_ddp(model, info), None
    shadow = copy.deepcopy(model) if config.ema_decay is not None else None
    return shard(model, task.blocks(model), config), shadow


def shard_ema_shadow(shadow: nn.Module, task: Task, config: TrainConfig) -> nn.Module:
    """Shard an EMA shadow copy like the model, so its parameters pair shard for shard."""
    return shard(shadow.eval().requires_grad_(False), task.blocks(shadow), config)


def grad_sync_factory(train_model: nn.Module, model: nn.Module, config: TrainConfig,
                      info: DistInfo) -> Callable[[bool], ContextManager]:
    """``sync(last)``: the context of one micro-batch's forward and backward.

    Gradients are reduced across ranks only when ``last`` (the last micro-batch
    of an accumulation group): DDP's ``no_sync()`` otherwise; FSDP2's
    ``set_requires_gradient_sync(last)``; nothing in one process.
    """
    if not info.enabled:
        return lambda last: contextlib.nullcontext()
    if is_sharded(config, info):
        return lambda last: _fsdp_sync(model, last)
    return lambda last: contextlib.nullcontext() if last else train_model.no_sync()


@contextlib.contextmanager
def _fsdp_sync(model: nn.Module, sync: bool) -> Iterator[None]:
    model.set_requires_gradient_sync(sync)
    yield


def build_loss_scaler(config: TrainConfig, info: DistInfo) -> torch.amp.GradScaler:
    """``ShardedGradScaler`` for fp16 under FSDP (ranks agree on overflow), else
    ``trainers.precision.build_scaler``'s ``GradScaler``."""
    if not (is_sharded(config, info) and config.precision == "fp16"):
        return build_scaler(config, info.device)
    from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler

    return ShardedGradScaler(info.device.type, init_scale=config.init_loss_scale)


def clip_grad_norm(model: nn.Module, max_norm: float | None) -> torch.Tensor:
    """Clip gradients to ``max_norm`` (if set); return the global L2 norm before clipping.

    Plain gradients: exactly ``torch.nn.utils.clip_grad_norm_``. ``DTensor``
    gradients (FSDP shards): the partial norms are combined across ranks first
    (``full_tensor``), as torchtitan does, so every rank clips by the same
    global norm. Returns a 0-dim fp32 tensor on the gradients' device.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads or not is_dtensor(grads[0]):
        if max_norm is None:
            return torch.nn.utils.get_total_norm(grads)
        return torch.nn.utils.clip_grad_norm_(model.parameters(), max_norm)
    norm = torch.nn.utils.get_total_norm(grads)
    norm = norm.full_tensor() if is_dtensor(norm) else norm
    if max_norm is not None:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, norm)
    return norm


def full_parameters(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every parameter of ``model`` as a full (unsharded) tensor, by name; collective
    under FSDP (every rank must call it)."""
    return {name: p.full_tensor() if is_dtensor(p) else p.detach()
            for name, p in model.named_parameters()}
