"""Mixed precision decided once, before the loop: an autocast context and a loss scaler.

* ``fp32``: autocast disabled, scaler disabled (both no-ops).
* ``bf16``: ``torch.autocast(dtype=torch.bfloat16)``; no scaler (bf16 has fp32's range).
* ``fp16``: ``torch.autocast(dtype=torch.float16)`` and ``torch.amp.GradScaler``;
  the loop unscales gradients before clipping, and an update whose gradients
  overflowed is skipped by the scaler (Micikevicius et al., "Mixed Precision
  Training", 2018).

All three work on CPU and CUDA.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from contextlib import AbstractContextManager as ContextManager

import torch

from trainers.config import TrainConfig

_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}

# An fp16 run whose updates keep overflowing has broken numerics rather than a
# too-large loss scale: after this many skipped updates in a row the loop raises.
MAX_SKIPPED_IN_A_ROW = 25


def autocast_factory(config: TrainConfig, device: torch.device) -> Callable[[], ContextManager]:
    """A zero-argument factory of the forward pass's autocast context."""
    if config.precision == "fp32":
        return contextlib.nullcontext
    dtype = _DTYPES[config.precision]
    return lambda: torch.autocast(device_type=device.type, dtype=dtype)


def build_scaler(config: TrainConfig, device: torch.device) -> torch.amp.GradScaler:
    """A ``GradScaler``, enabled only for fp16 (disabled it passes everything through)."""
    return torch.amp.GradScaler(
        device.type, init_scale=config.init_loss_scale, enabled=config.precision == "fp16"
    )
