"""Scheduler seams, driven directly with Ray's own Trial objects (no Ray session)."""

from __future__ import annotations

from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from hpo.ray_private import HyperBand
from hpo.tune.schedulers import RecordingScheduler


class _Record:
    """What RecordingScheduler tells the study record: results and STOP decisions."""

    def __init__(self) -> None:
        self.stops: list[tuple[str, str]] = []
        self.results: list[tuple[str, int]] = []

    def knows(self, trial_id: str) -> bool:
        return True

    def result(self, trial_id: str, result: dict) -> None:
        self.results.append((trial_id, result.get("step")))

    def decided(self, trial_id: str, decision: str, by: str) -> None:
        if decision == TrialScheduler.STOP:
            self.stops.append((trial_id, by))


class _Controller:
    def __init__(self) -> None:
        self.stopped: list[str] = []

    def stop_trial(self, trial: Trial) -> None:
        self.stopped.append(trial.trial_id)
        trial.set_status(Trial.TERMINATED)


def _hyperband(n_trials: int):
    inner = HyperBand(time_attr="step", max_t=12, reduction_factor=2, metric="val_loss",
                      mode="min")
    scheduler = RecordingScheduler(inner, _Record(), "hyperband", removal_stops=True)
    controller = _Controller()
    trials = [Trial("toy", stub=True, trial_id=f"t{i}") for i in range(n_trials)]
    for t in trials:
        scheduler.on_trial_add(controller, t)
        t.set_status(Trial.RUNNING)
    return scheduler, controller, trials


def test_hyperband_stops_a_trial_at_max_t_instead_of_pausing_it():
    # Ray pauses it until its bracket-mates arrive; a pause decided while its checkpoint
    # is saved outlived the bracket and Tune waited forever
    scheduler, controller, (a, b, c) = _hyperband(3)
    assert scheduler.on_trial_result(controller, a, {"step": 6, "val_loss": 1.0}) \
        == TrialScheduler.CONTINUE
    assert scheduler.on_trial_result(controller, a, {"step": 12, "val_loss": 1.0}) \
        == TrialScheduler.STOP
    assert scheduler.record.stops == [("t0", "hyperband")]  # the record says COMPLETE (max_t)
    scheduler.on_trial_complete(controller, a, {"step": 12, "val_loss": 1.0})
    assert scheduler.on_trial_result(controller, b, {"step": 12, "val_loss": 0.5}) \
        == TrialScheduler.STOP


def test_hyperband_trial_that_ends_by_itself_is_not_noted_as_stopped():
    scheduler, controller, (a, b) = _hyperband(2)
    scheduler.on_trial_result(controller, a, {"step": 9, "val_loss": 1.0})
    scheduler.on_trial_complete(controller, a, {"step": 9, "val_loss": 1.0})  # returned
    assert scheduler.record.stops == []
    b.set_status(Trial.PAUSED)
    scheduler.on_trial_remove(controller, b)  # Tune removing a paused trial: a stop
    assert scheduler.record.stops == [("t1", "hyperband")]


# -- RecordingScheduler: each result recorded once, with the decision (issue 13.3) ---------

def _study_record(sqlite_url, name: str, scheduler: dict):
    from hpo.record import StudyRecord
    from hpo.spec import parse_spec
    from hpo.storage import open_storage

    spec = parse_spec({"name": name, "task": "toy-hpo",
                       "config": {"max_updates": 40, "max_epochs": None},
                       "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 1e-1}},
                       "objective": {"metric": "val_loss"}, "budget": {"n_trials": 4},
                       "scheduler": scheduler})
    return StudyRecord(spec, open_storage(sqlite_url))


def _result(step: int, value: float) -> dict:
    return {"step": step, "val_loss": value, "planned_updates": 40}


def test_each_result_is_recorded_once_with_the_schedulers_decision(sqlite_url):
    from optuna.trial import TrialState

    from hpo.tune.callback import RecordCallback
    from hpo.tune.schedulers import build_scheduler

    pruner = {"name": "optuna-pruner",
              "pruner": {"name": "median", "n_startup_trials": 1, "n_warmup_steps": 0}}
    record = _study_record(sqlite_url, "once", pruner)
    writes = []
    write = record.storage.set_trial_intermediate_value
    record.storage.set_trial_intermediate_value = lambda *a: (writes.append(a[1:]), write(*a))
    scheduler = build_scheduler(record.spec, record, 40)
    callback = RecordCallback(record, "optuna-median")
    trials = [Trial("toy", stub=True, trial_id=f"t{i}") for i in range(2)]
    for t, value in zip(trials, [1.0, 2.0], strict=True):
        record.ask(t.trial_id)
        scheduler.on_trial_add(_Controller(), t)
        result = _result(10, value)
        decision = scheduler.on_trial_result(_Controller(), t, result)
        callback.on_trial_result(0, trials, t, result)  # Tune tells callbacks after
        assert decision == (TrialScheduler.CONTINUE if value == 1.0 else TrialScheduler.STOP)
        if decision == TrialScheduler.CONTINUE:  # the first trial ends at its planned updates
            scheduler.on_trial_result(_Controller(), t, _result(40, 0.5))
            callback.on_trial_result(0, trials, t, _result(40, 0.5))
        callback.on_trial_complete(0, trials, t)
    assert writes == [(10, 1.0), (40, 0.5), (10, 2.0)]
    first, second = record.study.trials
    assert first.state == TrialState.COMPLETE and first.value == 0.5
    assert second.state == TrialState.PRUNED
    assert second.user_attrs["stopped_by"] == "optuna-median"
    assert record.trials["t0"].decision == TrialScheduler.CONTINUE
    assert record.trials["t1"].decision == TrialScheduler.STOP


