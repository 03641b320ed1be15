"""Learning-rate schedules with linear warmup, stepped once per optimizer update.

The learning rate of the update that follows ``u`` completed updates is
``lr * lr_factor(u)``; a ``LambdaLR`` built by :func:`build_scheduler` is stepped
after every applied update, so after ``U`` updates ``scheduler.last_epoch == U``
and the optimizer's LR is ``lr * lr_factor(U)``.

With ``W`` warmup updates, ``T`` total updates and ``m = min_lr_ratio``:

* warmup, ``u < W``: ``(u + 1) / (W + 1)`` (never 0, reaches 1 at ``u = W``;
  the form nanoGPT uses);
* afterwards, with progress ``p = clamp((u - W) / (T - W), 0, 1)``:

  - ``constant``: ``1``;
  - ``linear``: ``1 - (1 - m) p``;
  - ``cosine``: ``m + (1 - m) (1 + cos(pi p)) / 2`` (Loshchilov & Hutter, SGDR, 2017);
  - ``wsd`` (warmup-stable-decay; Hu et al., MiniCPM, 2024): ``1`` until the
    last ``D = ceil(wsd_decay_fraction * (T - W))`` updates, then linear
    to ``m``: ``1 - (1 - m) clamp((u - (T - D)) / D, 0, 1)``.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable

import torch

from trainers.config import TrainConfig


def lr_factor(
    u: int,
    *,
    schedule: str,
    total_steps: int,
    warmup_steps: int = 0,
    min_lr_ratio: float = 0.0,
    wsd_decay_fraction: float = 0.2,
) -> float:
    """The LR multiplier for the update after ``u`` completed updates (see module doc).

    Args:
        u: completed optimizer updates, >= 0.
        schedule: ``constant``, ``linear``, ``cosine`` or ``wsd``.
        total_steps: total optimizer updates of the run, >= 1.
        warmup_steps: warmup length in updates, >= 0.
        min_lr_ratio: final multiplier, in [0, 1].
        wsd_decay_fraction: ``wsd`` only, in (0, 1].

    Raises:
        ValueError: unknown schedule.
    """
    if u < warmup_steps:
        return (u + 1) / (warmup_steps + 1)
    span = max(1, total_steps - warmup_steps)
    p = min(1.0, max(0.0, (u - warmup_steps) / span))
    m = min_lr_ratio
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        return 1.0 - (1.0 - m) * p
    if schedule == "cosine":
        return m + (1.0 - m) * 0.5 * (1.0 + math.cos(math.pi * p))
    if schedule == "wsd":
        decay = max(1, math.ceil(wsd_decay_fraction * span))
        q = min(1.0, max(0.0, (u - (total_steps - decay)) / decay))
        return 1.0 - (1.0 - m) * q
    raise ValueError(f"unknown schedule {schedule!r}")


def build_scheduler(
    optimizer: torch.optim.Optimizer, config: TrainConfig, total_steps: int
) -> torch.optim.lr_scheduler.LambdaLR:
    """A ``LambdaLR`` following :func:`lr_factor` for ``config``'s schedule.

    Args:
        optimizer: its param groups' ``lr`` is the peak LR.
        config: provides schedule, warmup_steps, min_lr_ratio, wsd_decay_fraction.
        total_steps: total optimizer updates of the run (>= 1).
    """
    return torch.optim.lr_scheduler.LambdaLR(optimizer, schedule_factor(config, total_steps))


def schedule_factor(config: TrainConfig, total_steps: int) -> Callable[[int], float]:
    """:func:`lr_factor` of ``config``'s schedule over ``total_steps`` updates (>= 1), as a
    function of the completed updates (``LambdaLR``'s ``lr_lambda``)."""
    return functools.partial(
        lr_factor,
        schedule=config.schedule,
        total_steps=total_steps,
        warmup_steps=config.warmup_steps,
        min_lr_ratio=config.min_lr_ratio,
        wsd_decay_fraction=config.wsd_decay_fraction,
    )
