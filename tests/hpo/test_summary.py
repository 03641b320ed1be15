"""The study summary follows the trials as Optuna's own API sees them (issue 13, point 5)."""

from __future__ import annotations

import itertools
import random
import threading

import optuna
import pytest
from optuna.trial import TrialState

from hpo.summary import StudySummary, SummaryTracker, TrialCounts, best_single

X = {"x": optuna.distributions.FloatDistribution(0, 1)}


def _bare(trial: optuna.trial.FrozenTrial) -> dict:
    """The trial's fields, without its intermediate values (a summary keeps none)."""
    return {**trial.__dict__, "intermediate_values": {}}


def test_the_summary_follows_a_trial_through_every_state_and_a_requeue():
    """Fed trial by trial, as the driver's record tells it: RUNNING, then COMPLETE,
    PRUNED, FAIL; a lost driver's trial ended FAIL ``requeued`` and its WAITING copy."""
    study = optuna.create_study(direction="maximize")
    writes: list[StudySummary] = []
    tracker = SummaryTracker(["maximize"], 2.0, optuna_study_id=7, write=writes.append,
                             min_interval_s=0)

    def told(trial) -> None:
        tracker.trial_changed(study.trials[trial.number])

    assert writes[-1].counts == TrialCounts() and writes[-1].optuna_study_id == 7
    a, b, c, d = (study.ask(X) for _ in range(4))
    for t in (a, b, c, d):
        told(t)
    assert writes[-1].counts == TrialCounts(running=4) and len(writes[-1].running_since) == 4
    a.set_user_attr("device_seconds", 3.0)
    study.tell(a, 0.25)
    told(a)
    study.tell(b, state=TrialState.PRUNED)
    told(b)
    study.tell(c, state=TrialState.FAIL)
    told(c)
    d.set_user_attr("requeued", True)
    study.tell(d, state=TrialState.FAIL)
    told(d)
    study.enqueue_trial({"x": 0.5})
    told(study.trials[-1])
    now = writes[-1]
    assert now.counts == TrialCounts(complete=1, pruned=1, failed=2, waiting=1, requeued=1)
    assert (now.counts.budget_used, now.running_since, now.best_numbers) == (3, (), [0])
    assert now.device_seconds() == 3.0
    n_writes = len(writes)
    told(d)  # the same trial again: nothing changed, nothing written
    assert len(writes) == n_writes
    e = study.ask(X)  # the WAITING copy runs, and beats the best
    told(e)
    study.tell(e, 0.75)
    told(e)
    assert writes[-1].best_numbers == [4] and writes[-1].best_trials()[0].value == 0.75
    assert writes[-1].counts == TrialCounts(complete=2, pruned=1, failed=2, requeued=1)


def _varied(storage, directions: list[str], n: int, constrained: bool) -> optuna.Study:
    """COMPLETE, PRUNED and FAIL trials with random values (inf where allowed)."""
    study = optuna.create_study(storage=storage, directions=directions)
    rng = random.Random(n)
    for i in range(n):
        state = [TrialState.COMPLETE] * 5 + [TrialState.PRUNED, TrialState.FAIL]
        values = [rng.random() for _ in directions]
        if i == 3:
            values[0] = float("-inf") if directions[0] == "minimize" else float("inf")
        study.add_trial(optuna.trial.create_trial(
            state=state[i % 7], values=values if state[i % 7] == TrialState.COMPLETE else None,
            params={"x": rng.random()}, distributions=X, user_attrs={"i": i},
            constraints={"c": rng.uniform(-1, 0.5)} if constrained else None))
    return study


@pytest.mark.parametrize(("directions", "constrained"), [
    (["minimize"], False), (["maximize"], True), (["minimize", "maximize"], False),
    (["maximize", "maximize", "minimize"], False), (["minimize", "minimize"], True)])
def test_best_trial_and_pareto_front_equal_optunas_read_or_fed(directions, constrained):
    """The same whether the tracker reads the study at once or is told trial by trial."""
    storage = optuna.storages.InMemoryStorage()
    study = _varied(storage, directions, 80, constrained)
    read = SummaryTracker.from_storage(storage, study.study_name, 1.0).summary()
    fed = SummaryTracker(directions, 1.0)
    for trial in study.trials:
        fed.trial_changed(trial)
    expected = [study.best_trial] if len(directions) == 1 else study.best_trials
    assert expected and (len(directions) == 1 or len(expected) < 40)
    for summary in (read, fed.summary()):
        assert [t.__dict__ for t in summary.best_trials()] == [_bare(t) for t in expected]
        assert summary.counts == TrialCounts(complete=58, pruned=11, failed=11)


