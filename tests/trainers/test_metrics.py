"""Metrics reported at every evaluation."""

from __future__ import annotations

import math

import pytest
import torch

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask, TokenTask
from trainers import ListReporter, TrainConfig, fit

COMMON = {"step", "planned_updates", "epoch", "train_loss", "val_loss", "lr", "grad_norm",
          "loss_scale", "skipped_updates", "samples", "samples_per_s", "peak_memory_bytes",
          "time_s"}


def test_every_evaluation_reports_every_metric():
    reporter = ListReporter()
    fit(RegressionTask(), TrainConfig(micro_batch_size=8, max_updates=6, max_epochs=None,
                                      eval_interval=2), reporter)
    assert [r["step"] for r in reporter.reports] == [2, 4, 6]
    for r in reporter.reports:
        assert set(r) == COMMON
        assert all(math.isfinite(v) for v in r.values())
        assert r["samples_per_s"] > 0 and r["peak_memory_bytes"] > 0
    assert [r["samples"] for r in reporter.reports] == [16, 32, 48]
    assert all(r["planned_updates"] == 6 for r in reporter.reports)
    assert reporter.reports[-1]["epoch"] == pytest.approx(48 / 64)


def test_token_tasks_also_report_tokens_per_second():
    reporter = ListReporter()
    fit(TokenTask(), TrainConfig(micro_batch_size=2, max_updates=2, max_epochs=None), reporter)
    assert set(reporter.reports[-1]) == COMMON | {"tokens_per_s"}
    assert reporter.reports[-1]["tokens_per_s"] > reporter.reports[-1]["samples_per_s"]


def test_train_loss_is_the_true_mean_whatever_the_accumulation():
    losses = []
    for mb, accum in [(32, 1), (8, 4), (3, 11)]:
        reporter = ListReporter()
        config = TrainConfig(micro_batch_size=mb, grad_accum_steps=accum, max_updates=1,
                             max_epochs=None, seed=2)
        task = RegressionTask(RegressionOptions(n_samples=32))
        fit(task, config, reporter)
        losses.append(reporter.reports[-1]["train_loss"])
    # the mean squared error over the 32 samples at the initial weights
    task = RegressionTask(RegressionOptions(n_samples=32))
    torch.manual_seed(2)
    model = task.build_model(TrainConfig())
    x, y = task.datasets(0)[0].tensors
    expected = ((model(x).squeeze(-1) - y) ** 2).mean().item()
    for loss in losses:
        assert loss == pytest.approx(expected, abs=1e-6)
