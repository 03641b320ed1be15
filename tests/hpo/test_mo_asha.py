"""MO-ASHA (issue 18.1): rung decisions against a hand computation, the spec, the record,
and one small study on a real Ray."""

from __future__ import annotations

import math
import warnings

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState
from ray.tune.experiment import Trial
from ray.tune.schedulers import TrialScheduler

from hpo.errors import SpecError
from hpo.pareto import nondomination_ranks
from hpo.record import StudyRecord
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.tune.mo_asha import MoRungs, MultiObjectiveASHA, crowding_distance
from hpo.tune.schedulers import RecordingScheduler, build_scheduler
from tests.hpo.test_schedulers import _Record

GO, STOP = TrialScheduler.CONTINUE, TrialScheduler.STOP

# Both objectives minimized. The points with a + b = 1 form the known front; (0.6, 0.6)
# and (1, 1) lie behind it. Rungs: grace_period 1, reduction_factor 2, max_t 8 -> 1, 2, 4.
# Hand computation, n = vectors at the rung (the new one included), keep = ceil(n / 2),
# ahead = recorded vectors in a better front + those of its front with a larger crowding
# distance (cd); the trial goes on iff ahead < keep.
HAND = [  # (trial, updates, (a, b), decision)
    # rung 1
    ("t0", 1, (0.5, 0.5), GO),  # n=1 keep=1: first at the rung
    ("t1", 1, (1.0, 1.0), STOP),  # n=2 keep=1: t0 dominates it, ahead=1
    ("t2", 1, (0.0, 1.0), GO),  # n=3 keep=2: front {t0, t2}, both cd inf, ahead=0
    ("t3", 1, (0.6, 0.6), STOP),  # n=4 keep=2: t0 dominates it, front 1; ahead=2 (t0, t2)
    # n=5 keep=3: front {t0, t2, t4}; cd t0=t2=inf, t4 = .5/.5 + .5/.5 = 2; ahead=2
    ("t4", 1, (0.25, 0.75), GO),
    ("t5", 1, (1.0, 0.0), GO),  # n=6 keep=3: front of 4, t5 an extreme (cd inf): ahead=0
    # n=7 keep=4: front {t0,t2,t4,t5,t6}; cd t2=t5=inf, t0=t4=t6=.5+.5=1: ahead=2 (no ties)
    ("t6", 1, (0.75, 0.25), GO),
    # n=8 keep=4: front of 6, a on the front stopped by crowding distance. a sorted
    # 0 .25 .45 .5 .75 1, b sorted 0 .25 .5 .55 .75 1 (widths 1): cd t7 = (.5-.25) +
    # (.75-.5) = .5; t4 = .45 + .45 = .9, t0 = .3 + .3 = .6, t6 = .5 + .5 = 1, t2 = t5 =
    # inf: ahead=5 (t0, t2, t4, t5, t6)
    ("t7", 1, (0.45, 0.55), STOP),
    # rung 2
    ("t2", 2, (0.0, 1.0), GO),  # n=1
    ("t0", 2, (0.5, 0.5), GO),  # n=2 keep=1: front {t2, t0}, both cd inf, ahead=0
    ("t0", 3, (0.4, 0.4), GO),  # recorded at rung 2 already: no new judgement
    ("t4", 2, (0.25, 0.75), STOP),  # n=3 keep=2: cd t4 = 2 < inf of t0, t2: ahead=2
    ("t5", 2, (1.0, 0.0), GO),  # n=4 keep=2: an extreme, ahead=0
    # t6 skipped rung 2 in its reports: judged at the highest rung reached, n=5 keep=3,
    # the same five points as t6 at rung 1: cd t2=t5=inf, t0=t4=t6=1: ahead=2
    ("t6", 3, (0.75, 0.25), GO),
    # rung 4
    ("t2", 4, (0.0, 1.0), GO),  # n=1
    ("t5", 4, (1.0, 1.0), STOP),  # n=2 keep=1: dominated by t2
    # max_t: every trial stops there (the record ends it COMPLETE)
    ("t2", 8, (0.0, 1.0), STOP),
]


def _scheduler(objectives, max_t: int = 8, grace_period: int = 1, reduction_factor: float = 2):
    inner = MultiObjectiveASHA(objectives, "step", grace_period=grace_period, max_t=max_t,
                               reduction_factor=reduction_factor)
    return RecordingScheduler(inner, _Record(), "mo-asha", removal_stops=True)


