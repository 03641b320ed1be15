"""What of a task's code Ray ships to the trials (hpo.taskcode, issue 12 point 3)."""

from __future__ import annotations

import importlib.abc
import importlib.util
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import trainers
from hpo.taskcode import SHIP_EXCLUDES, module_paths, task_code


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
    assert code.paths == (str(site / "shipme"),)
    assert code.runtime_env() == {"py_modules": [str(site / "shipme")],
                                  "excludes": list(SHIP_EXCLUDES)}
    assert trainers.load_task(code.target).name == "pkg-task"


def test_a_single_file_module_ships_the_file(site):
    code = task_code("file-task")
    assert code.target == "onefile:FileTask"
    assert code.paths == (str(site / "onefile.py"),)


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


class _MappedFinder(importlib.abc.MetaPathFinder):
    """An editable install's finder: the package ``alt_task`` lives in folder ``src_code``."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder

    def find_spec(self, name, path=None, target=None):
        if name != "alt_task":
            return None
        return importlib.util.spec_from_file_location(
            name, self.folder / "__init__.py", submodule_search_locations=[str(self.folder)])


@pytest.fixture
def named_elsewhere(tmp_path, monkeypatch):
    """Three modules whose folder or file is named otherwise than their import name: a
    package through a symlink (``alias -> realpkg/src_v2``), a single file through one
    (``solo2.py -> solo_impl.py``), and an editable install's mapped package (``alt_task``
    in ``src_code/``); each defines ``WHO``."""
    site = tmp_path / "site"
    site.mkdir()
    real = tmp_path / "realpkg" / "src_v2"
    real.mkdir(parents=True)
    (real / "__init__.py").write_text("WHO = 'alias'\n")
    (site / "alias").symlink_to(real)
    (tmp_path / "solo_impl.py").write_text("WHO = 'solo2'\n")
    (site / "solo2.py").symlink_to(tmp_path / "solo_impl.py")
    mapped = tmp_path / "src_code"
    mapped.mkdir()
    (mapped / "__init__.py").write_text("WHO = 'alt_task'\n")
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.setattr(sys, "meta_path", [_MappedFinder(mapped), *sys.meta_path])
    yield site, mapped
    for name in ["alias", "solo2", "alt_task"]:
        sys.modules.pop(name, None)


def test_a_module_named_otherwise_than_its_folder_ships_under_its_import_name(
        named_elsewhere):
    """helper-41: the paths were resolved, and Ray names a shipped module after the path's
    last component: trials failed with ``No module named 'alias'``."""
    site, mapped = named_elsewhere
    assert module_paths("alias") == (str(site / "alias"),)  # the link, not its target
    assert module_paths("solo2") == (str(site / "solo2.py"),)
    (link,) = module_paths("alt_task")
    assert Path(link).name == "alt_task" and Path(link).resolve() == mapped
    assert module_paths("alt_task") == (link,)  # the same link each time
    import shutil  # a temp cleaner removes the folder of links (helper-43)
    shutil.rmtree(Path(link).parent.parent)
    assert module_paths("alt_task") == (link,) and Path(link).resolve() == mapped


SHIPPED_IMPORTS = textwrap.dedent("""
    import importlib, json, sys
    import ray
    ray.init(address="local", num_cpus=1, include_dashboard=False, logging_level="ERROR",
             runtime_env={"py_modules": sys.argv[1:], "excludes": %r})

    @ray.remote(num_cpus=1)
    def who():
        return [importlib.import_module(top).WHO for top in ["alias", "solo2", "alt_task"]]

    print(json.dumps(ray.get(who.remote(), timeout=120)))
    ray.shutdown()
""") % (list(SHIP_EXCLUDES),)


@pytest.mark.ray  # a Ray of its own: a runtime env of local paths is set at ray.init only
def test_ray_imports_each_shipped_module_by_its_name(named_elsewhere, tmp_path):
    paths = [p for top in ["alias", "solo2", "alt_task"] for p in module_paths(top)]
    proc = subprocess.run([sys.executable, "-c", SHIPPED_IMPORTS, *paths], cwd=tmp_path,
                          capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == ["alias", "solo2", "alt_task"]
