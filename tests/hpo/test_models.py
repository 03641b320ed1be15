"""The best trials' final models as Optuna artifacts (``hpo.models``): retention, contents, and a
real Ray study whose downloaded model evaluates to the trial's recorded metrics."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy
from optuna.artifacts import download_artifact, get_all_artifact_meta, upload_artifact
from optuna.trial import TrialState

import trainers
from hpo.models import (
    ModelKeeper,
    artifact_store,
    delete_study_artifacts,
    model_filename,
    model_meta,
    rank,
)
from hpo.record import StudyRecord
from hpo.spec import parse_spec
from hpo.storage import open_storage, system_attr_keys, trial_id_of
from trainers.checkpoint import latest_checkpoint
from trainers.model_file import evaluate_model, load_model_file


def test_rank_single_objective_by_value_then_older_first():
    trials = [(0, [0.5]), (1, [0.3]), (2, [0.9]), (3, [0.1]), (4, [0.3])]
    assert rank(trials, ["minimize"]) == [3, 1, 4, 0, 2]
    assert rank(trials, ["maximize"]) == [2, 0, 1, 4, 3]


def test_rank_multi_objective_front_by_front_older_first():
    trials = [(5, [6, 6]), (0, [1, 5]), (1, [2, 2]), (2, [5, 1]), (3, [3, 3]), (4, [2, 2])]
    assert rank(trials, ["minimize", "minimize"]) == [0, 1, 2, 4, 3, 5]
    # maximizing the second objective: (1, 5) and (6, 6) lead; then (2, 2), (3, 3) and the
    # equal (2, 2); (5, 1) last
    assert rank(trials, ["minimize", "maximize"]) == [0, 5, 1, 3, 4, 2]


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    """One real trainers checkpoint (a tiny digits run with EMA) every synthetic trial uses."""
    root = tmp_path_factory.mktemp("ckpt")
    task, config = trainers.create("digits", {
        "max_updates": 4, "max_epochs": None, "eval_interval": 4, "micro_batch_size": 32,
        "width": 8, "ema_decay": 0.5, "device": "cpu", "checkpoint_dir": str(root)})
    trainers.fit(task, config)
    return str(latest_checkpoint(root))


def _spec(name: str, keep: int, **changes):
    data = {"name": name, "task": "toy-hpo", "config": {"max_updates": 40, "max_epochs": None},
            "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
            "objective": {"metric": "val_loss"}, "budget": {"n_trials": 9},
            "keep_models": keep, **changes}
    return parse_spec(data)


# (value, how it ends): trial numbers are the positions
SEQUENCE = [(0.5, "complete"), (0.3, "complete"), (0.9, "complete"), (0.1, "complete"),
            (0.05, "pruned"), (0.4, "complete"), (0.3, "complete"), (0.2, "complete"),
            (0.01, "fail")]


def _run_sequence(record: StudyRecord, checkpoint: str, upto: int | None = None) -> None:
    for i, (value, end) in enumerate(SEQUENCE[:upto]):
        ray_id = f"r{i}"
        record.ask(ray_id)
        result = {"step": 40 if end != "pruned" else 10, "val_loss": value,
                  "planned_updates": 40, "checkpoint_location": checkpoint}
        record.result(ray_id, result)
        if end == "fail":
            record.fail(ray_id, "boom")
        else:
            if end == "pruned":
                record.note_stop(ray_id, "asha")
            record.complete_or_prune(ray_id, "asha")


def _kept(storage, name: str) -> dict[int, str]:
    study = optuna.load_study(study_name=name, storage=storage)
    kept = {}
    for t in study.get_trials(deepcopy=False):
        metas = get_all_artifact_meta(t, storage=storage)
        assert len(metas) <= 1
        if metas:
            assert metas[0].filename == model_filename(name, t.number)
            kept[t.number] = metas[0].artifact_id
    return kept


@pytest.mark.parametrize(("keep", "expected"), [(0, set()), (1, {3}), (3, {3, 7, 1})])
def test_retention_keeps_exactly_the_best_k(sqlite_url, tmp_path, checkpoint, keep, expected):
    storage = open_storage(sqlite_url)
    store_dir = tmp_path / "artifacts"
    spec = _spec(f"keep{keep}", keep)
    record = StudyRecord(spec, storage, models=ModelKeeper(spec, artifact_store(store_dir)))
    _run_sequence(record, checkpoint)
    kept = _kept(storage, spec.name)
    # ranks: 3 (0.1), 7 (0.2), 1 (0.3), 6 (0.3, younger), 5, 0, 2; the pruned 4 and the failed 8
    # never count, whatever their values
    assert set(kept) == expected
    assert sorted(p.name for p in store_dir.iterdir()) == sorted(kept.values())


def test_retention_midway_and_after_a_new_driver(sqlite_url, tmp_path, checkpoint):
    storage = open_storage(sqlite_url)
    spec = _spec("midway", 2)
    store = artifact_store(tmp_path / "a")
    record = StudyRecord(spec, storage, models=ModelKeeper(spec, store))
    _run_sequence(record, checkpoint, upto=4)
    assert set(_kept(storage, spec.name)) == {1, 3}
    # a new driver (a new keeper) continues from what is stored
    record = StudyRecord(spec, storage, models=ModelKeeper(spec, store))
    for i, value in [(4, 0.2), (5, 0.7)]:
        record.ask(f"n{i}")
        record.result(f"n{i}", {"step": 40, "val_loss": value, "planned_updates": 40,
                                "checkpoint_location": checkpoint})
        record.complete_or_prune(f"n{i}", "asha")
    assert set(_kept(storage, spec.name)) == {3, 4}
    assert len(list((tmp_path / "a").iterdir())) == 2


def test_a_new_driver_ranks_only_feasible_trials(sqlite_url, tmp_path, checkpoint):
    # spec constraints: an infeasible trial keeps no model and is never the best; a new
    # driver's keeper read it back among the COMPLETE trials and ranked it first, so the
    # best feasible trial's model was deleted and the next one's not kept: no model at all
    storage = open_storage(sqlite_url)
    spec = _spec("feasible", 1, constraints=[{"metric": "val_loss", "min": 0.2}])
    store = artifact_store(tmp_path / "a")

    def run(record: StudyRecord, trials: list[tuple[int, float]]) -> None:
        for i, value in trials:
            record.ask(f"r{i}")
            record.result(f"r{i}", {"step": 40, "val_loss": value, "planned_updates": 40,
                                    "checkpoint_location": checkpoint})
            record.complete_or_prune(f"r{i}", "asha")

    run(StudyRecord(spec, storage, models=ModelKeeper(spec, store)), [(0, 0.5), (1, 0.1)])
    assert set(_kept(storage, spec.name)) == {0}  # 1 is below the bound: infeasible
    run(StudyRecord(spec, storage, models=ModelKeeper(spec, store)), [(2, 0.3)])
    assert set(_kept(storage, spec.name)) == {2}
    assert len(list((tmp_path / "a").iterdir())) == 1


def test_the_kept_file_is_the_trials_model(sqlite_url, tmp_path, checkpoint):
    storage = open_storage(sqlite_url)
    spec = _spec("content", 1)
    store = artifact_store(tmp_path / "a")
    record = StudyRecord(spec, storage, models=ModelKeeper(spec, store))
    _run_sequence(record, checkpoint, upto=1)
    trial = optuna.load_study(study_name="content", storage=storage).trials[0]
    meta = model_meta(storage, trial, "content")
    download_artifact(artifact_store=store, artifact_id=meta["artifact_id"],
                      file_path=str(tmp_path / "m.pt"))
    model = load_model_file(tmp_path / "m.pt")
    assert model["origin"] == {"study": "content", "trial": 0, "params": trial.params,
                               "values": [0.5]}
    assert model["task"] == "digits" and model["weights_kind"] == "ema"
    assert trial.state == TrialState.COMPLETE
    assert delete_study_artifacts(storage, storage.get_study_id_from_name("content"), store) == 1
    assert list((tmp_path / "a").iterdir()) == []


def _upload(store, tmp_path, study_or_trial, storage, name: str) -> str:
    path = tmp_path / name
    path.write_text(name)
    return upload_artifact(artifact_store=store, file_path=str(path),
                           study_or_trial=study_or_trial, storage=storage)


def _removes_study_and_trial_files_only(storage, tmp_path, name: str) -> list[str]:
    """Artifacts of a study, of its trials and of another study's trial; the statements
    the delete of the study's took."""
    store = artifact_store(tmp_path / "store")
    study = optuna.create_study(study_name=name, storage=storage)
    other = optuna.create_study(study_name=name + "-other", storage=storage)
    trial, other_trial = study.ask(), other.ask()
    storage.set_trial_system_attr(trial_id_of(trial), "ARTIFACTS:not-one", "{}")  # case counts
    ours = [_upload(store, tmp_path, study, storage, "study.txt"),
            _upload(store, tmp_path, trial, storage, "trial.txt")]
    theirs = _upload(store, tmp_path, other_trial, storage, "other.txt")
    study.tell(trial, 1.0)  # a finished trial's artifacts too
    study_id = storage.get_study_id_from_name(name)
    statements = []
    if isinstance(storage, optuna.storages.RDBStorage):
        sqlalchemy.event.listen(storage.engine, "before_cursor_execute",
                                lambda conn, cursor, sql, *_: statements.append(sql))
    assert delete_study_artifacts(storage, study_id, store) == 2
    assert sorted(p.name for p in (tmp_path / "store").iterdir()) == [theirs]
    assert all(not (tmp_path / "store" / a).exists() for a in ours)
    assert delete_study_artifacts(storage, study_id, store) == 0  # files already gone
    with pytest.raises(KeyError):
        delete_study_artifacts(storage, 10**9, store)
    n = len(statements)
    assert system_attr_keys(storage, name, "artifacts:")[0] == study_id  # by name: the same
    assert system_attr_keys(storage, name + "-other", "artifacts:")[0] != study_id
    with pytest.raises(KeyError):
        delete_study_artifacts(storage, name + "-none", store)
    del statements[n:]
    return statements