def _trial(trial_id: str) -> Trial:
    trial = Trial("toy", stub=True, trial_id=trial_id)
    trial.set_status(Trial.RUNNING)
    return trial


def test_rung_decisions_on_a_known_front_equal_the_hand_computation():
    scheduler = _scheduler([("a", "minimize"), ("b", "minimize")])
    trials: dict[str, Trial] = {}
    decided = []
    for trial_id, updates, (a, b), _ in HAND:
        if trial_id not in trials:
            trials[trial_id] = _trial(trial_id)
            scheduler.on_trial_add(None, trials[trial_id])
        decided.append(scheduler.on_trial_result(None, trials[trial_id],
                                                 {"step": updates, "a": a, "b": b}))
    assert decided == [d for *_, d in HAND]
    assert scheduler.record.stops == [(t, "mo-asha") for t, *_, d in HAND if d == STOP]
    assert scheduler.record.results == [(t, u) for t, u, *_ in HAND]  # each once
    rungs = scheduler.inner.rungs
    assert rungs.milestones == [1.0, 2.0, 4.0]
    assert [list(r) for r in rungs.recorded] == [
        ["t0", "t1", "t2", "t3", "t4", "t5", "t6", "t7"], ["t2", "t0", "t4", "t5", "t6"],
        ["t2", "t5"]]


def test_finite_values_whose_range_overflows_keep_the_rule():
    """The breaker's case: A = (1e308, -1e308), B = (-1e308, 1e308), then C = (0, 0), all on
    front 0. By hand A and B get inf and C 2 (each objective's gap, 2e308, over its range,
    2e308), so 2 vectors rank above C and ceil(3/2) = 2: C stops. Before, the range
    overflowed to inf, C's distance was NaN, nothing ranked above it and it went on."""
    front = np.array([[1e308, -1e308], [-1e308, 1e308], [0.0, 0.0]])
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no overflow warning either
        assert crowding_distance(front).tolist() == [math.inf, math.inf, 2.0]
        rungs = MoRungs(1, 100, 2, ["minimize", "minimize"])
        assert rungs.decide("A", 1, [1e308, -1e308]) is True
        assert rungs.decide("B", 1, [-1e308, 1e308]) is True
        assert rungs.decide("C", 1, [0.0, 0.0]) is False


def test_crowding_distance_and_fronts_of_the_hand_computation():
    # rung 1 when t7 arrives: t0, t1, t2, t3, t4, t5, t6, t7
    losses = np.array([[0.5, 0.5], [1.0, 1.0], [0.0, 1.0], [0.6, 0.6], [0.25, 0.75],
                       [1.0, 0.0], [0.75, 0.25], [0.45, 0.55]])
    assert nondomination_ranks(losses).tolist() == [0, 2, 0, 1, 0, 0, 0, 0]
    front = losses[[0, 2, 4, 5, 6, 7]]
    assert crowding_distance(front) == pytest.approx([0.6, math.inf, 0.9, math.inf, 1.0, 0.5])
    assert crowding_distance(np.array([[1.0, 2.0]])).tolist() == [0.0]  # alone: no gap
    # an objective with one value adds nothing; the other ranks as usual
    assert crowding_distance(np.array([[0.0, 1.0], [0.5, 1.0], [2.0, 1.0]])).tolist() == [
        math.inf, 1.0, math.inf]


def test_maximized_objectives_are_ranked_with_their_sign_flipped():
    # accuracy maximized, cost minimized: (0.8, 3) is worse in both than (0.9, 2)
    mixed = MoRungs(1, 8, 2, ["maximize", "minimize"])
    assert mixed.decide("t0", 1, (0.9, 2.0)) is True
    assert mixed.decide("t1", 1, (0.8, 3.0)) is False
    # the same numbers with accuracy minimized: neither dominates, both on the front
    both_min = MoRungs(1, 8, 2, ["minimize", "minimize"])
    assert both_min.decide("t0", 1, (0.9, 2.0)) is True
    assert both_min.decide("t1", 1, (0.8, 3.0)) is True
    # the hand computation above, with a maximized as 1 - a: the same decisions
    flipped = MoRungs(1, 8, 2, ["maximize", "minimize"])
    assert [flipped.decide(t, u, (1.0 - a, b)) for t, u, (a, b), _ in HAND] == [
        d == GO for *_, d in HAND]


