"""A new driver's ASHA and median stopping rule rank against what earlier drivers recorded
(the breaker's finding for mo-asha, which Ray's schedulers shared: they keep their state
in the driver's memory, so after a restart the first trial at each rung went on)."""

from __future__ import annotations

import math

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.experiment import Trial
from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule, TrialScheduler

from hpo.ray_private import asha_bracket_of, asha_rungs, median_results, median_stopped
from hpo.tune.restore import (
    rekey_asha,
    restore_asha,
    restore_median,
    restored_key,
    stored_curves,
    stored_rungs,
)

# reports (step, val_loss) per trial, in the order they arrive; rungs at 1, 2, 4 (grace 1,
# reduction factor 2), max_t 6: steps skip rungs, a trial ends at max_t, one has a NaN
CURVES = {
    0: [(1, 5.0), (2, 4.0), (3, 3.5), (4, 3.0), (6, 2.0)],
    1: [(1, 6.0), (2, 5.5)],
    2: [(1, 4.0), (3, 3.0), (5, 2.5), (6, 2.4)],
    3: [(2, 7.0)],
    4: [(1, math.nan), (4, 1.0), (6, 0.5)],
    5: [(6, 9.0)],  # its only report at max_t: recorded at its end, at the highest rung
    6: [(1, 3.0), (2, 8.0)],  # stopped at 2: its end records that report at 1 too
}


def run_restarted_after_trial_0(spec, url: str, results_dir) -> list:
    """Run ``spec``'s study, interrupted (as a killed driver leaves it) once trial 0 has
    completed, then run it again to its end; its trials as stored."""
    from hpo.storage import open_storage
    from hpo.tune.driver import run_study

    storage = open_storage(url)

    def once_trial_0_completed() -> bool:  # the driver is "killed" as trial 1 starts
        study_id = storage.get_study_id_from_name(spec.name)
        return any(t.number == 0 and t.state == TrialState.COMPLETE
                   for t in storage.get_all_trials(study_id, deepcopy=False))

    assert run_study(spec, url, results_dir=results_dir,
                     should_interrupt=once_trial_0_completed).interrupted
    run_study(spec, url, results_dir=results_dir)
    return optuna.load_study(study_name=spec.name, storage=url).get_trials()


class _Record:
    """A study record that knows every trial, each the adoption of Optuna trial ``number``
    (its ASHA bracket ``bracket``: ``None``, none kept yet)."""

    def __init__(self, number: int, bracket: int | None = None) -> None:
        self.number, self.bracket = number, bracket
        self.median_stops: list[int | None] = []

    def median_stopped(self, trial_id, step):
        self.median_stops.append(step)

    def asha_bracket(self, trial_id, drawn):
        if self.bracket is None:
            self.bracket = drawn
        return self.bracket

    def knows(self, trial_id):
        return True

    def rung_key(self, trial_id):
        return self.number

    def result(self, trial_id, result):
        pass

    def decided(self, trial_id, decision, by):
        pass


def _asha(brackets: int = 1) -> AsyncHyperBandScheduler:
    asha = AsyncHyperBandScheduler(time_attr="step", max_t=6, grace_period=1,
                                   reduction_factor=2, brackets=brackets)
    asha.set_search_properties("val_loss", "min")
    return asha


def _uninterrupted(brackets: int = 1) -> tuple[AsyncHyperBandScheduler, dict[int, list]]:
    """Ray's own ASHA fed every report (interleaved), as one driver: the reports it let
    through, per trial, are what the study stores as intermediate values."""
    asha, stored = _asha(brackets), {n: [] for n in CURVES}
    trials = {n: Trial("toy", stub=True, trial_id=f"t{n}") for n in CURVES}
    for trial in trials.values():
        trial.set_status(Trial.RUNNING)
        asha.on_trial_add(None, trial)
    pending = {n: list(c) for n, c in CURVES.items()}
    while any(pending.values()):
        for n in CURVES:
            if not pending[n]:
                continue
            step, value = pending[n].pop(0)
            result = {"step": step, "val_loss": value}
            stored[n].append((step, value))
            if asha.on_trial_result(None, trials[n], result) == TrialScheduler.STOP:
                pending[n] = []
            if not pending[n]:
                asha.on_trial_complete(None, trials[n], result)
    return asha, stored


