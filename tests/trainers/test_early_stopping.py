"""Early stopping on an evaluation metric with patience."""

from __future__ import annotations

import pytest

from tests.trainers.toy_tasks import RegressionTask
from trainers import ConfigError, ListReporter, TrainConfig, fit


class Scripted(RegressionTask):
    """Evaluation metrics from a fixed script: val_loss and an accuracy-like val_score."""

    metrics = {"val_loss": "minimize", "val_score": "maximize"}

    def __init__(self, losses, scores=None) -> None:
        super().__init__()
        self.losses, self.scores = iter(losses), iter(scores or [0.0] * len(losses))

    def eval_metrics(self, sums):
        return {"val_loss": next(self.losses), "val_score": next(self.scores)}


def _config(**kw) -> TrainConfig:
    return TrainConfig(**{"micro_batch_size": 8, "max_updates": 50, "max_epochs": None,
                          "eval_interval": 1, **kw})


def test_stops_after_patience_evaluations_without_improvement():
    reporter = ListReporter()
    task = Scripted([3.0, 2.0, 2.5, 1.9, 1.95, 2.0, 1.91, 5.0, 0.1])
    result = fit(task, _config(early_stopping_patience=3), reporter)
    assert result.stop_reason == "early_stopping"
    assert result.n_updates == 7          # best 1.9 at step 4, then 3 evaluations worse
    assert (result.best_value, result.best_step) == (1.9, 4)
    assert len(reporter.reports) == 7     # no extra evaluation after stopping


def test_min_delta_and_maximized_metric():
    task = Scripted([0.0] * 10, scores=[0.5, 0.6, 0.605, 0.61, 0.7, 0.7, 0.7, 0.7, 0.7, 0.7])
    result = fit(task, _config(early_stopping_patience=2, early_stopping_metric="val_score",
                               early_stopping_min_delta=0.02))
    # 0.605 and 0.61 do not beat 0.6 by more than 0.02: stop after step 4
    assert (result.stop_reason, result.n_updates, result.best_value) == ("early_stopping", 4, 0.6)


def test_nan_metric_never_counts_as_improvement():
    result = fit(Scripted([float("nan"), 1.0, float("nan"), float("nan")]),
                 _config(early_stopping_patience=2))
    assert (result.n_updates, result.best_value, result.best_step) == (4, 1.0, 2)


def test_unknown_metric_is_rejected_before_training():
    with pytest.raises(ConfigError, match="early_stopping_metric"):
        fit(RegressionTask(), _config(early_stopping_metric="val_accuracy"))