def test_a_missing_or_nan_objective_stops_the_trial_and_is_not_recorded():
    scheduler = _scheduler([("a", "minimize"), ("b", "maximize")])
    t0, t1, t2, t3 = (_trial(f"t{i}") for i in range(4))
    assert scheduler.on_trial_result(None, t0, {"step": 1, "a": 1.0}) == STOP
    assert scheduler.on_trial_result(None, t1, {"step": 1, "a": math.nan, "b": 1.0}) == STOP
    assert scheduler.on_trial_result(None, t2, {"step": 1, "a": 1.0, "b": None}) == STOP
    assert scheduler.on_trial_result(None, t3, {"a": 1.0, "b": 1.0}) == GO  # no step: no rung
    assert scheduler.inner.rungs.recorded[0] == {}
    # so the next trial is the first at the rung, however poor
    assert scheduler.on_trial_result(None, t3, {"step": 1, "a": 9.0, "b": -9.0}) == GO
    assert scheduler.record.stops == [("t0", "mo-asha"), ("t1", "mo-asha"), ("t2", "mo-asha")]


def test_results_below_the_grace_period_go_on_and_the_last_result_is_recorded():
    scheduler = _scheduler([("a", "minimize"), ("b", "minimize")], grace_period=3)
    t0, t1 = _trial("t0"), _trial("t1")
    assert scheduler.on_trial_result(None, t0, {"step": 2, "a": 9.0, "b": 9.0}) == GO
    assert scheduler.inner.rungs.milestones == [3.0, 6.0]
    # a last result Tune hands only to on_trial_complete is recorded at its rung (as ASHA)
    scheduler.on_trial_complete(None, t0, {"step": 3, "a": 0.0, "b": 0.0})
    assert scheduler.on_trial_result(None, t1, {"step": 3, "a": 1.0, "b": 1.0}) == STOP


@pytest.mark.parametrize(("args", "message"), [
    ((0, 8, 2, ["minimize"]), "need 1 <= grace_period <= max_t, got grace_period=0, max_t=8"),
    ((9, 8, 2, ["minimize"]), "need 1 <= grace_period <= max_t, got grace_period=9, max_t=8"),
    ((1, 8, 1.0, ["minimize"]), "reduction_factor must be > 1, got reduction_factor=1.0"),
    ((1, 8, 2, ["up"]), "need 'minimize' or 'maximize' per objective, got directions=['up']"),
])
def test_rungs_refuse_arguments_out_of_range(args, message):
    with pytest.raises(ValueError) as info:
        MoRungs(*args)
    assert str(info.value) == message


# -- the spec ----------------------------------------------------------------------------

TWO = [{"metric": "val_loss"}, {"metric": "val_score"}]


def _spec(name: str = "mo", objective=None, scheduler=None, **extra):
    return parse_spec({
        "name": name, "task": "toy-hpo",
        "config": {"max_updates": 12, "max_epochs": None, "eval_interval": 3,
                   "micro_batch_size": 8},
        "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0},
                         "score": {"type": "float", "low": 0.0, "high": 20.0}},
        "objective": TWO if objective is None else objective,
        "sampler": {"name": "random", "seed": 1},
        "scheduler": scheduler or {"name": "mo-asha", "grace_period": 3,
                                   "reduction_factor": 2},
        "budget": {"n_trials": 3, "max_concurrent_trials": 1}, "resources": {"cpus": 1},
        **extra})


def test_build_scheduler_makes_mo_asha_over_every_objective_with_planned_updates_as_max_t():
    spec = _spec(objective=[{"metric": "val_loss"}, {"metric": "val_score",
                                                     "direction": "minimize"}])
    scheduler = build_scheduler(spec, record=None, planned_updates=12)
    assert (scheduler.label, scheduler.removal_stops) == ("mo-asha", True)
    inner = scheduler.inner
    assert isinstance(inner, MultiObjectiveASHA)
    assert inner.metrics == ["val_loss", "val_score"]
    assert inner.rungs.signs.tolist() == [1.0, 1.0]  # directions as the spec gives them
    assert (inner.rungs.milestones, inner.rungs.max_t) == ([3.0, 6.0], 12)
    spec = _spec(scheduler={"name": "mo-asha", "max_t": 10, "reduction_factor": 3.0})
    inner = build_scheduler(spec, record=None, planned_updates=12).inner
    assert (inner.rungs.milestones, inner.rungs.max_t) == ([1.0, 3.0, 9.0], 10)
    assert inner.rungs.signs.tolist() == [1.0, -1.0]  # the task's: val_score is maximized


