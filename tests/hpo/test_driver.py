"""Studies on a real local Ray: what Tune did is what the Optuna study says."""

from __future__ import annotations

import optuna
import pytest
from optuna.trial import TrialState

from hpo.errors import SpecError
from hpo.models import model_meta
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.tune.driver import run_study

pytestmark = pytest.mark.usefixtures("ray_session")

PLANNED = 12  # updates per toy trial; evaluated every 3


def toy_spec(name: str, **changes):
    data = {
        "name": name,
        "task": "toy-hpo",
        "config": {"max_updates": PLANNED, "max_epochs": None, "eval_interval": 3,
                   "micro_batch_size": 8},
        "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0}},
        "objective": {"metric": "val_loss"},
        "sampler": {"name": "random", "seed": 1},
        "budget": {"n_trials": 6, "max_concurrent_trials": 2},
        "resources": {"cpus": 1},
    }
    for key, value in changes.items():
        data[key] = {**data[key], **value} if isinstance(value, dict) and key in (
            "config", "budget") else value
    return parse_spec(data)


def run(spec, url, tmp_path, **kw):
    out = run_study(spec, url, results_dir=tmp_path / "ray", **kw)
    study = optuna.load_study(study_name=spec.name, storage=url)
    return out, study.get_trials(deepcopy=False)


def test_fifo_records_every_result_and_the_last_value(sqlite_url, tmp_path):
    out, trials = run(toy_spec("fifo", budget={"n_trials": 3}), sqlite_url, tmp_path)
    assert out.counts.complete == 3 and len(trials) == 3
    for t in trials:
        assert t.state == TrialState.COMPLETE
        assert sorted(t.intermediate_values) == [3, 6, 9, 12]  # the last one included
        assert t.value == t.intermediate_values[12]
        assert t.value == pytest.approx(t.params["quality"] + 1 / 5)
        attrs = t.user_attrs
        for key in ["ray_trial_id", "node_ip", "node_id", "checkpoint", "wall_time_s",
                    "device_seconds", "samples"]:
            assert key in attrs, key
        assert attrs["samples"] == PLANNED * 8
        assert attrs["device_seconds"] == pytest.approx(attrs["wall_time_s"] * 1.0, abs=1e-3)
        assert "checkpoint_" in attrs["checkpoint"]


def test_trials_leave_no_tune_log_files_only_their_record(sqlite_url, tmp_path):
    """Tune's per-trial progress.csv, result.json, params.json and TensorBoard events are
    not written (hpo.tune.callback.no_trial_logs); the checkpoints still are."""
    out, trials = run(toy_spec("no-tune-logs", budget={"n_trials": 2}), sqlite_url, tmp_path)
    assert out.counts.complete == 2
    trial_dirs = [d for d in (tmp_path / "ray" / "no-tune-logs").iterdir() if d.is_dir()]
    assert len(trial_dirs) == 2
    names = {p.name for d in trial_dirs for p in d.iterdir()}
    assert not names & {"progress.csv", "result.json", "params.json", "params.pkl"}
    assert not [n for n in names if n.startswith("events.out.tfevents")]
    assert all(any(p.name.startswith("checkpoint_") for p in d.iterdir()) for d in trial_dirs)
    assert all(t.user_attrs["checkpoint"].startswith(str(tmp_path)) for t in trials)
    # Tune's tuner.pkl held the searcher's record and with it Optuna's storage, whose
    # pickle carries the database URL (a PostgreSQL password too) into this folder
    files = [p for p in (tmp_path / "ray").rglob("*") if p.is_file()]
    assert any(p.name == "tuner.pkl" for p in files)
    assert [p.name for p in files if sqlite_url.encode() in p.read_bytes()] == []


def _check_pruned_and_complete(trials, stopper: str):
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and complete
    for t in pruned:
        assert t.user_attrs["stopped_by"] == stopper
        budget = t.user_attrs["budget_updates"]
        assert budget < PLANNED and max(t.intermediate_values) == budget
        assert t.value == t.intermediate_values[budget]  # the stopping result is recorded
    for t in complete:  # a low-budget result is never recorded as a full-budget one
        assert max(t.intermediate_values) == PLANNED