def test_deleting_a_studys_artifacts_removes_its_files_in_one_select(db_url, tmp_path,
                                                                      unique_name):
    statements = _removes_study_and_trial_files_only(open_storage(db_url), tmp_path,
                                                     unique_name)
    # two deletes of the study's artifacts, then one of an unknown study's: one SELECT each
    assert [sql.split()[0] for sql in statements] == ["SELECT"] * 3


def test_deleting_a_studys_artifacts_on_other_storages(tmp_path):
    _removes_study_and_trial_files_only(optuna.storages.InMemoryStorage(), tmp_path, "mem")


def test_a_trial_without_checkpoint_completes_without_a_model(sqlite_url, tmp_path):
    storage = open_storage(sqlite_url)
    spec = _spec("nockpt", 3)
    record = StudyRecord(spec, storage,
                         models=ModelKeeper(spec, artifact_store(tmp_path / "a")))
    record.ask("r0")
    record.result("r0", {"step": 40, "val_loss": 0.2, "planned_updates": 40,
                         "checkpoint_location": str(tmp_path / "gone")})
    assert record.complete_or_prune("r0", "asha") == TrialState.COMPLETE
    assert _kept(storage, "nockpt") == {}


# -- a real study on Ray -------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("ema", [0.7, None], ids=["ema", "plain"])
def test_a_real_studys_model_evaluates_to_the_trials_recorded_metrics(
        ray_session, sqlite_url, tmp_path, ema):
    from hpo.tune.driver import run_study

    name = f"models-{'ema' if ema else 'plain'}"
    spec = parse_spec({
        "name": name, "task": "digits",
        "config": {"max_updates": 10, "max_epochs": None, "eval_interval": 5,
                   "micro_batch_size": 32, "width": 8, "ema_decay": ema},
        "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
        "objective": {"metric": "val_accuracy"}, "sampler": {"name": "random", "seed": 0},
        "budget": {"n_trials": 2, "max_concurrent_trials": 2}, "keep_models": 1,
    })
    out = run_study(spec, sqlite_url, results_dir=tmp_path / "ray")
    assert out.counts.complete == 2
    storage = open_storage(sqlite_url)
    store = artifact_store(tmp_path / "ray" / "artifacts")  # run_study's default
    trials = optuna.load_study(study_name=name, storage=storage).trials
    kept = {t.number: model_meta(storage, t, name) for t in trials}
    best = out.best_number
    assert [n for n, m in kept.items() if m] == [best]  # keep_models: 1
    download_artifact(artifact_store=store, artifact_id=kept[best]["artifact_id"],
                      file_path=str(tmp_path / "best.pt"))
    model = load_model_file(tmp_path / "best.pt")
    assert model["weights_kind"] == ("ema" if ema else "model")
    assert model["config"]["ema_decay"] == ema and model["step"] == 10
    metrics = evaluate_model(model)
    trial = trials[best]
    assert metrics["val_accuracy"] == pytest.approx(trial.value, abs=1e-6)
    assert metrics["val_accuracy"] == pytest.approx(trial.intermediate_values[10], abs=1e-6)
    assert metrics["val_loss"] == pytest.approx(model["metrics"]["val_loss"], abs=1e-6)
    assert model["origin"]["params"] == trial.params


@pytest.mark.parametrize("bad", [-1, 1001, "3", 2.0, None])
def test_keep_models_out_of_range_is_refused_naming_the_field(bad):
    from hpo.errors import SpecError

    with pytest.raises(SpecError) as e:
        _spec("bad", bad)
    assert [d["loc"] for d in e.value.errors] == ["keep_models"]


def test_keep_models_defaults_to_three():
    spec = parse_spec({"name": "d", "task": "toy-hpo", "objective": {"metric": "val_loss"},
                       "budget": {"n_trials": 1}})
    assert spec.keep_models == 3
