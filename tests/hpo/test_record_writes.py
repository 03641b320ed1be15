"""Cheap evaluations (issue 18.5): results written behind Tune's event loop, in order, and
checkpoints only where a scheduler or a retry can use them."""

from __future__ import annotations

import threading

import optuna
import pytest
from optuna.trial import TrialState

from hpo.record import StudyRecord
from hpo.recordwriter import RecordWriter
from hpo.storage import open_storage
from hpo.tune.trainable import CheckpointPolicy, checkpoint_policy
from tests.hpo.test_record import _result, _spec, _trial

# one trial's result writes, in the order Tune delivers them: a checkpoint's location is
# recorded after the result it belongs to
EVENTS = [("result", 10, 0.9), ("result", 20, 0.5), ("checkpoint", 20, None),
          ("result", 30, 0.7), ("result", 40, 0.6), ("checkpoint", 40, None)]


class GatedStorage:
    """The storage, but only the first ``allowed`` value writes reach it; the next one
    waits for ``release`` (a driver killed at that point never does it)."""

    def __init__(self, inner, allowed: int) -> None:
        self.inner, self.allowed, self.done = inner, allowed, 0
        self.blocked, self.release = threading.Event(), threading.Event()

    def _gate(self) -> None:
        if self.done == self.allowed:
            self.blocked.set()
            self.release.wait()

    def set_trial_intermediate_value(self, trial_id, step, value):
        self._gate()
        self.inner.set_trial_intermediate_value(trial_id, step, value)
        self.done += 1


def _replay(record: StudyRecord, events) -> None:
    for kind, step, value in events:
        if kind == "result":
            record.result("r1", _result(step, value))
        else:
            record.checkpointed("r1", f"/ckpt/step-{step}")


@pytest.mark.parametrize("allowed", range(4))
def test_a_killed_driver_never_leaves_a_checkpoint_ahead_of_the_curve(db_url, unique_name,
                                                                      allowed):
    # the writer stops after `allowed` value writes, as at a kill -9: what is stored is
    # exactly those values, and the recorded checkpoint (what a new driver resumes from)
    # only if every value up to it is stored; the resumed trial reports the rest again
    storage = open_storage(db_url)
    record = StudyRecord(_spec(unique_name), storage)
    record.ask("r1")
    gated = GatedStorage(storage, allowed)
    record._writer = RecordWriter(gated)
    driver = threading.Thread(target=_replay, args=(record, EVENTS), daemon=True)
    driver.start()
    assert gated.blocked.wait(30)
    fresh = open_storage(db_url).get_trial(record.trials["r1"].trial_id)
    values = [(s, v) for kind, s, v in EVENTS if kind == "result"][:allowed]
    assert fresh.intermediate_values == dict(values)
    assert fresh.user_attrs.get("checkpoint") == ("/ckpt/step-20" if allowed >= 2 else None)
    gated.release.set()  # the rest, then the end of the trial
    driver.join(30)
    assert record.complete_or_prune("r1", "asha") == TrialState.COMPLETE
    t = _trial(record, "r1")
    assert t.intermediate_values == {10: 0.9, 20: 0.5, 30: 0.7, 40: 0.6}
    assert t.user_attrs["checkpoint"] == "/ckpt/step-40" and t.value == 0.6


