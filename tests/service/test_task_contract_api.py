"""Installed tasks seen by the service: listed by ``GET /v1/tasks`` once installed, refused at
study creation when they break the cheap part of the task contract (issue 12, points 1, 3)."""

from __future__ import annotations

import pytest

import trainers
from service.routers import tasks
from tests.hpo.test_task_cli import forget_module, install_scaffold  # noqa: F401 - a fixture
from tests.service.conftest import bearer
from tests.service.test_studies_api import _stored

ENTRY_POINTS = {
    "broken-import": "no_such_module_12.tasks:Task",
    "broken-metric": "tests.trainers.broken_tasks:MissingMetricTask",
    "broken-build": "tests.trainers.broken_tasks:BuildRaisesTask",
    "mean-loss": "tests.trainers.broken_tasks:MeanLossTask",
    "init-raises": "tests.trainers.broken_tasks:InitRaisesTask",
    "exits-import": "tests.trainers.exits_at_import:ExitsTask",
    "exits-build": "tests.trainers.broken_tasks:ExitsInBuildTask",
    "chdir-task": "tests.trainers.broken_tasks:ChdirTask",
    "reserved-metric": "tests.trainers.broken_tasks:ReservedMetricTask",
    "bad-objective": "tests.trainers.broken_tasks:UndeclaredObjectiveTask",
    "item-build": "tests.trainers.broken_tasks:ItemInBuildTask",
    "counted-item": "tests.trainers.broken_tasks:CountedItemTask",
}


@pytest.fixture
def installed(tmp_path, monkeypatch):
    """The tasks of ENTRY_POINTS registered as an installed package would register them."""
    dist_info = tmp_path / "user_tasks-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: user-tasks\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[hpo.trainers]\n" + "".join(f"{k} = {v}\n" for k, v in ENTRY_POINTS.items()))
    monkeypatch.syspath_prepend(str(tmp_path))
    tasks.describe_tasks.cache_clear()
    yield
    tasks.describe_tasks.cache_clear()


def spec(task: str) -> dict:
    return {"name": "s1", "task": task, "config": {"max_updates": 2, "max_epochs": None},
            "search_space": {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True}},
            "objective": {"metric": "val_loss"}, "sampler": {"name": "random", "seed": 0},
            "budget": {"n_trials": 1}}