def test_the_restored_rungs_equal_those_of_the_uninterrupted_scheduler():
    asha, stored = _uninterrupted()
    restored = _asha()
    n = restore_asha(restored, 6, [(k, dict(v), True) for k, v in stored.items()], -1.0)
    expected = [(m, {restored_key(int(t[1:])): v for t, v in rec.items()})
                for m, rec in asha_rungs(asha)]
    got = asha_rungs(restored)
    assert [m for m, _ in got] == [m for m, _ in expected] == [4, 2, 1]
    for (_, g), (_, e) in zip(got, expected, strict=True):
        assert g.keys() == e.keys()
        assert all(g[k] == e[k] or (math.isnan(g[k]) and math.isnan(e[k])) for k in g)
    assert n == sum(len(rec) for _, rec in expected) and n > 0
    # and a new trial meets the same cutoff in both
    late = Trial("toy", stub=True, trial_id="late")
    late.set_status(Trial.RUNNING)
    for scheduler in (asha, restored):
        scheduler.on_trial_add(None, late)
    decisions = [s.on_trial_result(None, late, {"step": 2, "val_loss": 5.0})
                 for s in (asha, restored)]
    assert decisions[0] == decisions[1]


def test_a_trial_still_running_is_not_recorded_as_ended():
    """An orphan (RUNNING: its driver is gone) gets no end-of-trial record: the driver
    that resumes it makes that one."""
    restored = _asha()
    restore_asha(restored, 6, [(3, {2: 7.0}, False)], -1.0)
    assert [dict(rec) for _, rec in asha_rungs(restored)] == [
        {}, {restored_key(3): -7.0}, {}]


class _Controller:
    """What the median rule asks of Tune while it has too few samples: no trial waits."""

    def get_live_trials(self):
        return []


def _median(**changes) -> MedianStoppingRule:
    rule = MedianStoppingRule(time_attr="step", **{"grace_period": 1,
                                                    "min_samples_required": 2, **changes})
    rule.set_search_properties("val_loss", "min")
    return rule


def _one_after_another(rule: MedianStoppingRule) -> tuple[dict, dict]:
    """CURVES fed to ``rule`` a trial after another, as one driver at concurrency 1 (a
    trial stopped with ``hard_stop`` ends; without, it runs on, FIFO): the values stored
    per trial, and the step each was stopped at."""
    stored, stops = {}, {}
    for n, curve in CURVES.items():
        trial = Trial("toy", stub=True, trial_id=f"t{n}")
        trial.set_status(Trial.RUNNING)
        rule.on_trial_add(None, trial)
        stored[n] = {}
        for step, value in curve:
            result = {"step": step, "val_loss": value}
            stored[n][step] = value
            before = trial in median_stopped(rule)
            decision = rule.on_trial_result(_Controller(), trial, result)
            if not before and trial in median_stopped(rule):
                stops[n] = step
            if decision == TrialScheduler.STOP:
                break
        rule.on_trial_complete(None, trial, result)
    return stored, stops


def _late_trials_meet_the_same_decisions(rule, restored, reports) -> None:
    for k, report in enumerate(reports):
        late = Trial("toy", stub=True, trial_id=f"late{k}")  # a new trial, one report each
        late.set_status(Trial.RUNNING)
        decisions = {s.on_trial_result(_Controller(), late, dict(report))
                     for s in (rule, restored)}
        assert len(decisions) == 1, report


