"""Study-level stopping (spec ``budget.stop_when``, issue 18.3): the rules over hand-made
trials, the spec's checks, and studies on a real Ray that end early, COMPLETED."""

from __future__ import annotations

import datetime as dt
import time

import optuna
import pytest
from optuna.distributions import FloatDistribution
from optuna.trial import FrozenTrial, TrialState

from hpo.errors import SpecError
from hpo.record import StudyRecord
from hpo.stopping import STOP_REASON_ATTR, stop_reason
from hpo.storage import open_storage
from tests.hpo.test_driver import run, toy_spec

T0 = dt.datetime(2026, 1, 1)


def _trial(number: int, state: TrialState, value: float | None = None,
           done_at: int | None = None, memory: float | None = None,
           stopped_by: str | None = None) -> FrozenTrial:
    """A finished trial; with ``memory``, a spec constraint ``memory.max`` whose
    violation is ``memory`` (> 0: infeasible), as ``hpo.record`` sets it."""
    t = optuna.trial.create_trial(
        state=state, value=value if state == TrialState.COMPLETE else None,
        params={"x": 0.5}, distributions={"x": FloatDistribution(0, 1)},
        intermediate_values={1: value} if value is not None else {},
        user_attrs={} if stopped_by is None else {"stopped_by": stopped_by},
        system_attrs={} if memory is None else {"constraints:memory.max": memory})
    t.number = number
    t.datetime_complete = T0 + dt.timedelta(seconds=number if done_at is None else done_at)
    return t


C, P, F = TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL


def test_the_target_fires_at_the_first_complete_trial_reaching_it():
    trials = [_trial(0, C, 0.5), _trial(1, P, 0.99), _trial(2, C, 0.984), _trial(3, C, 0.985)]
    rule = dict(metric="val_accuracy", maximize=True, target=0.985)
    assert stop_reason(trials[:3], **rule) is None  # a pruned trial's value is no result
    assert stop_reason(trials, **rule) == (
        "stop_when.target: trial 3's val_accuracy 0.985 reached the target 0.985 "
        "(when 4 trials had finished)")
    assert stop_reason([_trial(0, C, 0.31)], metric="val_loss", maximize=False,
                       target=0.3) is None
    assert stop_reason([_trial(0, C, 0.3)], metric="val_loss", maximize=False,
                       target=0.3) == ("stop_when.target: trial 0's val_loss 0.3 reached the "
                                       "target 0.3 (when 1 trial had finished)")


def test_no_improvement_counts_finished_trials_since_the_best_by_more_than_min_delta():
    # minimize: trial 1 sets the best (0.9); 2 worse, 3 pruned, 4 better by only 0.001
    # (not more than min_delta 0.01, so the best stays 0.9), 5 FAIL (not counted), 6 worse
    trials = [_trial(0, C, 1.0), _trial(1, C, 0.9), _trial(2, C, 0.95), _trial(3, P),
              _trial(4, C, 0.899), _trial(5, F), _trial(6, C, 0.97)]
    rule = dict(metric="val_loss", maximize=False, no_improvement_trials=4, min_delta=0.01)
    assert [stop_reason(trials[:k], **rule) for k in range(1, 7)] == [None] * 6
    assert stop_reason(trials, **rule) == (
        "stop_when.no_improvement_trials: 4 trials finished since trial 1 set the best "
        "val_loss 0.9, none improving it by more than 0.01 (when 6 trials had finished)")
    # without min_delta trial 4 is an improvement, and the count starts again there
    assert stop_reason(trials, **{**rule, "min_delta": 0.0}) is None


def test_trials_count_in_the_order_they_finished_not_by_number():
    # trial 2 finished first, then 0 (the best), then 1: one trial since the best
    trials = [_trial(0, C, 0.9, done_at=2), _trial(1, C, 0.5, done_at=3),
              _trial(2, C, 0.1, done_at=1)]
    rule = dict(metric="acc", maximize=True, no_improvement_trials=2)
    assert stop_reason(trials, **rule) is None
    assert stop_reason([*trials, _trial(3, P, done_at=4)], **rule) == (
        "stop_when.no_improvement_trials: 2 trials finished since trial 0 set the best acc "
        "0.9, none improving it (when 4 trials had finished)")
    assert stop_reason([_trial(0, P), _trial(1, P)], **rule) == (
        "stop_when.no_improvement_trials: 2 trials finished, none of them COMPLETE "
        "(when 2 trials had finished)")
    assert stop_reason([_trial(0, P)], **{**rule, "no_improvement_trials": 1}) == (
        "stop_when.no_improvement_trials: 1 trial finished, none of them COMPLETE "
        "(when 1 trial had finished)")