def test_a_trial_resumed_from_an_older_checkpoint_continues_its_curve(db_url, unique_name):
    # it reported up to step 40, its newest checkpoint was at 20 (checkpoint_interval_s):
    # a new driver adopts it, and it reports 20 (its checkpoint's evaluation), 30 and 40
    # again: overwritten in place, no gap, no duplicate, and only changed values written
    storage = open_storage(db_url)
    first = StudyRecord(_spec(unique_name), storage)
    first.ask("r1")
    _replay(first, EVENTS[:5])
    first.flush()  # the driver is killed here, its writes done
    second = StudyRecord(_spec(unique_name), storage)
    (orphan,) = second.orphans()
    assert orphan.checkpoint == "/ckpt/step-20"
    second.adopt("r2", orphan)
    writes = []
    real = second.writes.intermediate_value
    second.writes.intermediate_value = lambda *a: (writes.append(a[1:]), real(*a))
    for step, value in [(20, 0.5), (30, 0.65), (40, 0.55), (50, 0.4)]:
        second.result("r2", _result(step, value, planned=50))
    assert writes == [(30, 0.65), (40, 0.55), (50, 0.4)]  # 20 came again unchanged
    assert second.trials["r2"].values == [(10, 0.9), (20, 0.5), (30, 0.65), (40, 0.55),
                                          (50, 0.4)]
    assert second.complete_or_prune("r2", "asha") == TrialState.COMPLETE
    t = _trial(second, "r2")
    assert t.intermediate_values == {10: 0.9, 20: 0.5, 30: 0.65, 40: 0.55, 50: 0.4}
    assert t.value == 0.4 and t.user_attrs["resumed_after_driver_loss"] == 1


def test_an_optuna_pruner_reads_every_result_written(sqlite_url, unique_name):
    record = StudyRecord(_spec(unique_name), open_storage(sqlite_url))
    record.ask("r1")
    for step in range(1, 30):
        record.result("r1", _result(step, 1.0 / step))
        assert record.frozen("r1").intermediate_values[step] == 1.0 / step


def test_a_value_that_cannot_be_stored_fails_its_trial_only(db_url, unique_name):
    # a write that still fails after its retries breaks that trial's stream: nothing of it
    # is stored past the gap (its checkpoint location stays before it), and it ends FAIL
    # saying why; the other trial is untouched
    storage = open_storage(db_url)
    record = StudyRecord(_spec(unique_name), storage)
    record.ask("r1")
    record.ask("r2")
    broken = record.trials["r1"].trial_id

    class FailsForR1:
        def set_trial_intermediate_value(self, trial_id, step, value):
            if trial_id == broken and step == 20:
                raise optuna.exceptions.StorageInternalError("the database went away")
            storage.set_trial_intermediate_value(trial_id, step, value)

    record._writer = RecordWriter(FailsForR1(), retry_waits_s=(0.0, 0.0))
    for step, value in [(10, 0.9), (20, 0.5), (30, 0.7), (40, 0.6)]:
        record.result("r1", _result(step, value))
        record.result("r2", _result(step, value + 1))
        record.checkpointed("r1", f"/ckpt/r1-{step}")
        record.checkpointed("r2", f"/ckpt/r2-{step}")
    assert record.complete_or_prune("r2", "asha") == TrialState.COMPLETE
    assert record.complete_or_prune("r1", "asha") == TrialState.FAIL
    r1, r2 = _trial(record, "r1"), _trial(record, "r2")
    assert r1.intermediate_values == {10: 0.9}
    assert r1.user_attrs["checkpoint"] == "/ckpt/r1-10"
    assert r1.user_attrs["fail_reason"] == ("its results could not all be stored: "
                                            "the database went away")
    assert r2.intermediate_values == {10: 1.9, 20: 1.5, 30: 1.7, 40: 1.6} and r2.value == 1.6
    assert r2.user_attrs["checkpoint"] == "/ckpt/r2-40"


def test_a_transient_write_error_is_tried_again(sqlite_url, unique_name):
    storage = open_storage(sqlite_url)
    record = StudyRecord(_spec(unique_name), storage)
    record.ask("r1")
    calls = []

    class FailsTwice:
        def set_trial_intermediate_value(self, *args):
            calls.append(args)
            if len(calls) <= 2:
                raise optuna.exceptions.StorageInternalError("database is locked")
            storage.set_trial_intermediate_value(*args)

    record._writer = RecordWriter(FailsTwice(), retry_waits_s=(0.0, 0.0, 0.0))
    record.result("r1", _result(40, 0.5))
    assert record.complete_or_prune("r1", "fifo") == TrialState.COMPLETE
    assert len(calls) == 3 and _trial(record, "r1").intermediate_values == {40: 0.5}


