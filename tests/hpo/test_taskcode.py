"""What of a task's code Ray ships to the trials (hpo.taskcode, issue 12 point 3)."""

from __future__ import annotations

import sys
import textwrap

import pytest

import trainers
from hpo.taskcode import SHIP_EXCLUDES, task_code


def _register(site, dist: str, entry_points: str) -> None:
    info = site / f"{dist}-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[hpo.trainers]\n{entry_points}\n")


@pytest.fixture
def site(tmp_path, monkeypatch):
    """A directory on this process's path holding a package task and a single-file task."""
    body = textwrap.dedent("""
        from tests.trainers.toy_tasks import RegressionTask

        class {cls}(RegressionTask):
            name = "{name}"
    """)
    (tmp_path / "shipme").mkdir()
    (tmp_path / "shipme" / "__init__.py").write_text("")
    (tmp_path / "shipme" / "tasks.py").write_text(body.format(cls="PkgTask", name="pkg-task"))
    (tmp_path / "onefile.py").write_text(body.format(cls="FileTask", name="file-task"))
    _register(tmp_path, "shipme", "pkg-task = shipme.tasks:PkgTask")
    _register(tmp_path, "onefile", "file-task = onefile:FileTask")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in ["shipme", "shipme.tasks", "onefile"]:
        sys.modules.pop(name, None)


def test_a_built_in_task_ships_nothing():
    code = task_code("digits")
    assert code.target == "trainers.tasks.digits:DigitsTask" and code.paths == ()
    assert code.runtime_env() is None


def test_an_installed_package_ships_its_top_level_directory(site):
    code = task_code("pkg-task")
    assert code.target == "shipme.tasks:PkgTask"
    assert code.paths == (str((site / "shipme").resolve()),)
    assert code.runtime_env() == {"py_modules": [str((site / "shipme").resolve())],
                                  "excludes": list(SHIP_EXCLUDES)}
    assert trainers.load_task(code.target).name == "pkg-task"


def test_a_single_file_module_ships_the_file(site):
    code = task_code("file-task")
    assert code.target == "onefile:FileTask"
    assert code.paths == (str((site / "onefile.py").resolve()),)


def test_a_trial_loads_its_task_by_target_without_the_registry(site):
    cls = trainers.load_task("onefile:FileTask")
    task, config = trainers.create(cls, {"max_updates": 2, "max_epochs": None, "hidden": 3})
    assert task.options.hidden == 3 and trainers.fit(task, config).n_updates == 2
    with pytest.raises(ValueError, match="module:Class"):
        trainers.load_task("onefile")
    with pytest.raises(TypeError, match="not a trainers Task"):
        trainers.load_task("onefile:FileTask.name")
    with pytest.raises(ModuleNotFoundError, match="no_such_module"):
        trainers.load_task("no_such_module:Task")