@pytest.mark.parametrize(("changes", "loc", "msg"), [
    ({"objective": {"metric": "val_loss"}}, "scheduler.name",
     "mo-asha ranks several objectives; use asha for one"),
    ({"scheduler": {"name": "asha"}}, "scheduler.name",
     "asha stops trials by one objective; use mo-asha or fifo for several"),
    ({"scheduler": {"name": "mo-asha", "reduction_factor": 1.0}},
     "scheduler.reduction_factor", "Input should be greater than 1"),
    ({"scheduler": {"name": "mo-asha", "grace_period": 0}}, "scheduler.grace_period",
     "Input should be greater than or equal to 1"),
    ({"scheduler": {"name": "mo-asha", "max_t": 0}}, "scheduler.max_t",
     "Input should be greater than or equal to 1"),
    ({"scheduler": {"name": "mo-asha", "brackets": 2}}, "scheduler.brackets",
     "not a field here; fields here: grace_period, max_t, name, reduction_factor"),
])
def test_spec_errors_name_their_field(changes, loc, msg):
    with pytest.raises(SpecError) as info:
        _spec(**changes)
    assert [(e["loc"], e["msg"]) for e in info.value.errors] == [(loc, msg)]


def test_grace_period_beyond_max_t_is_refused_when_the_study_starts():
    from hpo.validation import check_budgets

    with pytest.raises(SpecError) as info:
        check_budgets(_spec(scheduler={"name": "mo-asha", "grace_period": 13}))
    assert [(e["loc"], e["msg"]) for e in info.value.errors] == [
        ("scheduler.grace_period", "13 is beyond the trials' planned updates (12)")]


# -- the record ----------------------------------------------------------------------------

def test_a_stopped_trial_ends_pruned_with_its_last_value_of_every_objective(sqlite_url):
    record = StudyRecord(_spec("mo-record"), open_storage(sqlite_url))
    record.ask("r0")
    record.result("r0", {"step": 3, "planned_updates": 12, "val_loss": 6.5, "val_score": -6.5})
    record.decided("r0", STOP, "mo-asha")
    assert record.complete_or_prune("r0", "fifo") == TrialState.PRUNED
    record.ask("r1")
    record.result("r1", {"step": 6, "planned_updates": 12, "val_loss": math.nan,
                         "val_score": 1.0})
    record.decided("r1", STOP, "mo-asha")
    assert record.complete_or_prune("r1", "fifo") == TrialState.PRUNED
    r0, r1 = record.study.trials
    assert (r0.values, r0.intermediate_values) == (None, {})
    assert {k: r0.user_attrs[k] for k in ("stopped_by", "budget_updates", "last_values")} == {
        "stopped_by": "mo-asha", "budget_updates": 3,
        "last_values": {"val_loss": 6.5, "val_score": -6.5}}
    assert r1.user_attrs["last_values"] == {"val_loss": None, "val_score": 1.0}


# -- a real Ray --------------------------------------------------------------------------