def test_a_trial_resumed_further_back_and_stopped_sooner_keeps_no_later_values(
        db_url, unique_name):
    # reported to 40 with its checkpoint at 10, resumed, and pruned at 20: the stored
    # curve ends at 20, and what a pruner reads at 20 has no step after it
    storage = open_storage(db_url)
    first = StudyRecord(_spec(unique_name), storage)
    first.ask("r1")
    for step, value in [(10, 0.9), (20, 0.5), (30, 0.7), (40, 0.6)]:
        first.result("r1", _result(step, value))
        if step == 10:
            first.checkpointed("r1", "/ckpt/step-10")
    first.flush()
    second = StudyRecord(_spec(unique_name), storage)
    (orphan,) = second.orphans()
    second.adopt("r2", orphan)
    second.result("r2", _result(10, 0.9))  # its checkpoint's evaluation, again
    assert second.frozen("r2").intermediate_values == {10: 0.9}
    second.result("r2", _result(20, 0.55))
    assert second.frozen("r2").intermediate_values == {10: 0.9, 20: 0.55}
    second.note_stop("r2", "asha")
    assert second.complete_or_prune("r2", "asha") == TrialState.PRUNED
    t = _trial(second, "r2")
    assert t.intermediate_values == {10: 0.9, 20: 0.55} and t.value == 0.55
    assert t.user_attrs["budget_updates"] == 20


def test_a_full_queue_makes_the_event_loop_wait():
    gated = GatedStorage(None, 0)
    writer = RecordWriter(gated, max_queued=1)
    writer.intermediate_value(1, 1, 0.1)  # taken by the thread, which waits at the gate
    assert gated.blocked.wait(10)
    writer.intermediate_value(1, 2, 0.2)  # fills the queue
    third = threading.Thread(target=writer.intermediate_value, args=(1, 3, 0.3))
    third.start()
    third.join(0.5)
    assert third.is_alive()  # waits for room
    gated.allowed = 10**9
    gated.inner = type("Sink", (), {"set_trial_intermediate_value": lambda *a: None})()
    gated.release.set()
    third.join(10)
    writer.close()
    assert not third.is_alive() and gated.done == 3


def test_the_checkpoint_policy_decides_from_its_clock_the_last_report_and_max_t():
    now = [100.0]
    policy = CheckpointPolicy(interval_s=2.0, from_step=40, clock=lambda: now[0])
    decisions = []
    for step, t, last in [(10, 100.5, False), (20, 101.9, False), (30, 102.0, False),
                          (35, 102.5, False), (38, 103.0, True), (40, 103.1, False),
                          (45, 103.2, False)]:
        now[0] = t
        wanted = policy.wants(step, last)
        decisions.append(wanted)
        if wanted:
            policy.taken()
    # 30: 2 s since the start; 38: the run's last report; 40 and 45: from max_t on
    assert decisions == [False, False, True, False, True, True, True]
    assert CheckpointPolicy(0.0).wants(1, False)  # 0: every report


@pytest.mark.parametrize(("scheduler", "expected"), [
    ({"name": "fifo"}, (7.5, None)),
    ({"name": "asha", "grace_period": 3, "max_t": 9}, (7.5, 9)),
    ({"name": "pbt", "perturbation_interval": 10}, (0.0, None)),
    ({"name": "median", "grace_period": 3}, (7.5, None)),
    ({"name": "median", "grace_period": 3, "hard_stop": False}, (0.0, None)),
    ({"name": "hyperband", "max_t": 12}, (0.0, 12)),
    ({"name": "optuna-pruner", "pruner": {"name": "median"}}, (7.5, None)),
], ids=lambda v: v.get("name") + ("-soft" if v.get("hard_stop") is False else "")
    if isinstance(v, dict) else "")
def test_schedulers_that_resume_trials_get_a_checkpoint_at_every_report(scheduler, expected):
    spec = _spec("policy", scheduler=scheduler, checkpoint_interval_s=7.5)
    got = checkpoint_policy(spec)
    assert (got["checkpoint_interval_s"], got["checkpoint_from_step"]) == expected