@pytest.mark.parametrize("task, msg", [
    ("broken-import", "task 'broken-import' breaks the task contract, rule 'import': "
                      "ModuleNotFoundError: No module named 'no_such_module_12' "
                      "(`hpo task check broken-import` runs every rule)"),
    ("broken-metric", "task 'broken-metric' breaks the task contract, rule 'metrics': the task "
                      "declares ['val_loss', 'val_r2'] but eval_metrics returns ['val_loss'] "
                      "(`hpo task check broken-metric` runs every rule)"),
    ("broken-build", "task 'broken-build' breaks the task contract, rule 'build': raised "
                     "RuntimeError: no such layer: Linear3000 "
                     "(`hpo task check broken-build` runs every rule)"),
    # sys.exit is no Exception: it was a plain-text 500 (helper-41)
    ("exits-import", "task 'exits-import' breaks the task contract, rule 'import': "
                     "SystemExit: 3 (`hpo task check exits-import` runs every rule)"),
    ("exits-build", "task 'exits-build' breaks the task contract, rule 'build': raised "
                    "SystemExit: 0 (`hpo task check exits-build` runs every rule)"),
    ("reserved-metric", "task 'reserved-metric' breaks the task contract, rule 'metrics': "
                        "metric names ['done'] are keys every report holds already (the "
                        "loop's: epoch, grad_norm, loss_scale, lr, peak_memory_bytes, "
                        "planned_updates, samples, samples_per_s, skipped_updates, step, "
                        "time_s, tokens_per_s, train_loss; the reporter's: done, "
                        "training_iteration, node_id, ...). Fix: name them otherwise, e.g. "
                        "val_done (`hpo task check reserved-metric` runs every rule)"),
])
def test_a_task_that_breaks_the_contract_at_creation_answers_422_naming_task_and_rule(
        client, tokens, app, installed, task, msg):
    r = client.post("/v1/studies", json=spec(task), headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"] == [{"loc": "task", "msg": msg}]
    assert _stored(app) == ([], [])


RAISED = "(a task refuses a value with trainers.ConfigError)"


@pytest.mark.parametrize("change, details", [
    # the breaker: a task's __init__ raising anything but ConfigError answered 500
    ({"config": {"max_updates": 2, "max_epochs": None, "hidden": 16}},
     [{"loc": "task", "msg": "task 'init-raises' breaks the task contract, rule 'build': "
                             "creating it with this spec's config raised RuntimeError: hidden "
                             "units over 8 need the GPU kernel (`hpo task check init-raises` "
                             "runs every rule)"}]),
    ({"config": {"max_updates": 3, "max_epochs": None}},  # check_config raising KeyError
     [{"loc": "task", "msg": "task 'init-raises' breaks the task contract, rule 'build': "
                             "creating it with this spec's config raised KeyError: 'schedule "
                             "table' (`hpo task check init-raises` runs every rule)"}]),
    ({"search_space": {"hidden": {"type": "int", "low": 4, "high": 16}}},  # one value
     [{"loc": "search_space.hidden.high",
       "msg": f"the task raised RuntimeError: hidden units over 8 need the GPU kernel for "
              f"this value {RAISED}"}]),
    ({"config": {"max_epochs": 1},
      "search_space": {"max_updates": {"type": "int", "low": 1, "high": 4}}},
     [{"loc": "search_space.max_updates.high",
       "msg": f"the task raised KeyError: 'schedule table' for this value {RAISED}"}]),
])
def test_a_task_that_raises_while_created_answers_422_naming_where(
        client, tokens, app, installed, change, details):
    r = client.post("/v1/studies", json={**spec("init-raises"), **change},
                    headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"] == details
    assert _stored(app) == ([], [])


def test_a_contract_break_creation_cannot_see_leaves_the_study_created(client, tokens,
                                                                       installed):
    # a mean loss shows only when training: hpo task check finds it, creation does not
    r = client.post("/v1/studies", json=spec("mean-loss"), headers=bearer(tokens["alice"]))
    assert r.status_code == 201, r.text


def test_an_installed_scaffold_is_listed_by_get_tasks(client, tokens, tmp_path, monkeypatch,
                                                      forget_module):  # noqa: F811 - fixture
    _, site = install_scaffold(tmp_path, "listed-task")
    forget_module("listed_task")
    monkeypatch.syspath_prepend(str(site))
    tasks.describe_tasks.cache_clear()
    try:
        body = client.get("/v1/tasks", headers=bearer(tokens["bob"])).json()
    finally:
        tasks.describe_tasks.cache_clear()
    listed = next(t for t in body["tasks"] if t["name"] == "listed-task")
    assert listed["metrics"] == {"val_loss": "minimize", "val_accuracy": "maximize"}
    assert listed["objective"] == "val_accuracy"
    assert [o["name"] for o in listed["options"]] == [
        "n_samples", "n_features", "n_classes", "hidden", "dropout", "data_seed"]
    assert "listed-task" in trainers.list_tasks()


def test_a_package_that_exits_at_import_is_listed_with_its_error(client, tokens, installed):
    """helper-41: one installed package calling sys.exit as it is imported made GET /v1/tasks
    a 500 for everyone."""
    r = client.get("/v1/tasks", headers=bearer(tokens["bob"]))
    assert r.status_code == 200
    listed = {t["name"]: t for t in r.json()["tasks"]}
    assert listed["exits-import"]["error"] == "SystemExit: 3"
    assert listed["broken-build"]["error"] is None


def test_get_tasks_shows_a_package_installed_while_the_service_runs(client, tokens, tmp_path,
                                                                  monkeypatch):
    """helper-41: the first description was kept for the process's life, while creating a
    study saw the new package at once."""
    tasks.describe_tasks.cache_clear()
    before = client.get("/v1/tasks", headers=bearer(tokens["bob"])).json()
    assert "late-task" not in [t["name"] for t in before["tasks"]]
    dist_info = tmp_path / "late-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: late\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text(
        "[hpo.trainers]\nlate-task = tests.trainers.broken_tasks:MeanLossTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        after = client.get("/v1/tasks", headers=bearer(tokens["bob"])).json()
    finally:
        tasks.describe_tasks.cache_clear()
    assert "late-task" in [t["name"] for t in after["tasks"]]


def test_a_task_that_changes_the_working_directory_leaves_the_service_where_it_was(
        client, tokens, installed, caplog):
    """helper-41: a task's os.chdir in datasets() moved the service's relative database and
    results paths for every later study."""
    import os

    import torch

    cwd = os.getcwd()
    with caplog.at_level("WARNING", logger="trainers.contract"):
        r = client.post("/v1/studies", json=spec("chdir-task"), headers=bearer(tokens["alice"]))
    assert r.status_code in (201, 422), r.text
    assert os.getcwd() == cwd and torch.get_default_dtype() == torch.float32
    assert "task 'chdir-task' changed the working directory (/), torch's default dtype " \
           "(torch.float64): put back" in [rec.getMessage() for rec in caplog.records]


def test_an_objective_the_task_does_not_report_blames_the_task_class(client, tokens,
                                                                    installed):
    """helper-41: the error named config.early_stopping_metric, which the spec did not set,
    and the class's own name attribute instead of the registered one."""
    r = client.post("/v1/studies", json=spec("bad-objective"), headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["details"] == [{"loc": "task", "msg": (
        "the task class tests.trainers.broken_tasks.UndeclaredObjectiveTask declares objective "
        "'acc', which is not one of its metrics ['val_loss']")}]


def test_a_build_model_that_reads_a_tensor_value_is_told_of_the_meta_device(client, tokens,
                                                                           installed):
    """helper-41: refused under the wrong rule with no word of the meta device; with its
    own parameter_count, as the message says, the task is accepted."""
    r = client.post("/v1/studies", json=spec("item-build"), headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text
    (detail,) = r.json()["error"]["details"]
    assert detail["loc"] == "task" and "rule 'build': raised RuntimeError: Tensor.item() " \
        "cannot be called on meta tensors (the checks build the model on PyTorch's meta " \
        "device" in detail["msg"] and "override Task.parameter_count" in detail["msg"]
    r = client.post("/v1/studies", json=spec("counted-item"), headers=bearer(tokens["alice"]))
    assert r.status_code == 201, r.text
