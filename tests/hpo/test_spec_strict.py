"""The spec at the boundary: integers are integers, and text is text that every storage keeps
(issue 11: ``config.max_epochs: 2.0`` was stored as a float; a lone surrogate or a NUL in a
key answered 500 or broke the study later)."""

from __future__ import annotations

import pytest

import trainers
from hpo.errors import SpecError
from hpo.spec import parse_spec
from tests.hpo.test_spec import BASE, _with

TASKS = ("digits", "charlm")


def _int_fields() -> list[tuple[str, str]]:
    """(task, field) for every int field of TrainConfig (with the first task) and of each
    built-in task's Options, derived from the dataclasses so that a new field is covered."""
    out = [(TASKS[0], info.name) for info in trainers.describe(trainers.TrainConfig)
           if info.kind == "int"]
    out += [(task, info.name) for task in TASKS for info in trainers.get_task(task).fields()
            if info.kind == "int"]
    return out


INT_FIELDS = _int_fields()


def _spec(task: str, **changes) -> dict:
    return {**_with(task=task, objective={"metric": "val_loss"}, search_space={}), **changes}


def test_the_int_fields_cover_the_training_config_and_both_tasks():
    names = {name for _, name in INT_FIELDS}
    assert {"max_epochs", "micro_batch_size", "grad_accum_steps", "eval_batch_size",
            "num_workers", "warmup_steps", "eval_interval", "checkpoint_interval",
            "keep_last_checkpoints", "seed", "early_stopping_patience", "width"} <= names
    assert {task for task, _ in INT_FIELDS} == set(TASKS)


@pytest.mark.parametrize("value", [2.0, 1.5, -0.0])
@pytest.mark.parametrize(("task", "name"), INT_FIELDS)
def test_a_float_for_an_int_option_is_refused_naming_the_field(task, name, value):
    config = {"max_epochs": 1, name: value} if name != "max_epochs" else {name: value}
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(task, config=config))
    assert info.value.errors == [{"loc": f"config.{name}",
                                  "msg": f"expected int, got float {value!r}"}]


@pytest.mark.parametrize(("task", "name"), INT_FIELDS)
def test_an_integral_float_choice_for_an_int_option_is_refused(task, name):
    config = {} if name == "max_epochs" else {"max_epochs": 1}
    with pytest.raises(SpecError) as info:
        parse_spec(_spec(task, config=config,
                         search_space={name: {"type": "categorical", "choices": [16.0]}}))
    assert info.value.errors == [{"loc": f"search_space.{name}.choices.0",
                                  "msg": "expected int, got float 16.0"}]


def test_a_float_for_a_search_space_int_bound_is_refused():
    for where in ("low", "high", "step"):
        param = {"type": "int", "low": 8, "high": 64, "step": 8, where: 16.0}
        with pytest.raises(SpecError) as info:
            parse_spec({**BASE, "search_space": {"width": param}})
        assert [e["loc"] for e in info.value.errors] == [f"search_space.width.{where}"]


def test_a_float_for_an_int_parameter_of_a_warm_start_point_is_refused():
    with pytest.raises(SpecError) as info:
        parse_spec({**BASE, "warm_start": [{"params": {"width": 16.0}}]})
    assert info.value.errors == [{"loc": "warm_start.0.params.width",
                                  "msg": "16.0 is outside the search space"}]


def test_integers_are_kept_as_integers():
    spec = parse_spec(_spec("digits", config={"max_epochs": 2, "micro_batch_size": 64}))
    assert spec.config == {"max_epochs": 2, "micro_batch_size": 64}
    assert type(spec.config["max_epochs"]) is int


@pytest.mark.parametrize("name", ["special", "node:10.0.0.1", "accelerator_type:A100",
                                  "team/a-b_c.d", "x" * 64])
def test_custom_resource_names_of_the_pattern_are_accepted(name):
    spec = parse_spec({**BASE, "resources": {"custom": {name: 1.0}}})
    assert spec.resources.custom == {name: 1.0}


@pytest.mark.parametrize("bad", ["\x00", "\ud800", "\x7f", "\x85"])
def test_a_key_or_string_with_a_control_character_or_surrogate_is_refused_at_parse(bad):
    with pytest.raises(SpecError) as info:
        parse_spec({**BASE, "config": {"max_epochs": 2, f"k{bad}": 1}})
    assert info.value.errors == [{
        "loc": "config.k" + bad.encode("unicode_escape").decode("ascii"),
        "msg": f"holds U+{ord(bad):04X} (a control character or lone surrogate); "
               "only printable text is accepted"}]
