"""DDP helpers: who am I, which device, reduce statistics, broadcast decisions.

The loop is distributed exactly when ``torch.distributed`` is initialized
(``torchrun`` or Ray Train do that); otherwise every helper is the 1-process
identity, so the loop has no DDP branches.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import sys
from collections.abc import Mapping
from typing import NoReturn

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel


@dataclasses.dataclass(frozen=True)
class DistInfo:
    """Rank, world size and this process's device."""

    rank: int
    world_size: int
    local_rank: int
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1


def dist_info(device_setting: str) -> DistInfo:
    """Describe this process; ``device_setting`` is ``TrainConfig.device``.

    Under DDP with CUDA, ``auto``/``cuda`` mean ``cuda:LOCAL_RANK``.

    Raises:
        ValueError: CUDA asked for but not available.
    """
    initialized = dist.is_available() and dist.is_initialized()
    rank = dist.get_rank() if initialized else 0
    world = dist.get_world_size() if initialized else 1
    local_rank = int(os.environ.get("LOCAL_RANK", "0")) if initialized else 0
    if device_setting == "auto":
        device_setting = "cuda" if torch.cuda.is_available() else "cpu"
    if device_setting.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device_setting!r} asked for, but CUDA is not available")
    if device_setting == "cuda":
        device_setting = f"cuda:{local_rank}"
    return DistInfo(rank, world, local_rank, torch.device(device_setting))


def init_distributed_from_env() -> int:
    """Join the process group that ``torchrun`` describes (``WORLD_SIZE`` > 1); return the rank.

    Uses NCCL when CUDA is available, else gloo. Without ``WORLD_SIZE`` (a
    plain single process) nothing is initialized and the rank is 0.
    """
    global _MADE
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return 0
    if not dist.is_initialized():
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")
        _MADE = dist.group.WORLD
    return dist.get_rank()


_MADE = None  # the process group init_distributed_from_env made (close_distributed ends it)


def close_distributed() -> None:
    """Leave the process group that :func:`init_distributed_from_env` made, if it made one
    (a group the caller made before stays): what PyTorch asks of every process at the end
    of a successful run (``destroy_process_group``; gloo's and NCCL's threads are stopped
    while the interpreter is whole, not at its finalization). Only on success: a rank that
    failed while its peers are inside a collective would wait for them forever
    (pytorch/torchtitan#1342)."""
    global _MADE
    if _MADE is not None and dist.is_initialized() and dist.group.WORLD is _MADE:
        dist.destroy_process_group()
    _MADE = None


def exit_rank(status: int) -> NoReturn:
    """End this process with ``status``; a rank of a launch (``WORLD_SIZE`` > 1, as
    ``torchrun`` sets) ends without the interpreter's finalization.

    After ``destroy_process_group`` PyTorch's native threads (gloo's, the autograd
    engine's) can still hold Python objects; when one lets go of its object while the
    interpreter finalizes, its bid for the GIL ends the thread by force and the process
    aborts (SIGABRT, "terminate called without an active exception") after its work was
    done and saved, so ``torchrun`` reports the run failed (pytorch/pytorch#117762 and
    #190489, open; seen in about one CI run in ten, for DDP and for FSDP ranks). Such a
    rank flushes its output and logs and leaves with ``os._exit``; a single process (or a
    ``WORLD_SIZE`` that is no integer) exits as usual (``SystemExit``).

    A rank therefore runs no ``atexit`` handler and waits for no non-daemon thread: a
    task that writes from a thread of its own (a TensorBoard writer) ends it before
    ``fit`` returns.
    """
    try:
        launched = int(os.environ.get("WORLD_SIZE", "1")) > 1
    except ValueError:
        launched = False
    if not launched:
        raise SystemExit(status)
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        if stream is not None:  # None: the descriptor was closed at start (>&-)
            with contextlib.suppress(OSError, ValueError):  # closed, or a broken pipe
                stream.flush()
    os._exit(status)


def wrap_ddp(model: nn.Module, info: DistInfo) -> nn.Module:
    """``DistributedDataParallel(model)`` under DDP, else ``model`` unchanged."""
    if not info.enabled:
        return model
    device_ids = [info.device.index] if info.device.type == "cuda" else None
    return DistributedDataParallel(model, device_ids=device_ids)


def all_reduce_sums(values: Mapping[str, float | torch.Tensor], info: DistInfo,
                    ) -> dict[str, float]:
    """Sum every value across ranks (one collective); identity in one process."""
    if not info.enabled:
        return {k: float(v) for k, v in values.items()}
    keys = sorted(values)
    t = torch.tensor([float(values[k]) for k in keys], dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.SUM)
    return dict(zip(keys, t.tolist(), strict=True))


def all_reduce_max(value: float, info: DistInfo) -> float:
    """The maximum of ``value`` over ranks."""
    if not info.enabled:
        return value
    t = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return t.item()


def broadcast_flag(flag: bool, info: DistInfo) -> bool:
    """Rank 0's value of ``flag``, on every rank."""
    if not info.enabled:
        return flag
    t = torch.tensor([1.0 if flag else 0.0], device=info.device)
    dist.broadcast(t, src=0)
    return bool(t.item())


def gather_objects(obj: object, info: DistInfo) -> list[object]:
    """``obj`` of every rank, in rank order (on every rank)."""
    if not info.enabled:
        return [obj]
    out: list[object] = [None] * info.world_size
    dist.all_gather_object(out, obj)
    return out


@torch.no_grad()
def broadcast_buffers(model: nn.Module, info: DistInfo) -> None:
    """Give every rank rank 0's buffers of ``model`` (BatchNorm's running statistics).

    Each rank updates its buffers in its own forwards from its own samples: DDP
    broadcasts rank 0's only at the start of a forward that syncs gradients, FSDP2
    never. Called before anything reads them (the EMA update, an evaluation, a
    checkpoint), this makes all ranks read rank 0's, as one model would. Training
    is unchanged: a training forward's output does not depend on the buffers, and
    rank 0's are never overwritten. Identity in one process; every rank must call it.

    Args:
        model: the raw module (not DDP-wrapped); under FSDP2 the sharded module, whose
            buffers are plain, replicated tensors.
    """
    buffers = [b for b in model.buffers() if b.numel()]
    if not info.enabled or not buffers:
        return
    for dtype in sorted({b.dtype for b in buffers}, key=str):  # one collective per dtype
        same = [b for b in buffers if b.dtype == dtype]
        flat = torch.cat([b.reshape(-1) for b in same])
        dist.broadcast(flat, src=0)
        for b, value in zip(same, flat.split([b.numel() for b in same]), strict=True):
            b.copy_(value.view_as(b))
