"""Issue 15.4: a spec's validation stays linear and cheap per item whatever the body's size.

No timing here (bench/spec_bounds.py prints the figures): these pin the mechanisms that
keep it so: a size bound runs before the task's per-value checks, each check lists at
most MAX_ERRORS problems, a search space over MAX_PARAMETERS is refused before its
parameters are validated, and the text scan and warm-start lookups find what they did.
"""

from __future__ import annotations

import json

import pytest

import trainers.fields
from hpo.errors import SpecError
from hpo.spec import StudySpec, parse_spec
from hpo.speclimits import MAX_ERRORS, MAX_KEYS, MAX_PARAMETERS

BASE = {"name": "limits", "task": "digits", "config": {"max_epochs": 1},
        "objective": {"metric": "val_accuracy"}, "budget": {"n_trials": 4}}


def _errors(data, **kwargs) -> list[dict[str, str]]:
    with pytest.raises(SpecError) as e:
        parse_spec(data, **kwargs)
    return e.value.errors


@pytest.fixture
def builds(monkeypatch) -> list[str]:
    """The class of the configuration dataclass built for each value of the search space
    (the one the value is a field of; ``trainers.create``, which checks the config itself,
    binds its own ``build`` and is not counted)."""
    calls: list[str] = []
    real = trainers.fields.build

    def counting(cls, values):
        calls.append(cls.__name__)
        return real(cls, values)

    monkeypatch.setattr(trainers.fields, "build", counting)
    return calls


def test_a_bound_runs_on_the_valid_structure_before_any_task_check(builds):
    space = {"lr": {"type": "categorical", "choices": [i / 1000 for i in range(1, 1001)]}}
    seen = []

    def bound(spec):
        seen.append(spec)
        raise SpecError.at("search_space", "too large")

    errors = _errors({**BASE, "search_space": space}, bound=bound)
    assert errors == [{"loc": "search_space", "msg": "too large"}]
    assert len(seen) == 1 and isinstance(seen[0], StudySpec)
    assert seen[0].search_space["lr"].choices[-1] == 1.0
    assert builds == []  # not one of the 1000 values was built


def test_without_a_bound_every_value_is_checked_against_the_task(builds):
    space = {"lr": {"type": "categorical", "choices": [i / 1000 for i in range(1, 101)]}}
    parse_spec({**BASE, "search_space": space})
    assert builds == ["TrainConfig"] * 100  # lr is a TrainConfig field


def test_unknown_options_past_the_first_hundred_are_not_listed():
    config = {f"option{i}": 1 for i in range(500)}
    errors = _errors({**BASE, "config": config})
    assert len(errors) == MAX_ERRORS + 1
    assert errors[0]["loc"] == "config.option0"
    assert errors[MAX_ERRORS - 1]["loc"] == f"config.option{MAX_ERRORS - 1}"
    assert errors[-1] == {"loc": "config", "msg": f"not checked further: the first "
                                                  f"{MAX_ERRORS} problems are listed"}


def test_values_of_the_search_space_past_the_first_hundred_problems_are_not_checked(builds):
    # width must be in 1..512: choices 513..1000 are 488 problems
    space = {"width": {"type": "categorical", "choices": list(range(1, 1001))}}
    errors = _errors({**BASE, "search_space": space})
    assert [e["loc"] for e in errors[:2]] == ["search_space.width.choices.512",
                                              "search_space.width.choices.513"]
    assert len(errors) == MAX_ERRORS + 1
    assert errors[-1] == {"loc": "search_space", "msg": f"not checked further: the first "
                                                        f"{MAX_ERRORS} problems are listed"}
    # width is an option of the task: its options with each good width and 100 bad ones
    assert builds == ["DigitsOptions"] * (512 + MAX_ERRORS)


def test_structural_problems_past_the_first_hundred_are_counted():
    space = {f"p{i}": {"type": "int", "low": 1, "high": 0} for i in range(300)}
    errors = _errors({**BASE, "search_space": space})
    assert len(errors) == MAX_ERRORS + 1
    assert errors[0] == {"loc": "search_space.p0.high", "msg": "must be > low (1), got 0"}
    assert errors[-1] == {"loc": "", "msg": f"and 200 more problems (the first {MAX_ERRORS} "
                                            "are listed)"}


def test_a_search_space_over_the_limit_is_refused_before_its_parameters_are_read():
    space = {f"p{i}": "not a parameter" for i in range(MAX_PARAMETERS + 1)}
    assert _errors({**BASE, "search_space": space}) == [
        {"loc": "search_space", "msg": "1,001 parameters; at most 1,000"}]


def test_unprintable_text_deep_in_a_large_body_is_found_with_its_path():
    config = {"lr": [0] * 100_000 + ["a\x00b"], "bad\x7fkey": 1}
    assert _errors({**BASE, "config": config}) == [
        {"loc": "config.lr.100000", "msg": "holds U+0000 (a control character or lone "
                                           "surrogate); only printable text is accepted"},
        {"loc": "config.bad\\x7fkey", "msg": "holds U+007F (a control character or lone "
                                             "surrogate); only printable text is accepted"}]


