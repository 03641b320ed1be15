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
from hpo.tune.driver import checkpoint_policy
from hpo.tune.trainable import CheckpointPolicy
from tests.hpo.test_record import _result, _spec, _trial

# one trial's result writes, in the order Tune delivers them: a checkpoint's location is
# recorded after the result it belongs to
EVENTS = [("result", 10, 0.9), ("result", 20, 0.5), ("checkpoint", 20, None),
          ("result", 30, 0.7), ("result", 40, 0.6), ("checkpoint", 40, None)]


class GatedStorage:
    """The storage, but only the first ``allowed`` result writes reach it; the next one
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

    def set_trial_user_attr(self, trial_id, key, value):
        self._gate()
        self.inner.set_trial_user_attr(trial_id, key, value)
        self.done += 1


def _replay(record: StudyRecord, events) -> None:
    for kind, step, value in events:
        if kind == "result":
            record.result("r1", _result(step, value))
        else:
            record.checkpointed("r1", f"/ckpt/step-{step}")


@pytest.mark.parametrize("allowed", range(len(EVENTS)))
def test_a_killed_driver_never_leaves_a_checkpoint_ahead_of_the_curve(db_url, unique_name,
                                                                      allowed):
    # the writer is stopped after `allowed` writes, as by a kill -9: what is stored is
    # exactly the first `allowed` writes, so the recorded checkpoint (what a new driver
    # resumes from) has every value up to its step stored, and the resumed trial
    # reports the steps after it again
    storage = open_storage(db_url)
    record = StudyRecord(_spec(unique_name), storage)
    record.ask("r1")
    gated = GatedStorage(storage, allowed)
    record._writer = RecordWriter(gated)
    _replay(record, EVENTS)
    assert gated.blocked.wait(30)
    fresh = open_storage(db_url).get_trial(record.trials["r1"].trial_id)
    written = EVENTS[:allowed]
    assert fresh.intermediate_values == {s: v for kind, s, v in written if kind == "result"}
    checkpoints = [s for kind, s, _ in written if kind == "checkpoint"]
    assert fresh.user_attrs.get("checkpoint") == (
        f"/ckpt/step-{checkpoints[-1]}" if checkpoints else None)
    gated.release.set()  # the rest, then the end of the trial
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


def test_a_failed_write_is_raised_at_the_next_flush_once(sqlite_url, unique_name):
    record = StudyRecord(_spec(unique_name), open_storage(sqlite_url))
    record.ask("r1")

    class Broken:
        def set_trial_intermediate_value(self, *args):
            raise optuna.exceptions.StorageInternalError("the database went away")

    record._writer = RecordWriter(Broken())
    record.result("r1", _result(10, 0.5))
    with pytest.raises(optuna.exceptions.StorageInternalError, match="went away"):
        record.flush()
    record.flush()  # raised once
    record.close()


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