def test_asha_stopped_trials_are_pruned(sqlite_url, tmp_path):
    # one trial at a time, so that which trials reach a rung first is deterministic
    spec = toy_spec("asha", scheduler={"name": "asha", "grace_period": 3,
                                       "reduction_factor": 2},
                    budget={"max_concurrent_trials": 1})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.finished == 6 and out.counts.failed == 0
    _check_pruned_and_complete(trials, "asha")


def test_median_stopping_rule_trials_are_pruned(sqlite_url, tmp_path):
    # seed 11 draws qualities 1.8, 0.2, 4.6, 7.2, 4.2, 4.9: the later, worse ones stop
    spec = toy_spec("median", scheduler={"name": "median", "grace_period": 3,
                                         "min_samples_required": 2},
                    sampler={"name": "random", "seed": 11},
                    budget={"max_concurrent_trials": 1})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.finished == 6
    _check_pruned_and_complete(trials, "median")


@pytest.mark.parametrize("pruner", [
    {"name": "median", "n_startup_trials": 2},
    {"name": "percentile", "percentile": 50, "n_startup_trials": 2},
    {"name": "successive-halving", "min_resource": 3, "reduction_factor": 2},
    {"name": "hyperband", "min_resource": 3, "max_resource": 12, "reduction_factor": 2},
    {"name": "patient", "patience": 0, "wrapped": {"name": "median", "n_startup_trials": 2}},
    {"name": "wilcoxon", "n_startup_steps": 1},
], ids=lambda p: p["name"])
def test_optuna_pruners_stop_ray_trials(pruner, sqlite_url, tmp_path):
    spec = toy_spec(f"pruner-{pruner['name']}", sampler={"name": "grid"},
                    search_space={"quality": {"type": "float", "low": 0, "high": 5, "step": 1}},
                    scheduler={"name": "optuna-pruner", "pruner": pruner},
                    budget={"max_concurrent_trials": 1})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.finished == 6 and out.counts.failed == 0
    if pruner["name"] == "patient":  # every toy curve improves at every step: never pruned
        assert out.counts.complete == 6
    elif pruner["name"] != "wilcoxon":  # Wilcoxon compares instance ids; it may prune nothing
        _check_pruned_and_complete(trials, f"optuna-{pruner['name']}")


def test_hyperband_pauses_and_prunes(sqlite_url, tmp_path):
    spec = toy_spec("hyperband", scheduler={"name": "hyperband", "max_t": PLANNED,
                                            "reduction_factor": 2},
                    budget={"n_trials": 4})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.finished == 4 and out.counts.failed == 0
    assert out.counts.running == 0
    for t in trials:
        assert t.state in (TrialState.COMPLETE, TrialState.PRUNED)
        assert max(t.intermediate_values) in (3, 6, 9, 12)


def test_a_raising_trial_fails_with_its_error_and_the_study_goes_on(sqlite_url, tmp_path):
    spec = toy_spec("raises", search_space={"fail_at_update": {
        "type": "categorical", "choices": [0, 5]}}, sampler={"name": "grid"},
        budget={"n_trials": 2})
    out, trials = run(spec, sqlite_url, tmp_path)
    by_param = {t.params["fail_at_update"]: t for t in trials}
    assert by_param[0].state == TrialState.COMPLETE
    failed = by_param[5]
    assert failed.state == TrialState.FAIL
    # the exception's line, without Ray's traceback and its paths (issue 11)
    assert failed.user_attrs["fail_reason"] == "RuntimeError: toy failure at update 5"
    assert sorted(failed.intermediate_values) == [3]


def test_a_task_calling_sys_exit_fails_its_trial_saying_so(sqlite_url, tmp_path):
    """helper-41: Ray took the trainable's SystemExit for its actor's death: the trial's
    fail_reason was "The actor died unexpectedly before finishing this task"; a bare
    sys.exit() too (helper-43)."""
    spec = toy_spec("exits", search_space={"exit_at_update": {
        "type": "categorical", "choices": [0, 5]}, "bare_exit_at_update": {
        "type": "categorical", "choices": [0, 4]}}, sampler={"name": "grid"},
        budget={"n_trials": 4})
    _, trials = run(spec, sqlite_url, tmp_path)
    reasons = {(t.params["exit_at_update"], t.params["bare_exit_at_update"]):
               (t.state, t.user_attrs.get("fail_reason")) for t in trials}
    assert reasons == {
        (0, 0): (TrialState.COMPLETE, None),
        (5, 0): (TrialState.FAIL, "RuntimeError: the task's code called "
                                  "sys.exit('toy exit at update 5')"),
        (0, 4): (TrialState.FAIL, "RuntimeError: the task's code called sys.exit()"),
        (5, 4): (TrialState.FAIL, "RuntimeError: the task's code called sys.exit()")}


