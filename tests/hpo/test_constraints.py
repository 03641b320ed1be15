"""Constraints (spec ``constraints``, issue 18.2): bounds on reported metrics, recorded as
Optuna constraints; the sampler avoids the infeasible region; the best trial is feasible."""

from __future__ import annotations

import math

import optuna
import pytest
from optuna.trial import TrialState

from hpo.errors import SpecError
from hpo.record import StudyRecord
from hpo.spec import parse_spec
from hpo.storage import open_storage
from hpo.tune.driver import outcome


def _spec(name: str, constraints: list[dict], sampler: dict | None = None, n: int = 30,
          **changes):
    return parse_spec({
        "name": name, "task": "toy-hpo",
        "config": {"max_updates": 4, "max_epochs": None},
        "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0}},
        "objective": {"metric": "val_score"},  # maximize -(quality + 0.2): quality -> 0
        "sampler": sampler or {"name": "tpe", "seed": 0, "n_startup_trials": 5},
        "budget": {"n_trials": n}, "constraints": constraints, **changes})


def _run_in_process(record: StudyRecord, n: int, extra=lambda q: {}) -> None:
    """Ask, report and end ``n`` trials through the record, as the driver does."""
    for i in range(n):
        q = record.ask(f"r{i}")["quality"]
        record.result(f"r{i}", {"step": 4, "planned_updates": 4, "val_score": -(q + 0.2),
                                "val_loss": q + 0.2, **extra(q)})
        record.complete_or_prune(f"r{i}", "fifo")


FLOOR = [{"metric": "val_loss", "min": 5.2}]  # feasible: quality >= 5


def test_tpe_avoids_the_infeasible_region_the_objective_prefers(sqlite_url):
    storage = open_storage(sqlite_url)
    bound = StudyRecord(_spec("bound", FLOOR), storage)
    _run_in_process(bound, 30)
    free = StudyRecord(_spec("free", []), storage)
    _run_in_process(free, 30)

    def after_startup(study) -> list[float]:
        return sorted(t.params["quality"] for t in study.trials[5:])

    trials = bound.study.trials
    assert all(t.constraints == {"val_loss.min": pytest.approx(5.2 - (t.params["quality"] + 0.2))}
               for t in trials)
    assert [t.user_attrs["feasible"] for t in trials] == [
        t.params["quality"] + 0.2 >= 5.2 for t in trials]
    # unconstrained, TPE chases quality -> 0 (deep in the infeasible region); bounded, it
    # gathers at the boundary (the best feasible point, 5) and rarely goes deep
    free_q, bound_q = after_startup(free.study), after_startup(bound.study)
    assert sum(q < 2.5 for q in free_q) >= 12 and free_q[12] < 3.0  # the median
    assert sum(q < 2.5 for q in bound_q) <= 4 and 4.0 <= bound_q[12] <= 7.0
    best = bound.study.best_trial
    assert 5.0 <= best.params["quality"] < 5.5
    assert best.number == max((t for t in trials if t.user_attrs["feasible"]),
                              key=lambda t: t.value).number
    assert outcome(bound).best_number == best.number


def test_a_missing_or_nan_metric_is_a_violation_and_no_feasible_trial_means_no_best(
        sqlite_url):
    record = StudyRecord(_spec("mem", [{"metric": "peak_memory_bytes", "max": 2.0e8},
                                       {"metric": "val_loss", "max": 100.0}],
                               sampler={"name": "random", "seed": 3}, n=3),
                         open_storage(sqlite_url))
    memory = iter([3.0e8, float("nan")])
    _run_in_process(record, 2, lambda q: {"peak_memory_bytes": next(memory)})
    record.ask("r9")
    record.result("r9", {"step": 4, "planned_updates": 4, "val_score": 1.0})  # no memory
    record.complete_or_prune("r9", "fifo")
    a, b, c = record.study.trials
    assert a.constraints["peak_memory_bytes.max"] == pytest.approx(1.0e8)
    assert math.isinf(b.constraints["peak_memory_bytes.max"])  # NaN reported
    assert math.isinf(c.constraints["peak_memory_bytes.max"])  # never reported
    assert c.constraints["val_loss.max"] == math.inf
    assert [t.user_attrs["feasible"] for t in (a, b, c)] == [False] * 3
    assert all(t.state == TrialState.COMPLETE for t in (a, b, c))
    out = outcome(record)
    assert out.best_number is None and out.counts.complete == 3
    with pytest.raises(ValueError, match="No feasible trials"):
        _ = optuna.load_study(study_name="mem", storage=sqlite_url).best_trial