def test_the_restored_median_rule_has_the_results_and_decisions_of_the_uninterrupted_one():
    rule = _median()
    stored, _ = _one_after_another(rule)
    restored = _median()
    assert restore_median(restored, "step", "val_loss",
                          [(n, v, True) for n, v in stored.items()]) == len(CURVES)
    original = median_results(rule)
    assert {restored_key(int(t.trial_id[1:])): v for t, v in original.items()}.keys() == \
        median_results(restored).keys()
    for t, results in original.items():
        got = median_results(restored)[restored_key(int(t.trial_id[1:]))]
        assert [(r["step"], r["val_loss"]) for r in got] == [
            (r["step"], r["val_loss"]) for r in results]
    _late_trials_meet_the_same_decisions(rule, restored, (
        {"step": 1, "val_loss": 5.5}, {"step": 2, "val_loss": 5.0},
        {"step": 4, "val_loss": 2.0}, {"step": 4, "val_loss": 9.0}))


def test_without_hard_stop_the_restored_rule_holds_only_what_it_judged_and_whom_it_stopped():
    """``hard_stop: false``: a stopped trial is paused, runs on later unjudged, and Ray
    leaves its later reports out of the means; a new driver's rule started empty. Now it
    is refilled up to each stopped trial's ``median_stopped_at`` step, and a resumed
    stopped trial stays unjudged."""
    from hpo.tune.schedulers import RecordingScheduler

    rule = _median(min_samples_required=1, hard_stop=False)
    stored, stops = _one_after_another(rule)
    assert stops and any(max(stored[n]) > at for n, at in stops.items())  # ran on after
    restored = _median(min_samples_required=1, hard_stop=False)
    restore_median(restored, "step", "val_loss", [(n, v, True) for n, v in stored.items()],
                   stops)
    for t, results in median_results(rule).items():
        got = median_results(restored)[restored_key(int(t.trial_id[1:]))]
        assert [(r["step"], r["val_loss"]) for r in got] == [
            (r["step"], r["val_loss"]) for r in results]
    assert median_stopped(restored) == {restored_key(n) for n in stops}
    _late_trials_meet_the_same_decisions(rule, restored, (
        {"step": 1, "val_loss": 5.5}, {"step": 2, "val_loss": 5.0},
        {"step": 4, "val_loss": 2.0}, {"step": 6, "val_loss": 9.0}))
    # a stopped trial a new driver resumes: unjudged, its reports left out, as before
    stopped_n = next(iter(stops))
    restored = _median(min_samples_required=1, hard_stop=False)
    curve = {s: v for s, v in stored[stopped_n].items() if s <= stops[stopped_n]}
    restore_median(restored, "step", "val_loss", [(stopped_n, curve, False)], stops)
    record = _Record(stopped_n)
    scheduler = RecordingScheduler(restored, record, "median", removal_stops=True)
    resumed = Trial("toy", stub=True, trial_id="resumed")
    resumed.set_status(Trial.RUNNING)
    scheduler.on_trial_add(None, resumed)
    assert median_stopped(restored) == {resumed}
    assert scheduler.on_trial_result(_Controller(), resumed, {
        "step": stops[stopped_n], "val_loss": 99.0}) == TrialScheduler.CONTINUE
    assert [r["step"] for r in median_results(restored)[resumed]] == sorted(curve)
    assert record.median_stops == []
    # resumed from before its stop: judged again, and the stop kept is cleared (the review:
    # else a third driver took the stale stop back)
    restored = _median(min_samples_required=1, hard_stop=False)
    restore_median(restored, "step", "val_loss", [(9, {1: 5.0, 2: 4.0}, False)], {9: 4})
    record = _Record(9)
    scheduler = RecordingScheduler(restored, record, "median", removal_stops=True)
    again = Trial("toy", stub=True, trial_id="again")
    again.set_status(Trial.RUNNING)
    scheduler.on_trial_add(None, again)
    assert median_stopped(restored) == set() and record.median_stops == [None]


