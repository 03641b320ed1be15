"""The task trains for a few updates, and keeps the contract the loop relies on."""

from __future__ import annotations

import math

import trainers


def test_trains_a_few_updates_and_reports_every_metric():
    task, config = trainers.create("tabular-mlp", {"max_updates": 6, "max_epochs": None,
                                                   "eval_interval": 3, "dataset": "wine"})
    reporter = trainers.ListReporter()
    result = trainers.fit(task, config, reporter)
    assert result.n_updates == 6
    assert [r["step"] for r in reporter.reports] == [3, 6]
    for name in ("val_loss", "val_accuracy", "val_macro_f1"):
        assert math.isfinite(reporter.reports[-1][name])
