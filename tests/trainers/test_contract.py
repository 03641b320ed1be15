"""``trainers.contract``: the task contract's rules (issue 12, point 2); the CLI's tests are in
``tests/hpo/test_task_cli.py``."""

from __future__ import annotations

import sys
import types

import pytest
import torch.utils.data

import trainers.contract._static as static
from tests.trainers.broken_tasks import (
    AbstractRegressionTask,
    BuildRaisesTask,
    MeanLossTask,
    MissingMetricTask,
    MissingObjectiveTask,
    NoisyLossTask,
)
from tests.trainers.toy_tasks import RegressionTask
from trainers import Task, TrainConfig
from trainers.contract import (
    RULES,
    WHY_SUM,
    RuleResult,
    TaskLoadError,
    check_target,
    check_task,
    creation_violations,
    load_task,
)
from trainers.contract import documented_bounds as bounds
from trainers.fields import FieldInfo


def info(kind: str, help_text: str) -> FieldInfo:
    return FieldInfo("x", kind, 1, help_text, nullable=False)


@pytest.mark.parametrize("kind, help_text, expected", [
    ("int", "channels of every conv layer (1..512)", [1, 512]),
    ("int", "context length in characters (8..4096)", [8, 4096]),
    ("float", "dropout before the classifier, in [0, 1)", [0.0]),
    ("float", "final LR as a fraction of lr, in [0, 1]", [0.0, 1.0]),
    ("float", "fraction held out, (0, 0.5]", [0.5]),
    ("float", "fraction held out, (0, 1)", []),
    ("int", "random training windows per epoch (>= 1)", [1]),
    ("int", "heads (>= 2, <= 16)", [2, 16]),
    ("float", "decay in [1e-3, 2.5]", [0.001, 2.5]),
    ("int", "seed, in [0, 2**32)", []),
    ("int", "attention heads; must divide d_model", []),
    ("str", "a name (1..8)", []),
])
def test_documented_bounds_are_the_closed_ends_of_the_help_text(kind, help_text, expected):
    found = bounds(info(kind, help_text))
    assert found == expected
    assert all(type(v) is (int if kind == "int" else float) for v in found)


@pytest.mark.parametrize("task", ["digits", "charlm"])
def test_the_builtin_tasks_keep_the_contract(task):
    results = list(check_target(task))
    assert [r.rule for r in results] == list(RULES)
    assert [r.line() for r in results if not r.ok] == []


def test_result_lines_name_rule_method_and_fix():
    assert RuleResult("pickle", "PASS").line() == "PASS pickle"
    assert RuleResult("bounds", "PASS", detail="6 bound(s)").line() == "PASS bounds (6 bound(s))"
    assert RuleResult("resume", "FAIL", "Task.build_model", "differs. Fix: x").line() == \
        "FAIL resume [Task.build_model]: differs. Fix: x"
    assert RuleResult("resume", "SKIP", "", "needs determinism").line() == \
        "SKIP resume: needs determinism"


CONFIG = TrainConfig(max_updates=1, max_epochs=None, device="cpu")


def test_creation_finds_a_missing_metric_and_a_raising_build_model():
    assert creation_violations(RegressionTask(), CONFIG) == []
    assert creation_violations(MissingMetricTask(), CONFIG) == [RuleResult(
        "metrics", "FAIL", "Task.eval_sums / Task.eval_metrics",
        "the task declares ['val_loss', 'val_r2'] but eval_metrics returns ['val_loss']")]
    assert creation_violations(BuildRaisesTask(), CONFIG) == [RuleResult(
        "build", "FAIL", "Task.datasets / Task.build_model",
        "raised RuntimeError: no such layer: Linear3000")]


class EmptyValidationTask(RegressionTask):
    def datasets(self, seed: int):
        train_set, val_set = super().datasets(seed)
        return train_set, torch.utils.data.Subset(val_set, [])


def test_creation_refuses_an_empty_validation_set():
    assert creation_violations(EmptyValidationTask(), CONFIG) == [RuleResult(
        "build", "FAIL", "Task.datasets / Task.build_model", "the validation dataset is empty")]


def test_creation_builds_no_model_above_the_parameter_limit(monkeypatch):
    # RegressionTask's MLP has 4*8 + 8 + 8 + 1 = 49 parameters
    monkeypatch.setattr(static, "CREATION_CHECK_MAX_PARAMS", 48)
    assert creation_violations(MissingMetricTask(), CONFIG) == []
    monkeypatch.setattr(static, "CREATION_CHECK_MAX_PARAMS", 49)
    assert [r.rule for r in creation_violations(MissingMetricTask(), CONFIG)] == ["metrics"]