@pytest.mark.parametrize("brackets", [2, 3])
def test_several_brackets_are_restored_each_trial_in_the_bracket_it_was_drawn_into(brackets):
    """Before, an ASHA with several brackets started empty after a restart: which bracket a
    trial was in (Ray's random draw) was kept nowhere. Now it is (``asha_bracket``), and
    each bracket is refilled with its own trials' values."""
    np.random.seed(4)  # Ray draws a trial's bracket with numpy's global generator
    asha, stored = _uninterrupted(brackets)
    drawn = {}
    for bracket in range(brackets):
        for _, recorded in asha_rungs(asha, bracket):
            for t in recorded:
                drawn[int(t[1:])] = bracket
    assert set(drawn.values()) == set(range(brackets))  # the seed fills every bracket
    restored = _asha(brackets)
    # a trial stored before brackets were kept, or with a bracket the scheduler lacks,
    # is left out
    curves = [(k, dict(v), True) for k, v in stored.items()] + [
        (90, {1: 0.0}, True), (91, {1: 0.0}, True)]
    n = restore_asha(restored, 6, curves, -1.0, {**drawn, 91: brackets})
    for bracket in range(brackets):
        got = asha_rungs(restored, bracket)
        expected = asha_rungs(asha, bracket)
        assert [m for m, _ in got] == [m for m, _ in expected]
        for (_, g), (_, e) in zip(got, expected, strict=True):
            assert g.keys() == {restored_key(int(t[1:])) for t in e}
            assert all(g[restored_key(int(t[1:]))] == v or math.isnan(v) for t, v in e.items())
    assert n == sum(len(rec) for b in range(brackets) for _, rec in asha_rungs(asha, b))
    with pytest.raises(IndexError, match=f"bracket {brackets}: the scheduler has {brackets}"):
        asha_rungs(restored, brackets)


def test_a_resumed_trial_goes_on_in_its_own_bracket_and_a_new_one_keeps_its_draw():
    """A trial a new driver resumes is put back in the bracket its values were restored to
    (Ray draws again at random); a new trial's draw is kept for the next driver."""
    from hpo.tune.schedulers import RecordingScheduler

    for kept in (0, 1):
        for seed in (0, 4):  # Ray's first draw: bracket 0, then 1
            np.random.seed(seed)
            inner = _asha(2)  # rungs 4, 2, 1 and 4, 2
            restore_asha(inner, 6, [(7, {2: 3.0}, False), (8, {2: 1.0}, False)], -1.0,
                         {7: kept, 8: kept})
            scheduler = RecordingScheduler(inner, _Record(7, kept), "asha",
                                           removal_stops=True)
            trial = Trial("toy", stub=True, trial_id="resumed")
            trial.set_status(Trial.RUNNING)
            scheduler.on_trial_add(None, trial)
            assert asha_bracket_of(inner, "resumed") == kept
            assert asha_rungs(inner, kept)[1][1] == {"resumed": -3.0, restored_key(8): -1.0}
            # its report at 2 again: recorded there already, not judged again
            assert scheduler.on_trial_result(None, trial, {"step": 2, "val_loss": 3.0}) == \
                TrialScheduler.CONTINUE
    fresh = _Record(9)
    scheduler = RecordingScheduler(_asha(2), fresh, "asha", removal_stops=True)
    new = Trial("toy", stub=True, trial_id="new")
    new.set_status(Trial.RUNNING)
    scheduler.on_trial_add(None, new)
    assert fresh.bracket == asha_bracket_of(scheduler.inner, "new") in (0, 1)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
@pytest.mark.parametrize("scheduler", [
    {"name": "asha", "grace_period": 3, "reduction_factor": 2},
    {"name": "asha", "grace_period": 3, "reduction_factor": 2, "brackets": 2},
    {"name": "median", "grace_period": 3, "min_samples_required": 1},
    {"name": "median", "grace_period": 3, "min_samples_required": 1, "hard_stop": False}],
    ids=["asha", "asha-brackets", "median", "median-no-hard-stop"])