@pytest.mark.parametrize("by", ["user", "timeout", "budget", "stop_when", "study_failed"])
def test_trials_pruned_by_a_runs_end_are_no_trials_without_improvement(by):
    # a run stopped (or timed out) twice, 2 trials at a time, then run again: its 4 trials
    # ended by the runs' ends were never judged, the 2 that ASHA pruned were
    trials = [_trial(0, C, 0.9), _trial(1, P, stopped_by=by), _trial(2, P, stopped_by=by),
              _trial(3, P, stopped_by="asha"), _trial(4, P, stopped_by=by),
              _trial(5, P, stopped_by=by), _trial(6, P, stopped_by="asha")]
    rule = dict(metric="acc", maximize=True, no_improvement_trials=3)
    assert stop_reason(trials, **rule) is None
    assert stop_reason([*trials, _trial(7, C, 0.5)], **rule) == (
        "stop_when.no_improvement_trials: 3 trials finished since trial 0 set the best acc "
        "0.9, none improving it (when 4 trials had finished)")


def test_an_infeasible_trial_fires_no_target_and_sets_no_best():
    # spec constraints: trial 1 reached the target but broke its memory bound; the best
    # trial (hpo.summary) is the best feasible one, and so is the rules'
    trials = [_trial(0, C, 0.5, memory=-1.0), _trial(1, C, 0.99, memory=2.0),
              _trial(2, C, 0.6, memory=0.0)]
    rule = dict(metric="acc", maximize=True, target=0.9)
    assert stop_reason(trials, **rule) is None
    assert stop_reason([*trials, _trial(3, C, 0.95, memory=-3.0)], **rule) == (
        "stop_when.target: trial 3's acc 0.95 reached the target 0.9 (when 4 trials had finished)")
    plateau = dict(metric="acc", maximize=True, no_improvement_trials=2)
    assert stop_reason(trials, **plateau) is None  # 2 improved on 0 (0.6 > 0.5)
    assert stop_reason([*trials, _trial(3, C, 0.7, memory=1.0), _trial(4, P)], **plateau) == (
        "stop_when.no_improvement_trials: 2 trials finished since trial 2 set the best acc "
        "0.6, none improving it (when 5 trials had finished)")
    assert stop_reason([_trial(0, C, 0.9, memory=1.0), _trial(1, P)], **plateau) == (
        "stop_when.no_improvement_trials: 2 trials finished, none of them COMPLETE and "
        "feasible (when 2 trials had finished)")


@pytest.mark.parametrize("stop_when, changes, loc, msg", [
    ({}, {}, "budget.stop_when",
     "give no_improvement_trials (with min_delta) or target, or both"),
    ({"target": 1.0, "min_delta": 0.1}, {}, "budget.stop_when",
     "min_delta applies to no_improvement_trials, which is not set"),
    ({"no_improvement_trials": 0}, {}, "budget.stop_when.no_improvement_trials",
     "Input should be greater than or equal to 1"),
    ({"no_improvement_trials": 2, "min_delta": -1.0}, {}, "budget.stop_when.min_delta",
     "Input should be greater than or equal to 0"),
    ({"target": "high"}, {}, "budget.stop_when.target", "Input should be a valid number"),
    ({"target": 1.0}, {"objective": [{"metric": "val_loss"}, {"metric": "samples"}],
                       "sampler": {"name": "nsga2"}},
     "budget.stop_when", "study-level stopping needs one objective"),
    ({"target": 1.0}, {"scheduler": {"name": "pbt", "perturbation_interval": 3}},
     "budget.stop_when", "pbt trains its population together and starts no trial later "
                         "that a rule could hold back; use budget.timeout_s"),
])
def test_a_bad_stop_when_names_its_field(stop_when, changes, loc, msg):
    with pytest.raises(SpecError) as e:
        toy_spec("bad", budget={"stop_when": stop_when}, **changes)
    assert {"loc": loc, "msg": msg} in e.value.errors


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_study_stops_at_its_target_one_trial_at_a_time(sqlite_url, tmp_path):
    # val_loss of toy-hpo at its end: quality + 0.2; random qualities in [0, 10]
    spec = toy_spec("target", budget={"n_trials": 30, "max_concurrent_trials": 1,
                                      "stop_when": {"target": 3.0}})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * len(trials)
    assert len(trials) < 30 and trials[-1].value <= 3.0
    assert all(t.value > 3.0 for t in trials[:-1])  # the first that reached it, and no more
    reason = (f"stop_when.target: trial {trials[-1].number}'s val_loss "
              f"{trials[-1].value:.6g} reached the target 3 "
              f"(when {len(trials)} trials had finished)")
    assert out.stop_reason == reason and not out.stopped
    study = optuna.load_study(study_name="target", storage=sqlite_url)
    assert study.user_attrs[STOP_REASON_ATTR] == reason
    # run again: the rule still holds, no trial is added
    out_again, again = run(spec, sqlite_url, tmp_path)
    assert len(again) == len(trials) and out_again.stop_reason == reason


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_no_improvement_stops_while_running_trials_end_as_the_scheduler_decides(
        sqlite_url, tmp_path):
    spec = toy_spec("plateau", config={"sleep_ms": 20},
                    scheduler={"name": "asha", "grace_period": 3, "reduction_factor": 2},
                    budget={"n_trials": 40, "max_concurrent_trials": 2,
                            "stop_when": {"no_improvement_trials": 3}})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert len(trials) < 40
    assert {t.state for t in trials} <= {TrialState.COMPLETE, TrialState.PRUNED}  # none RUNNING
    assert not any(t.user_attrs.get("stopped_by") == "user" for t in trials)
    finished = sorted(trials, key=lambda t: (t.datetime_complete, t.number))
    rule = dict(metric="val_loss", maximize=False, no_improvement_trials=3)
    # the rule fired once the trials that had finished then met it; the one trial running
    # at that moment (two at a time) then ended by itself or by ASHA
    fired = next(k for k in range(1, len(finished) + 1)
                 if stop_reason(finished[:k], **rule) is not None)
    assert fired >= len(finished) - 1
    assert out.stop_reason == stop_reason(finished[:fired], **rule)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("concurrency", [1, 2])