@pytest.mark.parametrize("constraints, loc, msg", [
    ([{"metric": "val_loss"}], "constraints.0", "give one bound: max or min"),
    ([{"metric": "val_loss", "max": 1.0, "min": 0.0}], "constraints.0",
     "give one bound: max or min"),
    ([{"metric": "val_loss", "max": 1.0}, {"metric": "val_loss", "max": 2.0}], "constraints",
     "two bounds named val_loss.max: give each metric one max and one min at most"),
    ([{"metric": "val_loss", "max": 0.1}, {"metric": "val_loss", "min": 0.5}], "constraints",
     "val_loss: min 0.5 is above max 0.1, so no trial could be feasible"),
    ([{"metric": "val_los", "max": 1.0}], "constraints.0.metric",
     "task 'toy-hpo' and the loop report ['epoch', 'grad_norm', 'loss_scale', 'lr', "
     "'peak_memory_bytes', 'planned_updates', 'samples', 'samples_per_s', "
     "'skipped_updates', 'step', 'time_s', 'train_loss', 'val_loss', "
     "'val_score'], not 'val_los' (did you mean 'val_loss'?)"),
    ([{"metric": "val_loss", "max": float("inf")}], "constraints.0.max",
     "Input should be a finite number"),
])
def test_a_bad_constraint_names_its_field(constraints, loc, msg):
    with pytest.raises(SpecError) as e:
        _spec("bad", constraints)
    assert {"loc": loc, "msg": msg} in e.value.errors


def test_per_rank_peak_memory_is_a_metric_a_constraint_may_bound():
    fsdp = {"parallelism": "fsdp", "workers": 2}
    spec = _spec("ranks", [{"metric": "peak_memory_bytes_rank1", "max": 1e9},
                           {"metric": "val_loss", "min": 0.5}], resources=fsdp)
    assert [c.key for c in spec.constraints] == ["peak_memory_bytes_rank1.max",
                                                 "val_loss.min"]


@pytest.mark.parametrize("metric, resources, msg", [
    ("peak_memory_bytes_rank2", {"parallelism": "fsdp", "workers": 2}, "fsdp with 2 workers"),
    ("peak_memory_bytes_rank1", {"workers": 2}, "ddp with 2 workers"),
    ("peak_memory_bytes_rank0", {}, "ddp with 1 worker"),
    ("peak_memory_bytes_rank\u0661", {"parallelism": "fsdp", "workers": 2}, None),  # 1 in Arabic
    ("tokens_per_s", {}, "tokens_per_s is reported by token tasks only; task 'toy-hpo' "
                         "counts samples (samples_per_s)"),
])
def test_a_constraint_on_a_metric_these_trials_never_report_is_refused(metric, resources,
                                                                        msg):
    # a metric never reported violates its bound: every trial infeasible, no best, no model
    with pytest.raises(SpecError) as e:
        _spec("never", [{"metric": metric, "max": 1e9}], resources=resources)
    (error,) = e.value.errors
    assert error["loc"] == "constraints.0.metric"
    if msg is not None:
        assert msg in error["msg"]