def test_a_restarted_driver_stops_what_the_uninterrupted_one_stops(scheduler, sqlite_url,
                                                                    tmp_path):
    from tests.hpo.test_driver import toy_spec

    # one trial at a time, val_loss = quality + 1/(k + 1) after k evaluations (every 3
    # updates); ASHA's rungs at 3 and 6 of 12, the median rule from 3. Uninterrupted:
    # quality 6 meets quality 5's 5.5 at 3 updates (6.5 is worse: stopped), quality 4
    # beats it (on to the end). With 2 brackets (rungs 3, 6, 12 and 6, 12, drawn at
    # random), quality 6 meets quality 5 where they share a bracket: stopped at its
    # first rung; alone in the other, it goes on.
    points = [{"params": {"quality": q}} for q in (5.0, 6.0, 4.0)]
    name = f"{scheduler['name']}-{len(scheduler)}-restart"
    spec = toy_spec(name, warm_start=points, config={"sleep_ms": 40}, scheduler=scheduler,
                    budget={"n_trials": 3, "max_concurrent_trials": 1})
    np.random.seed(0)  # Ray's draw of the brackets (numpy's global generator)
    trials = run_restarted_after_trial_0(spec, sqlite_url, tmp_path / "ray")
    ran = {t.params["quality"]: t for t in trials if t.state != TrialState.FAIL}
    stopped_at = 3
    if "brackets" in scheduler:  # each trial's draw, kept by the record
        drawn = {q: t.user_attrs["asha_bracket"] for q, t in ran.items()}
        assert set(drawn.values()) <= {0, 1}
        shared = drawn[6.0] == drawn[5.0]
        stopped_at = 3 if drawn[6.0] == 0 else 6
        assert shared  # (numpy's seed: the case a restart without the kept draws fails)
    if scheduler.get("hard_stop") is False:  # paused at 3 for good, run on unjudged later
        assert {q: (t.state, t.user_attrs.get("median_stopped_at")) for q, t in ran.items()
                } == {5.0: (TrialState.COMPLETE, None), 6.0: (TrialState.COMPLETE, 3),
                      4.0: (TrialState.COMPLETE, None)}
        return
    assert {q: t.state for q, t in ran.items()} == {
        5.0: TrialState.COMPLETE, 6.0: TrialState.PRUNED, 4.0: TrialState.COMPLETE}
    assert (ran[6.0].user_attrs["stopped_by"], ran[6.0].user_attrs["budget_updates"]) == (
        scheduler["name"], stopped_at)


def test_a_trial_a_new_driver_resumes_keeps_its_rung_values_under_its_new_id():
    """Resumed from its checkpoint by a new Tune trial (a new id), a trial recorded at a
    rung by the old driver is not judged there again (it could be stopped at a rung it
    had passed, against values that came after it)."""
    from hpo.tune.schedulers import RecordingScheduler

    inner = _asha()
    restore_asha(inner, 6, [(7, {1: 3.0}, False), (8, {1: 1.0}, True), (9, {1: 2.0}, True)],
                 -1.0)
    scheduler = RecordingScheduler(inner, _Record(7), "asha", removal_stops=True)
    trial = Trial("toy", stub=True, trial_id="resumed")
    trial.set_status(Trial.RUNNING)
    scheduler.on_trial_add(None, trial)
    assert asha_rungs(inner)[-1][1] == {"resumed": -3.0, restored_key(8): -1.0,
                                         restored_key(9): -2.0}
    # its report at 1 again (after its checkpoint): recorded already, not judged again
    assert scheduler.on_trial_result(None, trial, {"step": 1, "val_loss": 3.0}) == \
        TrialScheduler.CONTINUE