def test_warm_start_points_not_asked_when_the_rule_fires_end_pruned_not_waiting(
        concurrency, sqlite_url, tmp_path):
    """The breaker's finding: the first warm-start point reached the target, the study
    ended COMPLETED, and the other points stayed WAITING for good (REST counted them
    ``waiting``; a second run did not end them either: the rule fired before they were
    asked). Those never asked now end PRUNED, ``stopped_by: stop_when``."""
    points = [{"params": {"quality": q}} for q in (0.5, 9.0, 9.5, 8.0)]
    spec = toy_spec(f"warm-{concurrency}", warm_start=points,
                    budget={"n_trials": 10, "max_concurrent_trials": concurrency,
                            "stop_when": {"target": 1.0}})
    out, trials = run(spec, sqlite_url, tmp_path)
    assert out.stop_reason is not None and out.stop_reason.startswith("stop_when.target: ")
    assert not [t.number for t in trials if t.state in (TrialState.WAITING,
                                                         TrialState.RUNNING)]
    never = [t for t in trials if t.user_attrs.get("stopped_by") == "stop_when"]
    for t in never:
        assert (t.state, t.user_attrs["budget_updates"], t.intermediate_values) == (
            TrialState.PRUNED, 0, {})
        k = int(t.user_attrs["warm_start"][len("points["):-1])  # its point, as its params
        assert t.params == points[k]["params"]
    if concurrency == 1:  # in order: point 0 reaches it, the three others never start
        assert out.stop_reason.startswith("stop_when.target: trial 0's val_loss 0.7 reached")
        assert [t.number for t in never] == [1, 2, 3] and len(trials) == 4
        assert out.counts.complete + out.counts.pruned == 4
    # (two at a time, how many points started before point 0 ended depends on timing)
    _, again = run(spec, sqlite_url, tmp_path)  # nothing left to end, nothing added
    assert [(t.number, t.state) for t in again] == [(t.number, t.state) for t in trials]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("end", ["user", "timeout", "timeout-not-final"])
def test_warm_start_points_never_asked_end_pruned_whatever_ends_the_study(
        end, sqlite_url, tmp_path):
    """helper-39: only ``stop_when`` ended the queued points; after a user's stop (or the
    timeout) they stayed WAITING in the ended study for good. ``hpo run`` (not ``final``)
    keeps them at its timeout: run again, it continues the study and asks them."""
    points = [{"params": {"quality": q}} for q in (0.5, 9.0, 9.5, 8.0)]
    spec = toy_spec(f"warm-{end}", warm_start=points, config={"sleep_ms": 150},
                    budget={"n_trials": 6, "max_concurrent_trials": 1,
                            **({"timeout_s": 2.0} if end != "user" else {})})
    started = time.monotonic()
    stop = (lambda: time.monotonic() - started > 2.0) if end == "user" else None
    out, trials = run(spec, sqlite_url, tmp_path, should_stop=stop,
                      final=end != "timeout-not-final")
    assert out.stopped == (end == "user")
    assert not [t.number for t in trials if t.state == TrialState.RUNNING]
    waiting = [t for t in trials if t.state == TrialState.WAITING]
    if end == "timeout-not-final":
        assert waiting, "every point ran before the timeout: lengthen sleep_ms"
        return
    assert waiting == []
    never = [t for t in trials if t.user_attrs.get("budget_updates") == 0]
    assert never, "the stop came after every point had run: lengthen sleep_ms"
    for t in never:
        assert (t.state, t.user_attrs["stopped_by"], t.intermediate_values) == (
            TrialState.PRUNED, end, {})
        k = int(t.user_attrs["warm_start"][len("points["):-1])
        assert t.params == points[k]["params"]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_stopped_studys_requeued_trial_ends_pruned_not_waiting(sqlite_url, tmp_path):
    """helper-39: a stop, then a ``kill -9`` of the service: the next driver requeued the
    dead driver's trial and, stopping, left the copy WAITING."""
    spec = toy_spec("stop-requeued", budget={"n_trials": 3, "max_concurrent_trials": 1})
    StudyRecord(spec, open_storage(sqlite_url)).ask("r-dead")  # a dead driver's trial
    out, trials = run(spec, sqlite_url, tmp_path, should_stop=lambda: True, final=True)
    assert out.stopped
    assert [(t.number, t.state, t.user_attrs.get("stopped_by")) for t in trials] == [
        (0, TrialState.FAIL, None), (1, TrialState.PRUNED, "user")]
    assert trials[1].user_attrs["requeued_from"] == 0
