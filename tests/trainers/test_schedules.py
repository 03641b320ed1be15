"""Schedules step once per optimizer update and follow their formulas."""

from __future__ import annotations

import math

import pytest
import torch

from tests.trainers.toy_tasks import LinearTask, RegressionTask
from trainers import ListReporter, TrainConfig, fit
from trainers.checkpoint import latest_checkpoint
from trainers.checkpoint_read import load_checkpoint
from trainers.schedules import lr_factor

W, T, PEAK, MIN = 3, 13, 0.1, 0.1  # warmup, total updates, peak LR, min_lr_ratio


def reference(schedule: str, u: int) -> float:
    """The documented formulas, written out independently of trainers.schedules."""
    if u < W:
        return PEAK * (u + 1) / (W + 1)
    p = min(1.0, (u - W) / (T - W))
    if schedule == "constant":
        return PEAK
    if schedule == "linear":
        return PEAK * (1 - (1 - MIN) * p)
    if schedule == "cosine":
        return PEAK * (MIN + (1 - MIN) * (1 + math.cos(math.pi * p)) / 2)
    decay_len = math.ceil(0.2 * (T - W))  # wsd: last 20% of post-warmup updates
    q = min(1.0, max(0.0, (u - (T - decay_len)) / decay_len))
    return PEAK * (1 - (1 - MIN) * q)


@pytest.mark.parametrize("schedule", ["constant", "linear", "cosine", "wsd"])
def test_scheduler_steps_once_per_update_and_lr_follows_formula(schedule, tmp_path):
    reporter = ListReporter()
    config = TrainConfig(micro_batch_size=2, grad_accum_steps=2, max_updates=T, max_epochs=None,
                         optimizer="sgd", lr=PEAK, schedule=schedule, warmup_steps=W,
                         min_lr_ratio=MIN, eval_interval=1, checkpoint_dir=str(tmp_path),
                         keep_last_checkpoints=1)
    fit(RegressionTask(), config, reporter)
    steps = [r["step"] for r in reporter.reports]
    assert steps == list(range(1, T + 1))
    for r in reporter.reports:  # "lr" is the LR of the next update, after `step` updates
        assert r["lr"] == pytest.approx(reference(schedule, r["step"]), abs=1e-12)
    sched = load_checkpoint(latest_checkpoint(tmp_path))["scheduler"]
    assert sched["last_epoch"] == T


def test_warmup_first_update_uses_the_first_warmup_lr():
    reporter = ListReporter()
    config = TrainConfig(micro_batch_size=10, max_updates=1, max_epochs=None, optimizer="sgd",
                         momentum=0.0, lr=1.0, schedule="constant", warmup_steps=4,
                         max_grad_norm=None)
    result = fit(LinearTask(), config, reporter)
    # p moved by -lr_0 * c with lr_0 = 1/(4+1)
    assert torch.allclose(result.model.p.detach(), -0.2 * torch.tensor([3.0, 4.0]), atol=1e-7)
    assert reporter.reports[-1]["lr"] == pytest.approx(0.4)


def test_lr_factor_spot_values():
    kw = {"total_steps": 110, "warmup_steps": 10, "min_lr_ratio": 0.0}
    assert lr_factor(0, schedule="cosine", **kw) == pytest.approx(1 / 11)
    assert lr_factor(10, schedule="cosine", **kw) == 1.0
    assert lr_factor(60, schedule="cosine", **kw) == pytest.approx(0.5)
    assert lr_factor(110, schedule="cosine", **kw) == pytest.approx(0.0, abs=1e-12)
    assert lr_factor(60, schedule="linear", **kw) == pytest.approx(0.5)
    assert lr_factor(89, schedule="wsd", **kw) == 1.0          # decay = last 20 updates
    assert lr_factor(100, schedule="wsd", **kw) == pytest.approx(0.5)
    assert lr_factor(500, schedule="linear", **kw) == 0.0       # stays at the end value
    with pytest.raises(ValueError, match="unknown schedule"):
        lr_factor(0, schedule="step", total_steps=10)