def test_nan_objective_fails_never_running(sqlite_url, tmp_path):
    spec = toy_spec("nan", config={"nan_from_eval": 3}, budget={"n_trials": 2})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.failed == 2 and out.counts.running == 0
    for t in trials:
        assert t.state == TrialState.FAIL
        assert "not finite" in t.user_attrs["fail_reason"]
        assert sorted(t.intermediate_values) == [3, 6, 9, 12]


def test_objective_reduce_best_takes_the_best_value(sqlite_url, tmp_path):
    spec = toy_spec("reduce-best", objective={"metric": "val_score"}, objective_reduce="best",
                    budget={"n_trials": 2})
    _, trials = run(spec, sqlite_url, tmp_path)
    for t in trials:
        assert t.value == max(t.intermediate_values.values())


def test_two_trials_run_at_once(sqlite_url, tmp_path):
    # ray#46965: with a custom searcher Tune ran one trial at a time
    spec = toy_spec("concurrent", config={"sleep_ms": 40}, budget={"n_trials": 4})
    _, trials = run(spec, sqlite_url, tmp_path)
    spans = sorted((t.datetime_start, t.datetime_complete) for t in trials)
    overlapping = sum(1 for (s0, e0), (s1, _) in zip(spans, spans[1:], strict=False) if s1 < e0)
    assert overlapping >= 1


def test_same_spec_and_seed_suggest_the_same_first_trials(sqlite_url, tmp_path):
    params = []
    for name in ["seeded-a", "seeded-b"]:
        spec = toy_spec(name, sampler={"name": "tpe", "seed": 3, "n_startup_trials": 2},
                        budget={"n_trials": 3, "max_concurrent_trials": 1})
        _, trials = run(spec, sqlite_url, tmp_path / name)
        params.append([t.params for t in sorted(trials, key=lambda t: t.number)])
    assert params[0] == params[1]


def test_multi_objective_study_completes_with_all_values(sqlite_url, tmp_path):
    spec = toy_spec("multi", objective=[{"metric": "val_loss"}, {"metric": "val_score"}],
                    sampler={"name": "nsga2", "population_size": 2}, budget={"n_trials": 2})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.complete == 2
    for t in trials:
        assert len(t.values) == 2 and t.values[1] == -t.values[0]
    # the two objectives agree, so the Pareto front is the one best trial
    best = min(trials, key=lambda t: t.values[0])
    assert out.pareto_front == [(best.number, best.values, best.params)]
    assert out.best_number is None


def test_resources_no_node_can_provide_are_refused_naming_the_field(sqlite_url, tmp_path):
    with pytest.raises(SpecError) as info:
        run_study(toy_spec("too-big", resources={"cpus": 1, "gpus": 4}), sqlite_url,
                  results_dir=tmp_path)
    assert info.value.errors[0]["loc"] == "resources.gpus"
    with pytest.raises(SpecError) as info:
        run_study(toy_spec("too-many", resources={"cpus": 64}), sqlite_url, results_dir=tmp_path)
    assert info.value.errors[0]["loc"] == "resources.cpus"


def test_user_stop_ends_running_trials_as_pruned_by_user(sqlite_url, tmp_path):
    spec = toy_spec("stopped", config={"sleep_ms": 100}, budget={"n_trials": 4})
    seen = {"results": 0}

    def on_change(record):
        seen["results"] = sum(len(t.values) for t in record.trials.values())

    out = run_study(spec, sqlite_url, results_dir=tmp_path, on_change=on_change,
                    should_stop=lambda: seen["results"] >= 2)
    assert out.stopped
    trials = optuna.load_study(study_name="stopped", storage=sqlite_url).trials
    assert out.counts.running == 0 and out.counts.finished < 4
    by_user = [t for t in trials if t.user_attrs.get("stopped_by") == "user"]
    assert by_user and all(t.state == TrialState.PRUNED for t in by_user)


