"""The Optuna record, driven directly (no Ray): states, values, attributes."""

from __future__ import annotations

import math
import types

import optuna
import pytest
from optuna.trial import TrialState

from hpo.errors import StudyExistsError
from hpo.record import StudyRecord
from hpo.spec import parse_spec
from hpo.storage import open_storage


def _spec(name: str, **changes):
    data = {"name": name, "task": "toy-hpo", "config": {"max_updates": 40, "max_epochs": None},
            "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1, "log": True}},
            "objective": {"metric": "val_loss"}, "budget": {"n_trials": 4}, **changes}
    return parse_spec(data)


def _result(step: int, value: float, planned: int = 40, **extra) -> dict:
    return {"step": step, "val_loss": value, "planned_updates": planned, "samples": step * 8,
            "node_ip": "10.0.0.1", **extra}


def _trial(record: StudyRecord, ray_id: str) -> optuna.trial.FrozenTrial:
    return record.storage.get_trial(record.trials[ray_id].trial_id)


def test_results_become_intermediate_values_and_complete_takes_the_last(db_url,
                                                                         unique_name):
    record = StudyRecord(_spec(unique_name), open_storage(db_url))
    params = record.ask("r1")
    assert 1e-3 <= params["lr"] <= 1e-1
    record.started("r1")
    for step, value in [(10, 0.9), (20, 0.5), (30, 0.7), (40, 0.6)]:
        record.result("r1", _result(step, value))
    assert record.complete_or_prune("r1", "asha") == TrialState.COMPLETE
    t = _trial(record, "r1")
    assert t.intermediate_values == {10: 0.9, 20: 0.5, 30: 0.7, 40: 0.6}
    assert t.value == 0.6
    attrs = t.user_attrs
    assert attrs["ray_trial_id"] == "r1" and attrs["node_ip"] == "10.0.0.1"
    assert attrs["samples"] == 320 and attrs["stop_reason"] == "reached its planned updates"
    assert attrs["wall_time_s"] >= 0 and attrs["device_seconds"] == attrs["wall_time_s"]
    assert record.study.user_attrs["device_kind"] == "cpu"
    assert t.datetime_complete >= t.datetime_start


def test_wall_time_counts_from_the_ask_and_not_between_a_failure_and_its_restart(
        sqlite_url, monkeypatch):
    """A trial stopped while its worker started (before Tune's ``on_trial_start`` and any
    result) held its device from its ask, as its gate slot and the study's running
    device-seconds count it: the new-user walkthrough saw 0.0 recorded. A restart after a
    failure (Tune's ``on_trial_recover``) banks the time; its new start counts again."""
    clock = iter([100.0, 103.5, 110.0, 112.25, 200.0, 201.0])
    monkeypatch.setattr("hpo.record.time", types.SimpleNamespace(monotonic=lambda: next(clock)))
    record = StudyRecord(_spec("walls", resources={"cpus": 2}), open_storage(sqlite_url))
    record.ask("starting")  # 100.0
    record.note_stop("starting", "user")
    assert record.complete_or_prune("starting", "user", stopped=True) == TrialState.PRUNED
    attrs = _trial(record, "starting").user_attrs  # ended at 103.5
    assert (attrs["wall_time_s"], attrs["device_seconds"]) == (3.5, 7.0)
    record.ask("restarted")  # 110.0
    record.started("restarted")  # on_trial_start: counts already, no new start
    record.restarted("restarted")  # 112.25: failed, to be restarted
    record.started("restarted")  # 200.0: started again
    record.result("restarted", _result(40, 0.5))
    assert record.complete_or_prune("restarted", "scheduler") == TrialState.COMPLETE  # 201
    attrs = _trial(record, "restarted").user_attrs
    assert attrs["restarts"] == 1
    assert (attrs["wall_time_s"], attrs["device_seconds"]) == (3.25, 6.5)


def test_stopped_before_its_planned_updates_is_pruned_with_who_and_budget(sqlite_url):
    record = StudyRecord(_spec("pruned"), open_storage(sqlite_url))
    record.ask("r1")
    record.result("r1", _result(10, 2.0, done=True))  # Tune marks the result it stops on
    record.note_stop("r1", "asha")
    assert record.complete_or_prune("r1", "scheduler") == TrialState.PRUNED
    t = _trial(record, "r1")
    assert t.state == TrialState.PRUNED and t.value == 2.0
    assert t.intermediate_values == {10: 2.0}
    assert t.user_attrs["stopped_by"] == "asha"
    assert t.user_attrs["budget_updates"] == 10 and t.user_attrs["planned_updates"] == 40


