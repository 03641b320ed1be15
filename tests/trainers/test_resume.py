"""A resume from any checkpoint ends exactly where the uninterrupted run ends (issue 11.6).

Each run below is trained once without interruption, keeping every checkpoint;
then a fresh run is resumed from each of them in turn. The resumed run must
honour every stop condition already met at its checkpoint (early stopping,
``max_updates``, ``max_epochs``) and return the uninterrupted run's result: the
same number of updates, stop reason, best value, metrics and history, and
bit-identical weights (fp32, CPU).
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import ListReporter, TrainConfig, TrainResult, fit
from trainers.checkpoint import list_checkpoints

OPTIONS = RegressionOptions(n_samples=64, dropout=0.3, batch_norm=True)  # 4 updates per epoch
# what depends on the clock or the process, not on the training
VOLATILE = {"time_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes"}
# early stopping that triggers on a real curve: nothing beats the first evaluation by 1e9
NEVER_BETTER = dict(early_stopping_patience=3, early_stopping_min_delta=1e9)

RUNS = {  # name: (config changes, expected stop reason, expected updates)
    "early-stopping": (dict(eval_interval=2, max_updates=30, **NEVER_BETTER),
                       "early_stopping", 8),
    "early-stopping-checkpoints-aligned": (
        dict(eval_interval=2, checkpoint_interval=4, max_updates=30, **NEVER_BETTER),
        "early_stopping", 8),
    "early-stopping-checkpoints-not-aligned": (
        dict(eval_interval=2, checkpoint_interval=3, max_updates=30, **NEVER_BETTER),
        "early_stopping", 8),
    "early-stopping-at-epoch-ends": (
        dict(eval_interval=None, max_epochs=10, max_updates=None, early_stopping_patience=2,
             early_stopping_min_delta=1e9), "early_stopping", 12),
    "max-updates": (dict(eval_interval=3, max_updates=9), "max_updates", 9),
    "max-updates-not-aligned": (dict(eval_interval=3, checkpoint_interval=4, max_updates=10),
                                "max_updates", 10),
    "max-epochs": (dict(eval_interval=None, max_epochs=3, max_updates=None), "max_epochs", 12),
    "max-epochs-not-aligned": (
        dict(eval_interval=3, checkpoint_interval=5, max_epochs=3, max_updates=None),
        "max_epochs", 12),
}


def _config(root: Path, **changes) -> TrainConfig:
    base = dict(micro_batch_size=8, grad_accum_steps=2, max_epochs=None, lr=0.05,
                weight_decay=0.01, warmup_steps=2, ema_decay=0.9, checkpoint_dir=str(root),
                keep_last_checkpoints=100, checkpoint_fsync=False, seed=7)
    return TrainConfig(**{**base, **changes})


def _stable(metrics: dict[str, float]) -> dict[str, object]:
    """The metrics that depend only on the training; NaN made comparable."""
    return {k: "nan" if isinstance(v, float) and math.isnan(v) else v
            for k, v in metrics.items() if k not in VOLATILE}


def assert_same_result(resumed: TrainResult, full: TrainResult) -> None:
    assert (resumed.n_updates, resumed.stop_reason) == (full.n_updates, full.stop_reason)
    assert (resumed.best_value, resumed.best_step) == (full.best_value, full.best_step)
    assert _stable(resumed.metrics) == _stable(full.metrics)
    for mine, theirs in [(resumed.model, full.model), (resumed.ema_model, full.ema_model)]:
        a, b = mine.state_dict(), theirs.state_dict()
        assert list(a) == list(b)
        for key in a:
            assert torch.equal(a[key], b[key]), key
    # the evaluations before the checkpoint too (they travel in it)
    assert [_stable(m) for m in resumed.history] == [_stable(m) for m in full.history]


@pytest.mark.parametrize("name", list(RUNS))
def test_resume_from_every_checkpoint_ends_as_the_uninterrupted_run(name, tmp_path):
    changes, reason, n_updates = RUNS[name]
    full_reporter = ListReporter()
    full = fit(RegressionTask(OPTIONS), _config(tmp_path / "full", **changes), full_reporter)
    assert (full.stop_reason, full.n_updates) == (reason, n_updates)
    checkpoints = list_checkpoints(tmp_path / "full")
    assert checkpoints[-1][0] <= n_updates and len(checkpoints) >= 3
    for step, path in checkpoints:
        reporter = ListReporter()
        resumed = fit(RegressionTask(OPTIONS), _config(tmp_path / f"from-{step}", **changes),
                      reporter, resume_from=path)
        assert_same_result(resumed, full)
        # the evaluations after the checkpoint; at the end, the last one again (a new
        # reporter may never have seen it), never one of a further update
        expected = [r for r in full_reporter.reports if r["step"] > step] \
            or full_reporter.reports[-1:]
        assert [_stable(r) for r in reporter.reports] == [_stable(r) for r in expected], step


def test_resume_at_the_stopping_evaluation_trains_no_further_update(tmp_path):
    # the case: the checkpoint of the evaluation that exhausted the patience
    changes, _, _ = RUNS["early-stopping"]
    full_reporter = ListReporter()
    full = fit(RegressionTask(OPTIONS), _config(tmp_path / "full", **changes), full_reporter)
    task, reporter = RegressionTask(OPTIONS), ListReporter()
    resumed = fit(task, _config(tmp_path / "again", **changes), reporter,
                  resume_from=tmp_path / "full" / "checkpoint-00000008")
    assert task.seen == []  # not one sample trained on
    assert resumed.n_updates == 8 and resumed.stop_reason == "early_stopping"
    assert reporter.reports == full_reporter.reports[-1:]  # bit for bit, time_s included
    assert resumed.metrics == full.metrics


class EvalCrashesOnce(RegressionTask):
    """Raises in its ``n``-th evaluation, as a process killed there would stop."""

    def __init__(self, options, n: int) -> None:
        super().__init__(options)
        self.left = n

    def eval_metrics(self, sums):
        self.left -= 1
        if self.left == 0:
            raise RuntimeError("killed")
        return super().eval_metrics(sums)


def test_killed_between_the_last_update_checkpoint_and_the_final_evaluation(tmp_path):
    # checkpoints every 4 updates, evaluations every 3: the 8th update is checkpointed,
    # then the final evaluation (the 3rd) dies; the resume must evaluate once, at 8
    changes = dict(eval_interval=3, checkpoint_interval=4, max_updates=8)
    full = fit(RegressionTask(OPTIONS), _config(tmp_path / "full", **changes))
    with pytest.raises(RuntimeError, match="killed"):
        fit(EvalCrashesOnce(OPTIONS, 3), _config(tmp_path / "cut", **changes))
    assert list_checkpoints(tmp_path / "cut")[-1][0] == 8
    reporter = ListReporter()
    resumed = fit(RegressionTask(OPTIONS), _config(tmp_path / "cut", **changes), reporter,
                  resume_from=tmp_path / "cut")
    assert [r["step"] for r in reporter.reports] == [8]
    assert_same_result(resumed, full)


def test_resume_with_a_smaller_patience_stops_at_once(tmp_path):
    # the config's patience decides, against the restored count of evaluations
    changes = dict(eval_interval=2, max_updates=30, early_stopping_patience=5,
                   early_stopping_min_delta=1e9)
    fit(RegressionTask(OPTIONS), _config(tmp_path / "full", **changes))
    task = RegressionTask(OPTIONS)
    resumed = fit(task, _config(tmp_path / "again", **{**changes, "early_stopping_patience": 2}),
                  resume_from=tmp_path / "full" / "checkpoint-00000006")  # 2 evals worse
    assert (resumed.n_updates, resumed.stop_reason, task.seen) == (6, "early_stopping", [])


def test_another_watched_metric_starts_the_early_stopping_count_afresh(tmp_path):
    class TwoMetrics(RegressionTask):
        metrics = {"val_loss": "minimize", "val_neg": "maximize"}

        def eval_metrics(self, sums):
            loss = super().eval_metrics(sums)["val_loss"]
            return {"val_loss": loss, "val_neg": -loss}

    changes = dict(eval_interval=2, max_updates=30, early_stopping_patience=2,
                   early_stopping_min_delta=1e9)
    first = fit(TwoMetrics(OPTIONS), _config(tmp_path / "full", **changes))
    assert (first.n_updates, first.best_step) == (6, 2)
    resumed = fit(TwoMetrics(OPTIONS),
                  _config(tmp_path / "again", early_stopping_metric="val_neg", **changes),
                  resume_from=tmp_path / "full" / "checkpoint-00000006")
    # val_neg's own count: its best at 8 (the first evaluation it sees), 2 worse after it
    assert (resumed.n_updates, resumed.best_metric, resumed.best_step) == (12, "val_neg", 8)


STOPS = {  # more ways to end, where two limits meet: (config changes, expected stop reason)
    **{name: (changes, reason) for name, (changes, reason, _) in RUNS.items()},
    "max-updates-at-an-epoch-end": (dict(eval_interval=None, max_updates=8), "max_updates"),
    "max-updates-and-epochs-together": (dict(eval_interval=4, max_epochs=2, max_updates=8),
                                        "max_updates"),
    "max-epochs-before-max-updates": (dict(eval_interval=None, max_epochs=2, max_updates=9),
                                      "max_epochs"),
    "max-epochs-mid-interval": (dict(eval_interval=5, max_epochs=2, max_updates=None),
                                "max_epochs"),
    "early-stopping-at-max-updates": (dict(eval_interval=2, max_updates=8, **NEVER_BETTER),
                                      "early_stopping"),
}


@pytest.mark.parametrize("name", list(STOPS))
def test_the_last_report_tells_why_the_run_stops(name, tmp_path):
    # the trainer tells its own stop (issue 13.6): hpo's record reads it off the last result
    changes, reason = STOPS[name]
    reporter = ListReporter()
    result = fit(RegressionTask(OPTIONS), _config(tmp_path, **changes), reporter)
    assert result.stop_reason == reason
    assert reporter.stops == [(len(reporter.reports) - 1, reason)]  # told before the last
    assert "stop_reason" not in result.metrics  # the history keeps the metrics only
