"""The rules that train: determinism, resume and accumulation, with ``trainers.fit`` itself."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.data import Dataset, Subset

from trainers.config import TrainConfig
from trainers.contract._base import (
    ACCUMULATION_TOLERANCE,
    WHY_SUM,
    RuleResult,
    _config,
    _fail,
    _pass,
)
from trainers.loop import TrainResult, fit
from trainers.tasks.base import Task

N_EVAL_ITEMS = 4  # validation items of the runs below


class _Watched:
    """A task whose micro-batch losses are recorded (``losses``) and whose models may be
    pinned to eval mode (the loop's ``train()`` then leaves dropout and BatchNorm off),
    evaluated on ``N_EVAL_ITEMS`` validation items; everything else is the wrapped task's."""

    def __init__(self, task: Task, eval_mode: bool = False) -> None:
        self._task, self._eval_mode = task, eval_mode
        self.losses: list[float] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def build_model(self, config: TrainConfig) -> nn.Module:
        model = self._task.build_model(config)
        if self._eval_mode:
            model.train = types.MethodType(lambda m, mode=True: nn.Module.train(m, False),
                                           model)
            model.eval()
        return model

    def datasets(self, seed: int) -> tuple[Dataset, Dataset]:
        # what these runs compare is training; their one evaluation needs only a few items
        train_set, val_set = self._task.datasets(seed)
        return train_set, Subset(val_set, range(min(len(val_set), N_EVAL_ITEMS)))

    def loss_sum(self, model: nn.Module, batch: Any) -> torch.Tensor:
        loss = self._task.loss_sum(model, batch)
        self.losses.append(float(loss.detach()))
        return loss


N_UPDATES, RESUME_AT, ACCUM = 4, 2, 2  # updates of a run, the checkpoint resumed, micro-batches


def _fit(task_cls: type[Task], root: Path, resume_from: Path | None = None
         ) -> tuple[TrainResult, list[float]]:
    """A run of ``N_UPDATES`` updates checkpointing every ``RESUME_AT``, evaluated at its end
    only; its result and its micro-batch losses."""
    config = _config(task_cls, max_updates=N_UPDATES, eval_interval=None,
                     grad_accum_steps=ACCUM, checkpoint_dir=str(root),
                     checkpoint_interval=RESUME_AT, keep_last_checkpoints=10,
                     checkpoint_fsync=False)
    task: Any = _Watched(task_cls())
    return fit(task, config, resume_from=resume_from), task.losses


def _check_determinism(task_cls: type[Task], tmp: Path, runs: dict[str, Any]) -> RuleResult:
    runs["first"] = first, a = _fit(task_cls, tmp / "first")
    _, b = _fit(task_cls, tmp / "second")
    if a != b:
        i = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y),
                 min(len(a), len(b)))
        found = f"loss {a[i]!r} vs {b[i]!r}" if i < min(len(a), len(b)) else \
            f"{len(a)} vs {len(b)} micro-batches"
        return _fail("determinism", f"two runs with seed 0 differ at micro-batch {i + 1}: "
                     f"{found}. Fix: draw data from the seed "
                     "given to datasets(seed) (torch.Generator().manual_seed(seed)), and "
                     "randomness in the model from the global torch RNG, which the loop "
                     "seeds")
    return _pass("determinism", f"{N_UPDATES} updates")


def _check_resume(task_cls: type[Task], tmp: Path, runs: dict[str, Any]) -> RuleResult:
    first, losses = runs["first"]
    resumed, resumed_losses = _fit(task_cls, tmp / "resumed",
                                   resume_from=tmp / "first" / f"checkpoint-{RESUME_AT:08d}")
    want, got = first.model.state_dict(), resumed.model.state_dict()
    differ = sorted(k for k in want if k not in got or not torch.equal(want[k], got[k]))
    # the resumed run's micro-batches are the last ones of the uninterrupted run
    tail = losses[len(losses) - len(resumed_losses):] if resumed_losses else [None]
    if differ or tail != resumed_losses:
        what = f"tensors {differ[:5]}" if differ else "the losses of its micro-batches"
        return _fail("resume", f"resumed from the checkpoint of update {RESUME_AT}, update "
                     f"{N_UPDATES} differs from the uninterrupted run in {what}. Fix: keep "
                     "every state the forward pass changes in parameters or buffers "
                     "(register_buffer), not in plain attributes, and read no clock or "
                     "unseeded RNG")
    return _pass("resume", f"{RESUME_AT} + {N_UPDATES - RESUME_AT} updates")


def _one_sgd_update(task_cls: type[Task], micro_batch_size: int, grad_accum_steps: int
                    ) -> dict[str, torch.Tensor]:
    config = _config(task_cls, micro_batch_size=micro_batch_size,
                     grad_accum_steps=grad_accum_steps, max_updates=1, optimizer="sgd",
                     momentum=0.0, lr=1.0, weight_decay=0.0, schedule="constant",
                     warmup_steps=0, max_grad_norm=None, eval_interval=None)
    task: Any = _Watched(task_cls(), eval_mode=True)
    result = fit(task, config)
    return {k: v.detach().clone() for k, v in result.model.named_parameters()}


def _check_accumulation(task_cls: type[Task]) -> RuleResult:
    n = len(task_cls().datasets(0)[0])
    m, k = (2, 4) if n >= 8 else (1, n)
    # both runs start from the same seeded init: their parameters after the update differ
    # by the difference of the two gradients (SGD, lr 1)
    accumulated = _one_sgd_update(task_cls, m, k)
    whole = _one_sgd_update(task_cls, m * k, 1)
    worst, where = 0.0, ""
    for name, p in whole.items():
        scale = max(1.0, float(p.abs().max()))
        gap = float((accumulated[name] - p).abs().max()) / scale
        if gap > worst:
            worst, where = gap, name
    if worst > ACCUMULATION_TOLERANCE:
        return _fail("accumulation", f"the gradient of micro-batch {m} x {k} accumulation "
                     f"steps differs from micro-batch {m * k} x 1 by {worst:.3g} (relative) "
                     f"in {where!r}. Fix: n_items must count the items loss_sum sums over. "
                     f"{WHY_SUM}")
    return _pass("accumulation", f"{m} x {k} vs {m * k} x 1, max gap {worst:.1g}")
