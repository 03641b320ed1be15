"""The rules that train: determinism, resume and accumulation, with ``trainers.fit`` itself."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import torch
from torch import nn

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
from trainers.reporting import ListReporter
from trainers.tasks.base import Task


def _train_config(task_cls: type[Task], root: Path | None) -> TrainConfig:
    return _config(task_cls, max_updates=4, eval_interval=1, grad_accum_steps=2,
                   checkpoint_dir=str(root) if root else None, checkpoint_interval=2,
                   keep_last_checkpoints=10, checkpoint_fsync=False)


def _losses(result: TrainResult) -> list[float]:
    return [m["train_loss"] for m in result.history]


def _check_determinism(task_cls: type[Task], tmp: Path, runs: dict[str, TrainResult]
                       ) -> RuleResult:
    first = fit(task_cls(), _train_config(task_cls, tmp / "first"), ListReporter())
    second = fit(task_cls(), _train_config(task_cls, None), ListReporter())
    runs["first"] = first
    a, b = _losses(first), _losses(second)
    if a != b:
        step = next(i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y) + 1
        return _fail("determinism", f"two runs with seed 0 differ at update {step} "
                     f"(train_loss {a[step - 1]!r} vs {b[step - 1]!r}). Fix: draw data "
                     "from the seed given to datasets(seed) (torch.Generator().manual_seed"
                     "(seed)), and randomness in the model from the global torch RNG, "
                     "which the loop seeds")
    return _pass("determinism", f"{len(a)} updates")


def _check_resume(task_cls: type[Task], tmp: Path, runs: dict[str, TrainResult]) -> RuleResult:
    first = runs["first"]
    resumed = fit(task_cls(), _train_config(task_cls, tmp / "resumed"), ListReporter(),
                  resume_from=tmp / "first" / "checkpoint-00000002")
    want, got = first.model.state_dict(), resumed.model.state_dict()
    differ = sorted(k for k in want if k not in got or not torch.equal(want[k], got[k]))
    if differ or _losses(first) != _losses(resumed):
        what = f"tensors {differ[:5]}" if differ else "train_loss"
        return _fail("resume", f"resumed from the checkpoint of update 2, update 4 differs "
                     f"from the uninterrupted run in {what}. Fix: keep every state the "
                     "forward pass changes in parameters or buffers (register_buffer), "
                     "not in plain attributes, and read no clock or unseeded RNG")
    return _pass("resume", "2 + 2 updates")


def _eval_mode_model(model: nn.Module) -> nn.Module:
    """``model`` pinned to eval mode: the loop's ``train()`` leaves dropout and BatchNorm off."""
    model.train = types.MethodType(lambda self, mode=True: nn.Module.train(self, False), model)
    return model.eval()


class _EvalModeTask:
    """A task whose models stay in eval mode; everything else is the wrapped task's."""

    def __init__(self, task: Task) -> None:
        self._task = task

    def __getattr__(self, name: str) -> Any:
        return getattr(self._task, name)

    def build_model(self, config: TrainConfig) -> nn.Module:
        return _eval_mode_model(self._task.build_model(config))


def _one_sgd_update(task_cls: type[Task], micro_batch_size: int, grad_accum_steps: int
                    ) -> dict[str, torch.Tensor]:
    config = _config(task_cls, micro_batch_size=micro_batch_size,
                     grad_accum_steps=grad_accum_steps, max_updates=1, optimizer="sgd",
                     momentum=0.0, lr=1.0, weight_decay=0.0, schedule="constant",
                     warmup_steps=0, max_grad_norm=None, eval_interval=None)
    task: Any = _EvalModeTask(task_cls())
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
