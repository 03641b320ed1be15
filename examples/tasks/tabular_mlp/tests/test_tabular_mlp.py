"""A few updates of real training on each dataset, and the task contract (`hpo task check`)."""

from __future__ import annotations

import math

import pytest
from tabular_mlp.task import TabularMLPTask, TabularOptions

from trainers import ListReporter, TrainConfig, fit
from trainers.contract import check_task


@pytest.mark.parametrize("dataset", ["breast_cancer", "wine"])
def test_a_few_updates_train_and_report_every_metric(dataset):
    config = TrainConfig(**{**TabularMLPTask.default_config, "max_updates": 6,
                            "max_epochs": None, "eval_interval": 3, "device": "cpu"})
    reporter = ListReporter()
    result = fit(TabularMLPTask(TabularOptions(dataset=dataset)), config, reporter)
    assert result.n_updates == 6
    assert [r["step"] for r in reporter.reports] == [3, 6]
    for name in TabularMLPTask.metrics:
        assert math.isfinite(reporter.reports[-1][name])


def test_features_are_standardized_with_the_training_split_only():
    train, val = TabularMLPTask().datasets(seed=0)
    x_train, x_val = train.tensors[0], val.tensors[0]
    assert x_train.mean(0).abs().max() < 1e-5
    assert (x_train.std(0, unbiased=False) - 1).abs().max() < 1e-4
    assert x_val.mean(0).abs().max() > 1e-3  # the validation split is not its own reference


def test_the_task_keeps_the_contract():
    failed = [r.line() for r in check_task(TabularMLPTask) if not r.ok]
    assert failed == []