def test_a_trial_the_whole_runs_stop_ended_is_not_replayed_as_ended(sqlite_url):
    """The breaker: a timeout (or the user's stop) ends running trials through Tune's
    clean-up, which never calls the scheduler's on_trial_complete; replayed as ended, the
    trial's last report also went into a lower rung Ray had left empty."""
    from hpo.record import StudyRecord
    from hpo.storage import open_storage
    from tests.hpo.test_driver import toy_spec

    record = StudyRecord(toy_spec("ended-how"), open_storage(sqlite_url))
    study = record.study
    ends = [(TrialState.COMPLETE, None), (TrialState.PRUNED, "asha"),
            (TrialState.PRUNED, "timeout"), (TrialState.PRUNED, "user"),
            (TrialState.FAIL, None), (TrialState.RUNNING, None)]
    for state, stopped_by in ends:
        trial = study.ask({"quality": optuna.distributions.FloatDistribution(0, 10)})
        trial.report(1.0, 1)
        if stopped_by:
            trial.set_user_attr("stopped_by", stopped_by)
        if state == TrialState.COMPLETE:
            study.tell(trial, 1.0)
        elif state != TrialState.RUNNING:
            study.tell(trial, state=state)
    # (the RUNNING one, without a checkpoint, is left out: it will run again)
    assert [ended for _, _, ended in stored_curves(record)] == [
        True, True, False, False, False]
    asha = _asha()
    restore_asha(asha, 6, [(n, {4: 2.0}, ended) for n, _, ended in stored_curves(record)],
                 -1.0)
    assert [len(rec) for _, rec in asha_rungs(asha)] == [5, 2, 0]  # rungs 4, 2, 1


def test_requeued_trials_are_left_out_and_resumed_ones_cut_at_their_checkpoint(
        sqlite_url, tmp_path):
    """The second breaker's findings. A requeued trial's partial curve stayed in the
    rungs, so its copy was ranked against its own first run. A trial the new driver
    resumes from a checkpoint older than its last report was restored up to that report:
    re-reporting the later steps, Ray found their rungs taken and judged it at a lower,
    empty rung instead (stopped where the uninterrupted rule let it go on)."""
    import json

    from hpo.record import StudyRecord
    from hpo.storage import open_storage
    from tests.hpo.test_driver import toy_spec

    record = StudyRecord(toy_spec("orphans"), open_storage(sqlite_url))
    study, dist = record.study, {"quality": optuna.distributions.FloatDistribution(0, 10)}
    checkpoint = tmp_path / "checkpoint_000000"
    checkpoint.mkdir()
    (checkpoint / "meta.json").write_text(json.dumps({"step": 6}))
    curves = {}
    for name, attrs in [("requeued", {"requeued": True}), ("resumed", {"checkpoint":
                        str(checkpoint)}), ("unreadable", {"checkpoint": str(tmp_path)})]:
        trial = study.ask(dist)
        for step in (3, 6, 9):
            trial.report(1.0 + step, step)
        for key, value in {**attrs, "mo_rungs": [[3.0, [1.0, 2.0]], [9.0, [3.0, 4.0], "stopped"],
                                                  [9.0, [5.0], "what"], [1.0]]}.items():
            trial.set_user_attr(key, value)
        if name == "requeued":
            study.tell(trial, state=TrialState.FAIL)
        curves[name] = trial.number
    stored = {number: (curve, ended) for number, curve, ended in stored_curves(record)}
    assert stored == {curves["resumed"]: ({3: 4.0, 6: 7.0}, False)}
    # mo-asha's vectors: the requeued trial's left out; the resumed one's all kept (it is
    # judged once per rung, so its reports again past the checkpoint are let on), a stop
    # kept as such, malformed entries left out
    assert sorted(stored_rungs(record)) == sorted(
        (n, m, v, went_on) for n in (curves["resumed"], curves["unreadable"])
        for m, v, went_on in ((3.0, [1.0, 2.0], True), (9.0, [3.0, 4.0], False)))