def test_stopped_at_its_planned_updates_is_complete(sqlite_url):
    # ASHA stops a trial at max_t too: it trained to its end, so it is COMPLETE
    record = StudyRecord(_spec("at-max-t"), open_storage(sqlite_url))
    record.ask("r1")
    record.result("r1", _result(40, 0.3, done=True))
    record.note_stop("r1", "asha")
    assert record.complete_or_prune("r1", "asha") == TrialState.COMPLETE


def test_stopped_at_the_schedulers_max_t_is_complete(sqlite_url):
    spec = _spec("max-t", scheduler={"name": "asha", "max_t": 20, "grace_period": 5})
    record = StudyRecord(spec, open_storage(sqlite_url))
    for ray_id, step in [("r1", 20), ("r2", 10)]:
        record.ask(ray_id)
        record.result(ray_id, _result(step, 1.0, done=True))
        record.note_stop(ray_id, "asha")
    assert record.complete_or_prune("r1", "asha") == TrialState.COMPLETE
    assert _trial(record, "r1").user_attrs["stop_reason"] == \
        "reached the scheduler's max_t (20 updates)"
    assert record.complete_or_prune("r2", "asha") == TrialState.PRUNED


def test_trial_that_stopped_itself_early_is_complete(sqlite_url):
    record = StudyRecord(_spec("early-stop"), open_storage(sqlite_url))
    record.ask("r1")
    # its trainer stopped by itself and says so on its last result
    record.result("r1", _result(20, 0.3, stop_reason="early_stopping"))
    assert record.complete_or_prune("r1", "asha") == TrialState.COMPLETE
    assert _trial(record, "r1").user_attrs["stop_reason"] == "stopped itself (early stopping)"


def test_stopped_with_the_whole_experiment_is_pruned(sqlite_url):
    record = StudyRecord(_spec("all-stopped"), open_storage(sqlite_url))
    record.ask("r1")
    record.result("r1", _result(20, 0.3))
    assert record.complete_or_prune("r1", "user", stopped=True) == TrialState.PRUNED
    assert _trial(record, "r1").user_attrs["stopped_by"] == "user"


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_objective_fails_with_reason(db_url, unique_name, bad):
    record = StudyRecord(_spec(unique_name), open_storage(db_url))
    record.ask("r1")
    record.result("r1", _result(10, 0.5))
    record.result("r1", _result(40, bad))
    assert record.complete_or_prune("r1", "fifo") == TrialState.FAIL
    t = _trial(record, "r1")
    assert "not finite" in t.user_attrs["fail_reason"]
    assert t.intermediate_values[10] == 0.5
    stored = t.intermediate_values[40]
    assert (math.isnan(stored) and math.isnan(bad)) or stored == bad  # same on both backends


def test_error_fails_with_the_error_text(sqlite_url):
    record = StudyRecord(_spec("error"), open_storage(sqlite_url))
    record.ask("r1")
    record.fail("r1", "Traceback ...\nRuntimeError: toy failure at update 3")
    t = _trial(record, "r1")
    assert t.state == TrialState.FAIL
    assert "toy failure at update 3" in t.user_attrs["fail_reason"]
    assert record.complete_or_prune("r1", "x") == TrialState.FAIL  # told once, never again


def test_objective_reduce_best(sqlite_url):
    record = StudyRecord(_spec("best", objective_reduce="best"), open_storage(sqlite_url))
    record.ask("r1")
    for step, value in [(10, 0.9), (20, 0.2), (40, 0.5)]:
        record.result("r1", _result(step, value))

    record.complete_or_prune("r1", "fifo")
    assert _trial(record, "r1").value == 0.2


def test_same_name_with_another_spec_is_refused(sqlite_url):
    storage = open_storage(sqlite_url)
    StudyRecord(_spec("same"), storage)
    StudyRecord(_spec("same"), storage)  # same spec: loads
    with pytest.raises(StudyExistsError, match="different spec"):
        StudyRecord(_spec("same", budget={"n_trials": 5}), storage)


def test_a_spec_vouched_for_is_not_compared_with_the_stored_copy(sqlite_url):
    storage = open_storage(sqlite_url)
    StudyRecord(_spec("vouched"), storage)
    other = _spec("vouched", budget={"n_trials": 5})
    record = StudyRecord(other, storage, compare_spec=False)  # the service's own stored spec
    assert record.study.user_attrs["hpo_spec"] == _spec("vouched").to_dict()  # not rewritten
    with pytest.raises(StudyExistsError, match="different spec"):
        StudyRecord(other, storage)


def test_create_study_stores_the_spec_and_refuses_a_taken_name(sqlite_url):
    from hpo.record import create_study

    storage = open_storage(sqlite_url)
    spec = _spec("created")
    study_id = create_study(spec, storage)
    assert storage.get_study_id_from_name("created") == study_id
    assert storage.get_study_user_attrs(study_id)["hpo_spec"] == spec.to_dict()
    assert StudyRecord(spec, storage).study_id == study_id  # the driver then opens it
    with pytest.raises(StudyExistsError, match="'created' exists already"):
        create_study(spec, storage)