def test_the_recording_scheduler_delegates_every_public_hook(tmp_path):
    class Inner(TrialScheduler):
        _supports_buffered_results = False

        def __init__(self) -> None:
            self.calls: list[str] = []

        def __getattribute__(self, name):
            if name in HOOKS:
                object.__getattribute__(self, "calls").append(name)
            return object.__getattribute__(self, name)

        def set_search_properties(self, metric, mode, **spec):
            self._metric = metric
            return True

        def on_trial_add(self, tune_controller, trial): ...
        def on_trial_error(self, tune_controller, trial): ...
        def on_trial_complete(self, tune_controller, trial, result): ...
        def on_trial_remove(self, tune_controller, trial): ...
        def choose_trial_to_run(self, tune_controller): return "chosen"
        def debug_string(self): return "inner"
        def save(self, checkpoint_path): ...
        def restore(self, checkpoint_path): ...

    HOOKS = {"set_search_properties", "on_trial_add", "on_trial_error", "on_trial_complete",
             "on_trial_remove", "choose_trial_to_run", "debug_string", "save", "restore"}
    inner = Inner()
    record = _Record()
    scheduler = RecordingScheduler(inner, record, "x")
    trial, controller = Trial("toy", stub=True, trial_id="t0"), _Controller()
    assert scheduler.set_search_properties("val_loss", "min") is True
    assert scheduler.metric == "val_loss" and scheduler.supports_buffered_results is False
    scheduler.on_trial_add(controller, trial)
    scheduler.on_trial_error(controller, trial)
    scheduler.on_trial_complete(controller, trial, {})
    scheduler.on_trial_remove(controller, trial)
    assert scheduler.choose_trial_to_run(controller) == "chosen"
    assert scheduler.debug_string() == "inner"
    scheduler.save(str(tmp_path / "s"))
    scheduler.restore(str(tmp_path / "s"))
    assert inner.calls == ["set_search_properties", "on_trial_add", "on_trial_error",
                           "on_trial_complete", "on_trial_remove", "choose_trial_to_run",
                           "debug_string", "save", "restore"]
    assert record.stops == []  # a removal is a stop only for the early-stopping schedulers


def test_a_trial_tune_ended_error_without_an_error_event_ends_fail_not_pruned(sqlite_url):
    # Tune's controller ends a trial ERROR without on_trial_error when it cannot reuse an
    # actor for it (reset_config returned False); the run's end must not call it PRUNED
    from optuna.trial import TrialState

    from hpo.tune.callback import RecordCallback
    from hpo.tune.driver import end_open_trials

    record = _study_record(sqlite_url, "reset-failed", {"name": "asha", "grace_period": 10})
    callback = RecordCallback(record, "asha")
    trials = [Trial("toy", stub=True, trial_id=f"t{i}") for i in range(3)]
    for t in trials:
        record.ask(t.trial_id)
    callback.on_trial_start(0, trials, trials[0])
    callback.on_trial_result(0, trials, trials[0], _result(10, 1.0))
    record.result("t0", _result(10, 1.0))
    trials[0].set_status(Trial.TERMINATED)  # stopped with the experiment: the sweep's
    trials[1].set_status(Trial.ERROR)  # the reset that failed: no on_trial_error
    trials[2].set_status(Trial.ERROR)  # an error Tune did report
    callback.on_trial_error(0, trials, trials[2])
    callback.on_experiment_end(trials)
    end_open_trials(record, "asha")
    states = [(t.state, t.user_attrs.get("stopped_by")) for t in record.study.trials]
    assert states == [(TrialState.PRUNED, "asha"), (TrialState.FAIL, None),
                      (TrialState.FAIL, None)]
    assert record.study.trials[1].user_attrs["fail_reason"] == \
        "the trial failed without an error message"
