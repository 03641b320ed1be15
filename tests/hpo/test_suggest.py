"""Errors that teach (issue 14.8): unknown spec fields, task options, search-space
parameters and metrics get "did you mean"; the study-name rule is said in words."""

from __future__ import annotations

import copy

import pytest

from hpo.errors import SpecError
from hpo.spec import parse_spec
from hpo.suggest import closest

BASE = {"name": "s", "task": "digits", "config": {"max_epochs": 1},
        "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
        "objective": {"metric": "val_accuracy"}, "sampler": {"name": "tpe", "seed": 0},
        "scheduler": {"name": "asha", "grace_period": 2, "max_t": 8},
        "budget": {"n_trials": 4}}


def _errors(change) -> dict[str, str]:
    data = copy.deepcopy(BASE)
    change(data)
    with pytest.raises(SpecError) as caught:
        parse_spec(data)
    return {e["loc"]: e["msg"] for e in caught.value.errors}


@pytest.mark.parametrize("change, loc, msg", [
    (lambda d: d["budget"].update(n_trails=3), "budget.n_trails",
     "not a field here (did you mean 'n_trials'?); fields here: max_concurrent_trials, "
     "n_trials, stop_when, timeout_s"),
    (lambda d: d.update(samplr={"name": "tpe"}), "samplr",
     "not a field here (did you mean 'sampler'?); fields here: budget, checkpoint_interval_s, "
     "config, constraints, keep_models, max_failures, name, objective, objective_reduce, "
     "resources, sampler, scheduler, search_space, task, warm_start"),
    (lambda d: d["search_space"]["lr"].update(lw=1), "search_space.lr.lw",
     "not a field here (did you mean 'low'?); fields here: high, log, low, step, type"),
    (lambda d: d["scheduler"].update(grace_perod=2), "scheduler.grace_perod",
     "not a field here (did you mean 'grace_period'?); fields here: brackets, grace_period, "
     "max_t, name, reduction_factor"),
    (lambda d: d["budget"].update(zzz=1), "budget.zzz",
     "not a field here; fields here: max_concurrent_trials, n_trials, stop_when, timeout_s"),
])
def test_an_unknown_spec_field_names_the_fields_allowed_there(change, loc, msg):
    assert _errors(change) == {loc: msg}


def test_task_options_parameters_and_metrics_suggest_the_name_meant():
    errors = _errors(lambda d: d["config"].update(learning_rate=0.1))
    assert errors == {"config.learning_rate": "not a training option nor an option of task "
                                              "'digits' (did you mean 'lr'?)"}
    errors = _errors(lambda d: d["search_space"].update(batch_size=d["search_space"].pop("lr")))
    assert errors["search_space.batch_size"].startswith(
        "not a parameter of task 'digits' (did you mean 'micro_batch_size'?); parameters: ")
    errors = _errors(lambda d: d["objective"].update(metric="val_acuracy"))
    assert errors["objective.metric"].endswith("not 'val_acuracy' (did you mean "
                                               "'val_accuracy'?)")


@pytest.mark.parametrize("name", ["bad name", "-starts-with-dash", "x" * 65, ""])
def test_the_study_name_rule_is_said_in_words(name):
    assert _errors(lambda d: d.update(name=name)) == {
        "name": "must be 1 to 64 characters: letters, digits, '_', '.' and '-', starting "
                "with a letter or a digit"}


def test_closest_prefers_the_known_alias_and_says_nothing_when_far():
    assert closest("learning_rate", ["lr", "learning_rate_decay"]) == "lr"
    assert closest("epochs", ["max_epochs", "max_updates"]) == "max_epochs"
    assert closest("colour", ["lr", "width"]) is None
    assert closest("lr", ["lr"]) is None  # the name itself is not a suggestion