def test_printable_text_outside_ascii_is_accepted_and_c1_controls_are_not():
    text = "caf\u00e9\u00a0\u4e2d"  # U+00A0 is the first character past the C1 controls
    assert parse_spec({**BASE, "config": {"x": [text]}}, check_task=False).config == {
        "x": [text]}
    assert _errors({**BASE, "config": {"x": ["\u009f"]}}, check_task=False) == [
        {"loc": "config.x.0", "msg": "holds U+009F (a control character or lone "
                                     "surrogate); only printable text is accepted"}]


@pytest.mark.parametrize(("point", "inside"), [(3, True), (3.0, False), (True, False),
                                               (1, True), ("a", True), ("b", False)])
def test_warm_start_points_of_a_categorical_match_by_type_and_value(point, inside):
    from hpo.validation import _check_warm_start

    choices = ["a", *range(1, 1000)]  # 1000 choices: looked up in a set
    spec = parse_spec({**BASE, "search_space": {"depth": {"type": "categorical",
                                                          "choices": choices}},
                       "warm_start": [{"params": {"depth": point}}]}, check_task=False)
    assert _check_warm_start(spec) == ([] if inside else [
        {"loc": "warm_start.0.params.depth", "msg": f"{point!r} is outside the search space"}])


@pytest.mark.parametrize("where", ["", "budget", "objective", "search_space.lr"])
def test_a_mapping_of_more_keys_than_any_field_has_is_refused_before_validation(where):
    """60,000 unknown keys had pydantic build 60,000 errors (0.1 s) before the 422."""
    spec = {**BASE, "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1}}}
    parent, key = spec, where
    for part in where.split(".")[:-1]:
        parent = parent[part]
    key = where.split(".")[-1]
    wide = parent if not where else {**parent.get(key, {})}
    wide.update({f"k{i}": i for i in range(MAX_KEYS + 1)})
    if where:
        parent[key] = wide
    assert _errors(spec) == [{"loc": where,
                              "msg": f"has {len(wide):,} keys; at most {MAX_KEYS:,}"}]


@pytest.mark.parametrize(("scheduler", "problem"), [
    # a factor just above 1 built 7 million rungs per million updates (gigabytes): the driver
    # was killed for memory (Ray's ASHA and Hyperband the same)
    ({"name": "asha", "reduction_factor": 1.00000001, "max_t": 1000},
     ("scheduler.reduction_factor", "1.00000001 makes 690775536 rungs from 1 to max_t (1000): "
      "at most 100; use a reduction_factor of at least 1.072")),
    ({"name": "mo-asha", "reduction_factor": 1.01, "max_t": 10**6, "grace_period": 10},
     ("scheduler.reduction_factor", "1.01 makes 1158 rungs from 10 to max_t (1000000): at most "
      "100; use a reduction_factor of at least 1.123")),
    ({"name": "hyperband", "reduction_factor": 1.001, "max_t": 10**6},
     ("scheduler.reduction_factor", "1.001 makes 13823 rungs from 1 to max_t (1000000): at "
      "most 100; use a reduction_factor of at least 1.149")),
    ({"name": "asha", "brackets": 101}, ("scheduler.brackets",
                                         "Input should be less than or equal to 100")),
])
def test_a_schedule_of_more_than_100_rungs_is_refused_naming_the_factor(scheduler, problem):
    assert [(e["loc"], e["msg"]) for e in _errors({**BASE, "scheduler": scheduler},
                                                  check_task=False)] == [problem]


@pytest.mark.parametrize("scheduler", [
    {"name": "asha", "reduction_factor": 1.1, "max_t": 13780},  # 100 rungs: the most
    {"name": "hyperband", "reduction_factor": 2, "max_t": 2**31 - 1},
    {"name": "asha", "brackets": 100, "max_t": 10},
])
def test_a_schedule_of_at_most_100_rungs_is_taken(scheduler):
    parse_spec({**BASE, "scheduler": scheduler}, check_task=False)


@pytest.mark.parametrize("name", ["asha", "mo-asha", "hyperband"])
def test_the_rungs_up_to_the_planned_updates_are_counted_when_the_study_starts(name):
    from hpo.validation import check_budgets

    objective = ([{"metric": "val_accuracy"}, {"metric": "val_loss", "direction": "minimize"}]
                 if name == "mo-asha" else {"metric": "val_accuracy"})
    spec = parse_spec({**BASE, "objective": objective,
                       "scheduler": {"name": name, "reduction_factor": 1.001}})
    with pytest.raises(SpecError) as info:
        check_budgets(spec)
    assert [e["loc"] for e in info.value.errors] == ["scheduler.reduction_factor"]
    assert "rungs from 1 to the trials' planned updates (23): at most 100" in \
        info.value.errors[0]["msg"]


@pytest.mark.parametrize("empty", ["training", "validation"])
@pytest.mark.parametrize("scheduler", ["fifo", "asha", "median"])
def test_a_task_with_an_empty_dataset_is_refused_when_the_study_starts(
        monkeypatch, empty, scheduler):
    """helper-32: a task whose training set was empty was accepted, and every trial then
    failed on it; the study now fails at its start naming the task."""
    from hpo.validation import check_budgets
    from tests.hpo.test_driver import toy_spec
    from tests.hpo.toy import HpoToyTask

    real = HpoToyTask.datasets

    def datasets(self, seed):
        train, val = real(self, seed)
        return ([], val) if empty == "training" else (train, [])

    spec = toy_spec("empty", scheduler={"name": scheduler})
    check_budgets(spec)  # the task's own datasets: nothing to refuse
    monkeypatch.setattr(HpoToyTask, "datasets", datasets)
    with pytest.raises(SpecError) as info:
        check_budgets(spec)
    assert info.value.errors == [{"loc": "task", "msg": f"task 'toy-hpo' gives an empty {empty} "
                                  "set with this config: every trial would fail"}]


TWO = [{"metric": "val_accuracy"}, {"metric": "val_loss", "direction": "minimize"}]


@pytest.mark.parametrize(("scheduler", "loc"), [
    ({"name": "asha", "grace_period": 500, "max_t": 1000}, "scheduler.grace_period"),
    ({"name": "mo-asha", "grace_period": 500, "max_t": 1000}, "scheduler.grace_period"),
    ({"name": "median", "grace_period": 24}, "scheduler.grace_period"),
    ({"name": "optuna-pruner", "pruner": {"name": "median", "n_warmup_steps": 30}},
     "scheduler.pruner.n_warmup_steps"),
    ({"name": "optuna-pruner", "pruner": {"name": "percentile", "percentile": 25.0,
                                          "n_warmup_steps": 24}},
     "scheduler.pruner.n_warmup_steps"),
    ({"name": "optuna-pruner", "pruner": {"name": "successive-halving",
                                          "min_resource": 40}}, "scheduler.pruner.min_resource"),
    ({"name": "optuna-pruner", "pruner": {"name": "successive-halving", "min_resource": 6,
                                          "min_early_stopping_rate": 1}},
     "scheduler.pruner.min_resource"),  # its first rung: 6 x 4
    ({"name": "optuna-pruner", "pruner": {"name": "hyperband", "min_resource": 40}},
     "scheduler.pruner.min_resource"),
    ({"name": "optuna-pruner", "pruner": {"name": "wilcoxon", "n_startup_steps": 24}},
     "scheduler.pruner.n_startup_steps"),
    ({"name": "optuna-pruner", "pruner": {"name": "patient", "patience": 1, "wrapped": {
        "name": "median", "n_warmup_steps": 100}}}, "scheduler.pruner.wrapped.n_warmup_steps"),
], ids=["asha", "mo-asha", "median", "median-pruner", "percentile", "successive-halving",
        "successive-halving-rate", "hyperband-pruner", "wilcoxon", "patient"])
def test_a_scheduler_that_would_never_judge_a_trial_is_refused_when_the_study_starts(
        scheduler, loc):
    """The breaker: ASHA with a max_t above the trials' 23 planned updates and its
    grace_period between the two was accepted, and ran as FIFO. Each scheduler and
    pruner whose first judgement lies beyond the planned updates is refused so."""
    from hpo.validation import check_budgets

    objective = TWO if scheduler["name"] == "mo-asha" else {"metric": "val_accuracy"}
    spec = parse_spec({**BASE, "objective": objective, "scheduler": scheduler})
    with pytest.raises(SpecError) as info:
        check_budgets(spec)
    step = int(info.value.errors[0]["msg"].split()[0])
    assert info.value.errors == [{"loc": loc, "msg": f"{step} is beyond the trials' 23 "
                                  "planned updates: no trial would ever be judged (the study "
                                  "would run as fifo)"}]
    check_budgets(spec, new=False)  # a stored study that ran so goes on so after a restart
    if "min_early_stopping_rate" not in str(scheduler):  # at the planned updates: accepted
        at = parse_spec({**BASE, "objective": objective,
                         "scheduler": _with(scheduler, loc, 23)})
        check_budgets(at)
    # a space whose values plan more updates (the review's finding): the most they plan
    searched = parse_spec({**BASE, "config": {}, "objective": objective,
                           "scheduler": scheduler, "search_space": {"max_epochs": {
                               "type": "int", "low": 1, "high": 200}}})
    check_budgets(searched)  # 200 epochs: 4600 updates (the config's 20: 460)
    batch = parse_spec({**BASE, "objective": objective, "scheduler": scheduler,
                        "search_space": {"micro_batch_size": {"type": "categorical",
                                                              "choices": [64, 16]}}})
    if step > 90:  # 16 a batch: 90 updates
        with pytest.raises(SpecError, match="beyond the trials' 90 planned updates"):
            check_budgets(batch)
    else:
        check_budgets(batch)


def _with(scheduler: dict, loc: str, value: int) -> dict:
    """``scheduler`` with the field at ``loc`` (``scheduler.a.b``) set to ``value``."""
    out = json.loads(json.dumps(scheduler))
    node, *path, last = [out, *loc.split(".")[1:]]
    for key in path:
        node = node[key]
    node[last] = value
    return out