@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_study_on_ray_prunes_the_dominated_trial_and_keeps_its_last_values(
        sqlite_url, tmp_path):
    from hpo.tune.driver import run_study

    # one trial at a time, fixed points: val_loss = quality + 1/(k + 1) after k
    # evaluations (every 3 updates), val_score = score - val_loss; rungs at 3 and 6
    # (max_t = the 12 planned updates). At 3: t0 (5.5, -5.5) first; t1 (6.5, -6.5)
    # dominated by t0, n=2 keep=1: STOP; t2 (7.5, 2.5) on the front with t0, both crowding
    # distance inf: on. At 6: t0 first, t2 beside it on the front: on.
    points = [{"quality": 5.0, "score": 0.0}, {"quality": 6.0, "score": 0.0},
              {"quality": 7.0, "score": 10.0}]
    spec = _spec("mo-ray", warm_start=[{"params": p} for p in points])
    out = run_study(spec, sqlite_url, results_dir=tmp_path / "ray")
    trials = optuna.load_study(study_name="mo-ray", storage=sqlite_url).get_trials()
    assert [t.state for t in trials] == [TrialState.COMPLETE, TrialState.PRUNED,
                                         TrialState.COMPLETE]
    t0, t1, t2 = trials
    assert t0.values == [5.2, -5.2] and t2.values == [7.2, 2.8]  # after 4 evaluations
    assert {k: t1.user_attrs[k] for k in ("stopped_by", "budget_updates", "last_values")} == {
        "stopped_by": "mo-asha", "budget_updates": 3,
        "last_values": {"val_loss": 6.5, "val_score": -6.5}}
    assert t0.user_attrs["stop_reason"] == "reached its planned updates"
    assert "last_values" not in t0.user_attrs
    assert [number for number, *_ in out.pareto_front] == [0, 2]


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_restarted_driver_ranks_against_the_vectors_recorded_before_it(
        sqlite_url, tmp_path):
    """The breaker's finding: the rungs lived in the driver's memory, so after a restart
    the first trial at each rung went on whatever it scored (here the quality-6 point,
    dominated by trial 0 at 3 updates, trained to the end). Each recorded vector is kept
    in its trial's ``mo_rungs`` attribute and put back by the next driver: the decisions
    are those of the uninterrupted run above."""
    from tests.hpo.test_asha_restart import run_restarted_after_trial_0

    points = [{"quality": 5.0, "score": 0.0}, {"quality": 6.0, "score": 0.0},
              {"quality": 7.0, "score": 10.0}]
    spec = _spec("mo-restart", warm_start=[{"params": p} for p in points],
                 config={"max_updates": 12, "max_epochs": None, "eval_interval": 3,
                         "micro_batch_size": 8, "sleep_ms": 40})
    trials = run_restarted_after_trial_0(spec, sqlite_url, tmp_path / "ray")
    ran = {t.params["quality"]: t for t in trials if t.state != TrialState.FAIL}
    assert {q: t.state for q, t in ran.items()} == {
        5.0: TrialState.COMPLETE, 6.0: TrialState.PRUNED, 7.0: TrialState.COMPLETE}
    assert ran[6.0].user_attrs["budget_updates"] == 3
    assert ran[5.0].user_attrs["mo_rungs"] == [[3.0, [5.5, -5.5]],
                                               [6.0, [pytest.approx(5 + 1 / 3),
                                                      pytest.approx(-5 - 1 / 3)]]]
    assert ran[6.0].user_attrs["mo_rungs"] == [[3.0, [6.5, -6.5], "stopped"]]


def test_a_trial_stopped_before_its_end_was_stored_is_stopped_again_when_resumed():
    """The breaker's suspicion: the rule records a stopped trial's vector as it decides;
    a driver killed before the trial's end (PRUNED) was stored left it RUNNING with a
    checkpoint, and the next driver, finding it recorded at that rung, let it go on.
    The stop is kept with the vector, and a restored stop stops the trial again."""
    from hpo.tune.mo_asha import MoRungs

    told = []
    rungs = MoRungs(1, 9, 3, ["minimize", "minimize"])
    rungs.on_record = lambda *entry: told.append(entry)
    assert rungs.decide(0, 1, [1.0, 1.0]) is True
    assert rungs.decide(1, 1, [2.0, 2.0]) is False  # dominated
    assert told == [(0, 1, [1.0, 1.0], True), (1, 1, [2.0, 2.0], False)]
    restarted = MoRungs(1, 9, 3, ["minimize", "minimize"])
    assert restarted.restore([(k, m, v, went_on) for k, m, v, went_on in told]) == 2
    assert restarted.decide(1, 2, [0.0, 0.0]) is False  # its next result, however good
    assert restarted.decide(0, 3, [0.5, 0.5]) is True and restarted.decide(2, 1, [0.9, 0.9])


def test_nsga2_builds_its_generations_from_complete_trials_only():
    # what the README says of PRUNED trials under mo-asha: NSGA-II's populations count
    # COMPLETE trials only (Optuna 5.0, BaseGASampler.get_trial_generation)
    sampler = optuna.samplers.NSGAIISampler(population_size=2, seed=0)
    study = optuna.create_study(directions=["minimize", "minimize"], sampler=sampler)
    x = optuna.distributions.FloatDistribution(0.0, 1.0)
    for i in range(3):
        study.add_trial(optuna.trial.create_trial(
            state=TrialState.PRUNED, params={"x": i / 4}, distributions={"x": x},
            user_attrs={"last_values": {"a": 0.0, "b": 0.0}}))

    def next_generation() -> int:
        trial = study.ask({"x": x})
        generation = sampler.get_trial_generation(study, study.trials[trial.number])
        study.tell(trial, [trial.params["x"], 1.0 - trial.params["x"]])
        return generation

    # three pruned trials, a population of 2: still generation 0 until 2 COMPLETE
    assert [next_generation() for _ in range(3)] == [0, 0, 1]
