"""Gradient accumulation is exact: samples, partial groups and token losses."""

from __future__ import annotations

import torch

from tests.trainers.toy_tasks import (
    LinearTask,
    RegressionOptions,
    RegressionTask,
    TokenOptions,
    TokenTask,
    flat_params,
)
from trainers import ListReporter, TrainConfig, fit
from trainers.data import epoch_order


def _regression_run(micro_batch_size: int, grad_accum_steps: int, **extra):
    task = RegressionTask(RegressionOptions(n_samples=96))
    config = TrainConfig(micro_batch_size=micro_batch_size, grad_accum_steps=grad_accum_steps,
                         max_updates=10, max_epochs=None, lr=1e-2, seed=3, schedule="cosine",
                         warmup_steps=2, **extra)
    result = fit(task, config)
    return task, result


def test_micro_batch_8x4_equals_32x1_after_10_updates():
    task_a, a = _regression_run(8, 4)
    task_b, b = _regression_run(32, 1)
    assert a.n_updates == b.n_updates == 10
    diff = (flat_params(a.model) - flat_params(b.model)).abs().max().item()
    assert diff <= 1e-6
    # and the runs did move the parameters (the comparison is not trivially true)
    task_c, c = _regression_run(32, 1, max_grad_norm=None)
    assert (flat_params(c.model) - flat_params(RegressionTask().build_model(
        TrainConfig())).float()).abs().max() > 1e-3


def test_shuffle_order_does_not_depend_on_micro_batch_size():
    task_a, _ = _regression_run(8, 4)
    task_b, _ = _regression_run(32, 1)
    task_c, _ = _regression_run(5, 3)  # groups of 15: 10 updates see 150 samples
    assert task_a.seen == task_b.seen
    assert task_c.seen[:len(task_a.seen)] == task_a.seen[:len(task_c.seen)]
    # the order is the seeded permutation of each epoch, concatenated
    dataset = task_a.datasets(0)[0]
    expected = [i for epoch in range(4) for i in epoch_order(dataset, seed=3, epoch=epoch)]
    assert len(task_b.seen) == 320
    assert task_b.seen == expected[:320]
    assert expected[:96] != expected[96:192]  # every epoch is shuffled anew


def test_partial_last_group_is_averaged_over_its_real_size():
    # 10 samples, micro-batch 1, 4 accumulation steps: groups of 4, 4 and 2 samples.
    # Every sample's gradient is c = (3, 4), so each correctly averaged update moves
    # p by exactly -lr * c; a last group weighed by 1/4 instead of 1/2 would move it by half.
    reporter = ListReporter()
    task = LinearTask()
    config = TrainConfig(micro_batch_size=1, grad_accum_steps=4, max_epochs=1, optimizer="sgd",
                         momentum=0.0, lr=0.5, schedule="constant", max_grad_norm=None,
                         eval_interval=1)
    result = fit(task, config, reporter)
    assert result.n_updates == 3
    assert [r["step"] for r in reporter.reports] == [1, 2, 3]
    expected = -0.5 * 3 * torch.tensor([3.0, 4.0])
    assert torch.allclose(result.model.p.detach(), expected, atol=1e-6, rtol=0)


def test_token_loss_accumulation_equals_full_batch_mean_over_real_tokens():
    options = TokenOptions(n_samples=8)
    task = TokenTask(options)
    config = TrainConfig(micro_batch_size=2, grad_accum_steps=4, max_updates=1, max_epochs=None,
                         optimizer="sgd", momentum=0.0, lr=1.0, schedule="constant",
                         max_grad_norm=None, seed=5)
    reference = TokenTask(options)
    torch.manual_seed(5)
    model = reference.build_model(config)
    before = flat_params(model)
    result = fit(task, config)
    step = before - flat_params(result.model)  # = lr * accumulated gradient

    train_set = reference.datasets(5)[0]
    full = reference.collate([train_set[i] for i in range(len(train_set))])
    model.zero_grad()
    (reference.loss_sum(model, full) / reference.n_items(full)).backward()
    full_grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert (step - full_grad).abs().max().item() <= 1e-6

    # the naive mean of per-micro-batch means is measurably different on this data
    model.zero_grad()
    order = epoch_order(train_set, seed=5, epoch=0)
    for k in range(4):
        mb = reference.collate([train_set[i] for i in order[2 * k:2 * k + 2]])
        (reference.loss_sum(model, mb) / reference.n_items(mb) / 4).backward()
    naive_grad = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert (naive_grad - full_grad).abs().max().item() > 1e-4
