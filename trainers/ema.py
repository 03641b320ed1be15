"""Exponential moving average of a model's parameters *and* buffers.

``torch.optim.swa_utils.AveragedModel`` with ``get_ema_multi_avg_fn`` averages
integer buffers too and truncates the result (BatchNorm's
``num_batches_tracked`` stays 0), so this small class is used instead: floating
tensors (parameters, BatchNorm running mean and variance) follow
``ema = decay * ema + (1 - decay) * current``; non-floating buffers are copied
as they are, which is the only meaningful value for a counter.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
from torch import nn


class EMA:
    """A shadow copy of ``model`` updated after every applied optimizer update.

    Args:
        model: the raw (not DDP-wrapped, not compiled) module to follow.
        decay: in [0, 1); 0.999 is a common value for long runs.
        shadow: the shadow module to use instead of a deep copy of ``model``
            (FSDP: a copy sharded like the model, ``trainers.fsdp``); it must
            hold ``model``'s weights.

    Attributes:
        module: the shadow module, in eval mode, without gradients; evaluate it
            to evaluate the EMA weights.
        n_updates: number of updates folded in so far.
    """

    def __init__(self, model: nn.Module, decay: float, shadow: nn.Module | None = None) -> None:
        if not 0.0 <= decay < 1.0:
            raise ValueError(f"EMA decay must be in [0, 1), got {decay=}")
        self.decay = decay
        if shadow is None:
            shadow = copy.deepcopy(model)
        self.module = shadow.eval().requires_grad_(False)
        self.n_updates = 0

    def _pairs(self, model: nn.Module):
        shadow = list(self.module.parameters()) + list(self.module.buffers())
        current = list(model.parameters()) + list(model.buffers())
        return zip(shadow, current, strict=True)

    @torch.no_grad()
    def update(self, model: nn.Module) -> None:
        """Fold the current weights of ``model`` into the average."""
        weight = 1.0 - self.decay
        for s, c in self._pairs(model):
            if s.is_floating_point():
                s.lerp_(c.detach(), weight)
            else:
                s.copy_(c)
        self.n_updates += 1

    @torch.no_grad()
    def restart_from(self, model: nn.Module) -> None:
        """Make the shadow a copy of ``model``'s current weights, with no update folded in."""
        for s, c in self._pairs(model):
            s.copy_(c.detach())
        self.n_updates = 0

    def state_dict(self) -> dict[str, Any]:
        """The shadow weights, the number of updates folded in, and ``decay`` (for the record)."""
        return {"module": self.module.state_dict(), "decay": self.decay,
                "n_updates": self.n_updates}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Take the shadow weights and the update count of ``state``; keep this EMA's ``decay``.

        The decay is a hyperparameter: a run resumed with another ``ema_decay``
        averages with the new one from there on (the rule of ``trainers.checkpoint``).
        """
        self.module.load_state_dict(state["module"])
        self.n_updates = state["n_updates"]