def test_given_params_are_used_as_they_are(sqlite_url):
    record = StudyRecord(_spec("given"), open_storage(sqlite_url))
    assert record.ask("r1", params={"lr": 0.0123}) == {"lr": 0.0123}
    assert _trial(record, "r1").params == {"lr": 0.0123}
    assert record.counts().running == 1


class _Listener:
    def __init__(self, fail: bool = False) -> None:
        self.seen: list[tuple[int, TrialState, dict]] = []
        self.fail = fail

    def trial_changed(self, trial: optuna.trial.FrozenTrial) -> None:
        self.seen.append((trial.number, trial.state, dict(trial.intermediate_values)))
        if self.fail:
            raise RuntimeError("listener down")


def test_listener_hears_every_state_and_value_change(sqlite_url):
    storage = open_storage(sqlite_url)
    listener = _Listener()
    record = StudyRecord(_spec("heard"), storage, listener=listener)
    record.ask("r1")
    record.result("r1", _result(10, 0.9))  # intermediate values are not told
    record.result("r1", _result(40, 0.5))
    record.complete_or_prune("r1", "fifo")
    record.ask("r2")
    record.fail("r2", "boom")
    record.ask("r3")  # left RUNNING: the next driver requeues it
    record.ask("r4")
    record.ask("r5")
    RUNNING, COMPLETE, FAIL = TrialState.RUNNING, TrialState.COMPLETE, TrialState.FAIL
    assert listener.seen == [(0, RUNNING, {}), (0, COMPLETE, {10: 0.9, 40: 0.5}),
                             (1, RUNNING, {}),
                             (1, FAIL, {}), (2, RUNNING, {}), (3, RUNNING, {}),
                             (4, RUNNING, {})]
    listener.seen.clear()
    later = StudyRecord(_spec("heard"), storage, listener=listener)
    first, second, third = later.orphans()
    later.requeue(first, "driver gone")
    later.abandon(second, "population gone")
    later.adopt("r9", third)
    assert listener.seen == [(2, FAIL, {}), (5, TrialState.WAITING, {}), (3, FAIL, {}),
                             (4, RUNNING, {})]


def test_a_record_pickles_without_its_listener(sqlite_url):
    # Tune pickles its scheduler and callbacks, which hold the record
    import pickle
    import weakref

    listener = _Listener()
    listener.ref = weakref.ref(listener)  # like a database session: not picklable
    record = StudyRecord(_spec("pickled"), open_storage(sqlite_url), listener=listener)
    record.ask("r1")
    pickled = pickle.dumps(record)
    copy = pickle.loads(pickled)
    assert copy.listener is None and record.listener is listener
    assert copy.trials["r1"].number == 0
    # nor its storage: Optuna's RDBStorage pickles with the database URL, password included
    assert sqlite_url.encode() not in pickled
    assert (copy.storage, copy.study) == (None, None) and record.study.study_name == "pickled"


def test_a_failing_listener_never_breaks_the_record(sqlite_url):
    record = StudyRecord(_spec("deaf"), open_storage(sqlite_url), listener=_Listener(fail=True))
    record.ask("r1")
    record.result("r1", _result(40, 0.5))
    assert record.complete_or_prune("r1", "fifo") == TrialState.COMPLETE
    assert record.listener.seen[-1] == (0, TrialState.COMPLETE, {40: 0.5})


@pytest.mark.parametrize(("last", "reason"), [
    ({}, "no result reported"),
    ({"val_loss": 0.5}, "its last result has no val_score (an objective)"),
    ({"samples": 8}, "its last result has no val_loss, val_score (an objective)"),
    ({"val_loss": 0.5, "val_score": math.nan}, "objective val_score is nan (not finite)"),
    ({"val_loss": -math.inf, "val_score": 0.9}, "objective val_loss is -inf (not finite)"),
], ids=["nothing", "one-missing", "both-missing", "nan", "-inf"])
def test_a_trial_ends_fail_naming_the_objective_its_last_result_lacks(sqlite_url, unique_name,
                                                                      last, reason):
    """The breaker: a last result without an objective said "no result reported" (it had
    reported), and a NaN one did not say which objective."""
    spec = _spec(unique_name, objective=[{"metric": "val_loss"},
                                         {"metric": "val_score", "direction": "maximize"}])
    record = StudyRecord(spec, open_storage(sqlite_url))
    record.ask("r1")
    if last:
        record.result("r1", {"step": 40, "planned_updates": 40, **last})
    assert record.complete_or_prune("r1", "fifo") == TrialState.FAIL
    assert _trial(record, "r1").user_attrs["fail_reason"] == reason