def test_asha_trials_keep_checkpoints_only_where_they_can_be_used(sqlite_url, tmp_path):
    # issue 18.5: a trial ASHA stops at a rung is never resumed, so it wrote none; one
    # that reached max_t (COMPLETE, its model kept) has the checkpoint of its last report
    spec = toy_spec("asha-checkpoints", scheduler={"name": "asha", "grace_period": 3,
                                                   "reduction_factor": 2, "max_t": 9},
                    budget={"max_concurrent_trials": 1}, checkpoint_interval_s=3600.0)
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.counts.finished == 6 and out.counts.failed == 0
    pruned = [t for t in trials if t.state == TrialState.PRUNED]
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    assert pruned and complete
    assert not [t.number for t in pruned if "checkpoint" in t.user_attrs]
    for t in complete:
        assert max(t.intermediate_values) == 9 and t.user_attrs["checkpoint"]
        assert "reached the scheduler's max_t" in t.user_attrs["stop_reason"]
    storage = open_storage(sqlite_url)  # the best keep_models (3) keep their models
    kept = [t for t in complete if model_meta(storage, t, spec.name) is not None]
    assert len(kept) == min(3, len(complete))


@pytest.mark.parametrize("ask", ["stop", "interrupt"])
def test_a_stop_seen_before_the_first_trial_starts_none(sqlite_url, tmp_path, ask):
    # a stop (or interrupt) that came during the driver's set-up: Tune is not started, no
    # trial is made, and the stop is polled exactly once before that choice
    calls = []

    def asked():
        calls.append(ask)
        return True

    kw = {"should_stop": asked} if ask == "stop" else {"should_interrupt": asked}
    out = run_study(toy_spec(f"stopped-early-{ask}"), sqlite_url, results_dir=tmp_path, **kw)
    assert (out.stopped, out.interrupted) == ((True, False) if ask == "stop" else (False, True))
    assert calls == [ask]
    assert optuna.load_study(study_name=f"stopped-early-{ask}", storage=sqlite_url).trials == []
    assert out.counts.finished == 0 and out.counts.running == 0


def test_tunes_warning_of_the_trial_logs_it_does_not_write_is_dropped_and_no_other(caplog):
    import logging

    from hpo.tune.callback import no_trial_logs

    no_trial_logs()
    no_trial_logs()  # one filter, however many runs
    logger = logging.getLogger("ray.tune.analysis.experiment_analysis")
    assert len(logger.filters) == 1
    missing = ("- train_{}: FileNotFoundError('Could not fetch metrics for train_{}: both "
               "result.json and progress.csv were not found at /x')")
    with caplog.at_level(logging.WARNING, logger=logger.name):
        logger.warning("Failed to fetch metrics for 2 trial(s):\n%s\n%s",
                       missing.format(1, 1), missing.format(2, 2))
        logger.warning("Failed to fetch metrics for 2 trial(s):\n%s\n- train_3: "
                       "PermissionError('denied')", missing.format(1, 1))
        logger.warning("something else")
    assert [r.getMessage().splitlines()[-1] for r in caplog.records] == [
        "- train_3: PermissionError('denied')", "something else"]


def test_a_study_named_as_the_model_store_is_refused_before_anything_is_stored(sqlite_url,
                                                                               tmp_path):
    """``hpo run``: the default model store is ``<results_dir>/artifacts``, a study's result
    folder ``<results_dir>/<name>`` (see tests/service/test_artifacts_name.py)."""
    with pytest.raises(SpecError, match="^name: 'artifacts' names the folder of the kept"):
        run_study(toy_spec("artifacts"), sqlite_url, results_dir=tmp_path / "runs")
    with pytest.raises(SpecError, match="^name: 'kept' names"):
        run_study(toy_spec("kept"), sqlite_url, results_dir=tmp_path / "runs",
                  artifact_dir=tmp_path / "runs" / "kept")
    assert optuna.get_all_study_names(sqlite_url) == []
    assert not (tmp_path / "runs").exists()
