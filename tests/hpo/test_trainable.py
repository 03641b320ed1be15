"""The trial trainable resumed where its training had already stopped (issue 11.6), no Ray.

Tune's calls (``tune.get_checkpoint``, ``tune.report``) are replaced by a fake
that keeps each reported checkpoint, as Tune copies it to its storage at once;
the trial runs ``train_trial`` in this process.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import ray
from optuna.trial import TrialState
from ray import tune

from hpo.record import StudyRecord
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.tune.trainable import RESUME_KEY, TrialSetup, train_trial

# early stopping on a real curve: nothing beats the first evaluation by 1e9, so the
# third evaluation (update 6) exhausts a patience of 2
CONFIG = {"max_updates": 20, "max_epochs": None, "eval_interval": 2, "micro_batch_size": 8,
          "early_stopping_patience": 2, "early_stopping_min_delta": 1e9}
PARAMS = {"quality": 1.0}


class FakeTune:
    """Tune's side of one trial: the checkpoint it resumes from, what it reported."""

    def __init__(self, store: Path) -> None:
        self.store = store
        self.resume_from: tune.Checkpoint | None = None
        self.reports: list[tuple[dict, str | None]] = []

    def report(self, metrics, checkpoint=None):
        kept = None
        if checkpoint is not None:
            kept = str(self.store / f"report-{len(list(self.store.iterdir()))}")
            shutil.copytree(checkpoint.path, kept)
        self.reports.append((dict(metrics), kept))


@pytest.fixture
def fake_tune(tmp_path, monkeypatch) -> FakeTune:
    store = tmp_path / "tune-storage"
    store.mkdir()
    fake = FakeTune(store)
    monkeypatch.setattr(tune, "report", fake.report)
    monkeypatch.setattr(tune, "get_checkpoint", lambda: fake.resume_from)
    context = type("Context", (), {"get_node_id": lambda self: "node-1"})()
    monkeypatch.setattr(ray, "get_runtime_context", lambda: context)
    return fake


def _setup(tmp_path: Path) -> TrialSetup:
    return TrialSetup(task="toy-hpo", config=CONFIG, cpus=1, gpus=0, workers=1,
                      results_dir=str(tmp_path / "ray"))


def _spec(name: str):
    return parse_spec({"name": name, "task": "toy-hpo", "config": CONFIG,
                       "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0}},
                       "objective": {"metric": "val_loss"}, "budget": {"n_trials": 1}})


@pytest.mark.parametrize("how", ["retried", "adopted"])
def test_a_trial_resumed_at_its_early_stop_reports_the_same_objective(how, fake_tune,
                                                                       sqlite_url, tmp_path):
    train_trial(dict(PARAMS), _setup(tmp_path))
    full = fake_tune.reports
    assert [m["step"] for m, _ in full] == [2, 4, 6]  # stopped itself at update 6
    last_metrics, last_checkpoint = full[-1]

    # the driver recorded every result, then the trial's process died before it ended
    spec = _spec(f"resume-{how}")
    record = StudyRecord(spec, open_storage(sqlite_url))
    record.ask("r1", PARAMS)
    for metrics, kept in full:
        record.result("r1", metrics)
        record.checkpointed("r1", kept)

    fake_tune.reports = []
    params, ray_id = dict(PARAMS), "r1"
    if how == "retried":  # Tune's own restart (max_failures) from the trial's checkpoint
        record.restarted("r1")
        fake_tune.resume_from = tune.Checkpoint.from_directory(last_checkpoint)
    else:  # the driver died too: a new one adopts the orphan, its checkpoint in the config
        record = StudyRecord(spec, open_storage(sqlite_url))
        (orphan,) = record.orphans()
        ray_id = "r2"
        assert orphan.checkpoint == last_checkpoint
        record.adopt(ray_id, orphan)
        params[RESUME_KEY] = orphan.checkpoint
    train_trial(params, _setup(tmp_path))
    # no update trained past the stop: the final result once more, as it was
    assert [m for m, _ in fake_tune.reports] == [last_metrics]

    for metrics, _ in fake_tune.reports:
        record.result(ray_id, metrics)
    assert record.complete_or_prune(ray_id, "scheduler") == TrialState.COMPLETE
    trial = record.frozen(ray_id)
    assert trial.value == last_metrics["val_loss"]
    assert sorted(trial.intermediate_values) == [2, 4, 6]


def test_a_trials_checkpoints_record_the_tasks_registered_name(fake_tune, tmp_path):
    """A class whose ``name`` is not its entry point's (the breaker's ``something-else``
    under ``brk-renamed``): the model files of its trials must name the registered task,
    which ``trainers evaluate`` looks up."""
    from tests.hpo.toy import HpoToyTask
    from trainers.model_file import model_from_checkpoint

    assert HpoToyTask.name != "registered-elsewhere"
    setup = TrialSetup(task="registered-elsewhere", target="tests.hpo.toy:HpoToyTask",
                       config=CONFIG, cpus=1, gpus=0, workers=1,
                       results_dir=str(tmp_path / "ray"))
    train_trial(dict(PARAMS), setup)
    kept = [path for _, path in fake_tune.reports if path]
    assert kept
    assert {model_from_checkpoint(path)["task"] for path in kept} == {"registered-elsewhere"}