def test_a_multi_objective_study_s_front_holds_only_feasible_trials(sqlite_url):
    # NSGA-II ranks infeasible trials behind every feasible one (constrained domination)
    def spec(name, constraints):
        return parse_spec({
            "name": name, "task": "toy-hpo", "config": {"max_updates": 4, "max_epochs": None},
            "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0}},
            "objective": [{"metric": "val_score"}, {"metric": "val_loss"}],
            "sampler": {"name": "nsga2", "seed": 0, "population_size": 6},
            "budget": {"n_trials": 30}, "constraints": constraints})

    storage = open_storage(sqlite_url)
    for name, constraints in (("mo-bound", FLOOR), ("mo-free", [])):
        record = StudyRecord(spec(name, constraints), storage)
        _run_in_process(record, 30)
        trials = record.study.trials
        allowed = [t for t in trials if not constraints or t.params["quality"] >= 5.0]
        best = min(allowed, key=lambda t: t.params["quality"])
        # both objectives prefer a low quality: the front is that one trial
        assert [t.number for t in record.study.best_trials] == [best.number]
        assert [n for n, _, _ in outcome(record).pareto_front] == [best.number]
        assert (best.params["quality"] >= 5.0) == bool(constraints)


@pytest.mark.ray
@pytest.mark.usefixtures("ray_session")
def test_a_study_on_ray_records_constraints_from_the_trials_last_report(sqlite_url, tmp_path):
    from tests.hpo.test_driver import run, toy_spec

    spec = toy_spec("ray-bound", budget={"n_trials": 4},
                    constraints=[{"metric": "val_loss", "min": 5.2},
                                 {"metric": "peak_memory_bytes", "max": 1.0e12}])
    out, trials = run(spec, sqlite_url, tmp_path)
    assert [t.state for t in trials] == [TrialState.COMPLETE] * 4
    for t in trials:  # the last report: val_loss = quality + 0.2, the process's peak RSS
        assert t.constraints["val_loss.min"] == pytest.approx(5.0 - t.params["quality"])
        assert -1.0e12 < t.constraints["peak_memory_bytes.max"] < -1.0e12 + 1.0e11
        assert t.user_attrs["feasible"] == (t.params["quality"] >= 5.0)
    feasible = [t for t in trials if t.user_attrs["feasible"]]
    assert out.best_number == (min(feasible, key=lambda t: t.value).number if feasible
                               else None)


def test_the_cost_chart_s_best_so_far_counts_feasible_trials_only():
    # an infeasible trial is never the best (hpo.summary); the chart drew it as the best
    import datetime as dt

    from optuna.distributions import FloatDistribution
    from optuna.trial import create_trial

    from hpo.charts import cost_figure

    spec = _spec("cost", FLOOR)  # maximize val_score; feasible: val_loss >= 5.2
    trials = []
    for number, (score, violation) in enumerate([(-6.0, -0.8), (-0.5, 4.9), (-5.5, -0.3)]):
        t = create_trial(value=score, params={"quality": 1.0},
                         distributions={"quality": FloatDistribution(0.0, 10.0)},
                         user_attrs={"device_seconds": 1.0},
                         system_attrs={"constraints:val_loss.min": violation})
        t.number = number
        t.datetime_complete = dt.datetime(2026, 1, 1, 0, 0, number)
        trials.append(t)
    (best,) = [tr for tr in cost_figure(spec, trials).data if tr.name.startswith("best ")]
    assert list(best.y) == [-6.0, -6.0, -5.5]


def test_a_reported_integer_beyond_float_is_a_violation_not_a_crash(sqlite_url):
    record = StudyRecord(_spec("huge", [{"metric": "samples", "max": 1.0e6}],
                               sampler={"name": "random", "seed": 3}, n=1),
                         open_storage(sqlite_url))
    _run_in_process(record, 1, lambda q: {"samples": 10 ** 400})
    (trial,) = record.study.trials
    assert trial.state == TrialState.COMPLETE and trial.user_attrs["feasible"] is False
    assert math.isinf(trial.constraints["samples.max"])