@pytest.mark.parametrize("cls, why", [
    (Task, "'x:T' names the abstract base Task; give your subclass"),
    (AbstractRegressionTask, "'x:T' names an abstract class (abstract: loss_sum); give a "
                             "subclass that defines them"),
])
def test_load_task_refuses_abstract_classes(monkeypatch, cls, why):
    monkeypatch.setitem(sys.modules, "x", types.SimpleNamespace(T=cls))
    with pytest.raises(TaskLoadError) as raised:
        load_task("x:T")
    assert str(raised.value) == why and raised.value.fix == ""


def test_a_loss_that_differs_on_the_same_batch_is_not_called_a_mean():
    result = static._check_loss_sum(NoisyLossTask())
    assert (result.status, result.method) == ("FAIL", "Task.loss_sum")
    assert result.detail.startswith("loss_sum is not deterministic: the same batch of 8 items "
                                    "gave ")
    assert WHY_SUM not in result.detail
    assert static._check_loss_sum(MeanLossTask()).detail.startswith("loss_sum returns a mean")


def test_the_training_rules_need_the_objective_not_every_metric():
    statuses = {r.rule: r.line() for r in check_task(MissingObjectiveTask) if not r.ok}
    assert statuses == {
        "metrics": "FAIL metrics [Task.eval_sums / Task.eval_metrics]: the task declares "
                   "['val_loss', 'val_mae'] but eval_metrics returns ['val_loss']. Fix: "
                   "return exactly the keys of metrics",
        "determinism": "SKIP determinism: needs metrics",
        "resume": "SKIP resume: needs metrics, determinism",
        "accumulation": "SKIP accumulation: needs metrics, determinism"}



def test_process_state_kept_goes_back_from_a_removed_folder(tmp_path, caplog):
    """helper-43: a task that chdir'ed into a folder it then removed left the process
    without a working directory."""
    import os
    import tempfile

    from trainers.contract import process_state_kept

    cwd = os.getcwd()
    with (caplog.at_level("WARNING", logger="trainers.contract"),
          process_state_kept("task 'gone'"), tempfile.TemporaryDirectory(dir=tmp_path) as d):
        os.chdir(d)
    assert os.getcwd() == cwd
    assert [r.getMessage() for r in caplog.records] == [
        "task 'gone' changed the working directory (a removed folder): put back"]


def test_process_state_kept_runs_one_tasks_code_at_a_time(tmp_path):
    """helper-43: a second request's task saved the first task's folder as the process's
    own, and put it back after the first had restored the real one."""
    import os
    import threading

    from trainers.contract import process_state_kept

    cwd, inside, order = os.getcwd(), threading.Event(), []

    def first() -> None:
        with process_state_kept("task 'first'"):
            os.chdir(tmp_path)
            inside.set()
            order.append("first in")
            threading.Event().wait(0.3)
            order.append("first out")

    def second() -> None:
        inside.wait()
        with process_state_kept("task 'second'"):
            order.append("second in")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert order == ["first in", "first out", "second in"] and os.getcwd() == cwd



def test_a_reserved_metric_name_is_refused_at_creation_whatever_the_models_size():
    """helper-43: the check came after the cut-off above which creation evaluates nothing."""
    from tests.trainers.broken_tasks import ReservedMetricTask
    from trainers.contract import CREATION_CHECK_MAX_PARAMS

    class Big(ReservedMetricTask):
        def parameter_count(self, config) -> int:
            return CREATION_CHECK_MAX_PARAMS + 1

    (result,) = creation_violations(Big(), CONFIG)
    assert (result.rule, result.status) == ("metrics", "FAIL")
    assert result.detail.startswith("metric names ['done'] are keys every report holds")


@pytest.mark.parametrize("message, hinted", [
    ("Tensor.item() cannot be called on meta tensors", True),
    ("Cannot copy out of meta tensor; no data!", True),
    ("aten::nonzero is not implemented for the 'meta' device", True),
    ("No package metadata was found for vtask", False),
    ("metaclass conflict", False)])
def test_the_meta_device_hint_is_for_meta_tensor_errors_only(message, hinted):
    from trainers.contract import _base

    text = _base._exc(RuntimeError(message))
    assert ("PyTorch's meta device" in text) is hinted