@pytest.mark.parametrize("direction", ["minimize", "maximize"])
def test_of_equal_best_values_the_lowest_numbered_trial_is_best_whatever_the_order_told(
        direction):
    """Two trials that end on the same value (seen by the new-user walkthrough: the demo
    said #1, Optuna's in-memory ``best_trial`` says #0): the first, however they ended."""
    study = optuna.create_study(direction=direction)
    good = 0.25 if direction == "minimize" else 0.75
    for value in [0.5, good, 0.5, good, good]:
        study.add_trial(optuna.trial.create_trial(value=value))
    assert study.best_trial.number == 1
    for order in itertools.permutations(range(5)):
        tracker = SummaryTracker(study.directions, 1.0)
        for number in order:
            tracker.trial_changed(study.trials[number])
        assert tracker.summary().best_numbers == [1], order
    assert best_single(reversed(study.trials), direction == "maximize").number == 1
    assert best_single([], True) is None


def test_the_front_follows_new_trials():
    study = optuna.create_study(directions=["minimize", "minimize"])
    tracker = SummaryTracker(study.directions, 1.0)

    def add(values: list[float]) -> list[int]:
        study.add_trial(optuna.trial.create_trial(values=values))
        tracker.trial_changed(study.trials[-1])
        return tracker.summary().best_numbers

    assert add([2.0, 2.0]) == [0] and add([3.0, 1.0]) == [0, 1]
    assert add([1.0, 1.0]) == [2]  # dominates both
    assert add([1.0, 1.0]) == [2, 3]  # equal to a front trial: on the front too
    assert add([0.5, 3.0]) == [2, 3, 4] == [t.number for t in study.best_trials]


def test_the_summary_round_trips_through_json_with_infinities_and_datetimes():
    storage = optuna.storages.InMemoryStorage()
    study = _varied(storage, ["minimize"], 10, False)
    study.ask(X)
    summary = SummaryTracker.from_storage(storage, study.study_name, 0.5).summary()
    again = StudySummary.from_json(summary.to_json())
    assert again == summary and len(again.running_since) == 1
    assert again.best_trials()[0].value == float("-inf")
    assert [t.__dict__ for t in again.best_trials()] == [_bare(study.best_trial)]
    with pytest.raises(ValueError, match="not a study summary"):
        StudySummary.from_json('{"counts": {}}')


def test_writes_are_throttled_and_flushed_and_a_failed_write_is_tried_again():
    study = optuna.create_study()
    writes: list[StudySummary] = []
    fail = [True]

    def write(summary: StudySummary) -> None:
        if fail[0]:
            fail[0] = False
            raise OSError("database down")
        writes.append(summary)

    tracker = SummaryTracker(["minimize"], 1.0, write=write, min_interval_s=0)
    assert writes == []  # the first write failed, logged
    tracker.flush()
    assert [w.counts for w in writes] == [TrialCounts()]
    slow = SummaryTracker(["minimize"], 1.0, write=writes.append, min_interval_s=3600)
    assert len(writes) == 2  # the first write is at once
    for _ in range(3):
        study.ask(X)
        slow.trial_changed(study.trials[-1])
    assert len(writes) == 2  # within the interval: kept for later
    slow.flush()
    slow.flush()  # nothing new: no write
    assert [w.counts for w in writes[2:]] == [TrialCounts(running=3)]


def test_bad_arguments_are_refused_naming_them():
    with pytest.raises(ValueError, match="devices_held"):
        SummaryTracker(["minimize"], 0.0)
    with pytest.raises(ValueError, match="direction"):
        SummaryTracker(["down"], 1.0)


def test_a_change_inside_the_interval_is_written_when_the_interval_ends():
    study = optuna.create_study()
    writes: list[StudySummary] = []
    written = threading.Event()

    def write(summary: StudySummary) -> None:
        writes.append(summary)
        if summary.counts.running:
            written.set()

    tracker = SummaryTracker(["minimize"], 1.0, write=write, min_interval_s=0.2)
    study.ask(X)
    tracker.trial_changed(study.trials[-1])  # within 0.2 s of the first write
    assert written.wait(30)  # by the tracker's timer, with no further change or flush
    assert [w.counts for w in writes] == [TrialCounts(), TrialCounts(running=1)]