def test_a_trial_resumed_from_an_older_checkpoint_is_judged_as_the_first_time():
    """Rungs 1, 2, 4, 8; reports every 3 updates. Uninterrupted, trial 1's report at 9 is
    judged at rung 8 (its first reach of it). Resumed from its checkpoint at 6, it reports
    9 again: with the restored entries cut at 6, Ray judges it at rung 8 again."""
    from hpo.tune.schedulers import RecordingScheduler

    def asha():
        scheduler = AsyncHyperBandScheduler(time_attr="step", max_t=12, grace_period=1,
                                            reduction_factor=2)
        scheduler.set_search_properties("val_loss", "min")
        return scheduler

    t0, t1 = ({3: 1.5, 6: 1.33, 9: 1.25, 12: 1.2}, {3: 1.5, 6: 1.33, 9: 1.25})
    whole = asha()
    trials = [Trial("toy", stub=True, trial_id=f"t{k}") for k in (0, 1)]
    for trial, curve in zip(trials, (t0, t1), strict=True):
        trial.set_status(Trial.RUNNING)
        whole.on_trial_add(None, trial)
        for step, value in curve.items():
            decision = whole.on_trial_result(None, trial, {"step": step, "val_loss": value})
        if trial is trials[0]:
            whole.on_trial_complete(None, trial, {"step": 12, "val_loss": 1.2})
    assert decision == TrialScheduler.CONTINUE  # t1 at 9, uninterrupted

    inner = asha()
    restore_asha(inner, 12, [(0, t0, True), (1, {3: 1.5, 6: 1.33}, False)], -1.0)
    resumed = RecordingScheduler(inner, _Record(1), "asha", removal_stops=True)
    trial = Trial("toy", stub=True, trial_id="resumed")
    trial.set_status(Trial.RUNNING)
    resumed.on_trial_add(None, trial)
    assert resumed.on_trial_result(None, trial, {"step": 9, "val_loss": 1.25}) == decision
    assert [sorted(r.values()) for _, r in asha_rungs(inner)] == [
        sorted(r.values()) for _, r in asha_rungs(whole)]
    # restored up to its last report instead (before): judged at the empty rung 1, stopped
    uncut = asha()
    restore_asha(uncut, 12, [(0, t0, True), (1, t1, False)], -1.0)
    uncut.on_trial_add(None, trial)
    rekey_asha(uncut, restored_key(1), "resumed")
    assert uncut.on_trial_result(None, trial, {"step": 9, "val_loss": 1.25}) == \
        TrialScheduler.STOP


@pytest.mark.parametrize("checkpoint_at", [3, 2], ids=["at-its-last-step", "before-it"])
def test_a_resumed_trial_holds_its_results_in_the_median_rule_as_one_driver_does(
        checkpoint_at):
    """A trial resumed with nothing left to train (its checkpoint at its last evaluation)
    reports that evaluation again (``trainers.loop``); with the restored copy the median
    rule held it three times with the trial's end, where one driver holds it twice (the
    review's finding, reasoned in the eleventh session). Resumed before its last step,
    its restored results stay and the later reports follow them."""
    from hpo.tune.schedulers import RecordingScheduler

    curve = {1: 3.0, 2: 2.5, 3: 2.25}
    whole, trial = _median(), Trial("toy", stub=True, trial_id="t0")
    trial.set_status(Trial.RUNNING)
    whole.on_trial_add(None, trial)
    for step, value in curve.items():
        whole.on_trial_result(_Controller(), trial, {"step": step, "val_loss": value})
    whole.on_trial_complete(None, trial, {"step": 3, "val_loss": 2.25})

    inner = _median()
    restore_median(inner, "step", "val_loss",
                   [(0, {s: v for s, v in curve.items() if s <= checkpoint_at}, False)])
    scheduler = RecordingScheduler(inner, _Record(0), "median", removal_stops=True)
    resumed = Trial("toy", stub=True, trial_id="resumed")
    resumed.set_status(Trial.RUNNING)
    scheduler.on_trial_add(None, resumed)
    # its one report: step 3 again (nothing left to train) or for the first time
    scheduler.on_trial_result(_Controller(), resumed, {"step": 3, "val_loss": 2.25})
    scheduler.on_trial_complete(None, resumed, {"step": 3, "val_loss": 2.25})
    assert [(r["step"], r["val_loss"]) for r in median_results(inner)[resumed]] == [
        (r["step"], r["val_loss"]) for r in median_results(whole)[trial]] == [
        (1, 3.0), (2, 2.5), (3, 2.25), (3, 2.25)]
