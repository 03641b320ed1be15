"""``hpo task new`` and ``hpo task check`` (issue 12, points 1 and 2)."""

from __future__ import annotations

import errno
import importlib
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.utils import canonicalize_name
from typer.testing import CliRunner

import trainers
from hpo.cli import app
from hpo.scaffold import ScaffoldError, check_name, module_name
from trainers.contract import RULES

REPO = Path(__file__).resolve().parents[2]
BROKEN = "tests.trainers.broken_tasks"

runner = CliRunner()


def check(target: str):
    result = runner.invoke(app, ["task", "check", target])
    lines = result.output.splitlines()
    statuses = {line.split()[1].rstrip(":"): line.split()[0] for line in lines[:len(RULES)]}
    return result, lines, statuses


def not_passed(statuses: dict[str, str]) -> dict[str, str]:
    return {rule: s for rule, s in statuses.items() if s != "PASS"}


# -- the check on tasks that each break one rule ----------------------------------------------

CASES = {  # class: (rules that do not pass, the FAIL line's start)
    "MeanLossTask": ({"loss-sum": "FAIL", "accumulation": "SKIP"},
                     "FAIL loss-sum [Task.loss_sum]: loss_sum returns a mean"),
    "MissingMetricTask": ({"metrics": "FAIL"},
                          "FAIL metrics [Task.eval_sums / Task.eval_metrics]: the task declares "
                          "['val_loss', 'val_r2'] but eval_metrics returns ['val_loss']"),
    "ReservedMetricTask": ({"metrics": "FAIL"},
                           "FAIL metrics [Task.eval_sums / Task.eval_metrics]: metric names "
                           "['done'] are keys every report holds already"),
    "NondeterministicTask": ({"determinism": "FAIL", "resume": "SKIP", "accumulation": "SKIP"},
                             "FAIL determinism [Task.datasets / Task.build_model / "
                             "Task.loss_sum]: two runs with seed 0 differ at micro-batch 1: "
                             "loss "),
    "NonResumableTask": ({"resume": "FAIL"},
                         "FAIL resume [Task.build_model]: resumed from the checkpoint of "
                         "update 2, update 4 differs"),
    "MutableShapeTask": ({"mutable-options": "FAIL"},
                         "FAIL mutable-options [Task.mutable_options]: hidden=9 changes the "
                         "shapes of ['0.bias', '0.weight', '3.weight']"),
    "UnpicklableTask": ({"pickle": "FAIL"},
                        "FAIL pickle [Task.__init__ / Options]: the task cannot be pickled "
                        "(TypeError: cannot pickle '_thread.lock' object)"),
    "BuildRaisesTask": ({"build": "FAIL", **{r: "SKIP" for r in RULES[3:]}},
                        "FAIL build [Task.datasets / Task.build_model]: raised RuntimeError: "
                        "no such layer: Linear3000"),
    "ExitsInBuildTask": ({"build": "FAIL", **{r: "SKIP" for r in RULES[3:]}},
                         "FAIL build [Task.datasets / Task.build_model]: raised SystemExit: 0"),
    "ShadowingOptionTask": ({"bounds": "FAIL"},
                            "FAIL bounds [Options]: option lr is named like the TrainConfig "
                            "field: one value would set both"),
    "ItemInBuildTask": ({"build": "FAIL", **{r: "SKIP" for r in RULES[3:]}},
                        "FAIL build [Task.datasets / Task.build_model]: parameter_count raised "
                        "RuntimeError: Tensor.item() cannot be called on meta tensors (the "
                        "checks build the model on PyTorch's meta device"),
    "UnprintableErrorTask": ({"build": "FAIL", **{r: "SKIP" for r in RULES[3:]}},
                             "FAIL build [Task.datasets / Task.build_model]: raised "
                             "UnprintableError: <UnprintableError whose message cannot be "
                             "shown>"),
    "WrongBoundTask": ({"bounds": "FAIL"},
                       "FAIL bounds [Options]: option width documents 64 as valid"),
    # the training rules cannot run when the loop's evaluation has no objective to read
    "MissingObjectiveTask": ({"metrics": "FAIL", "determinism": "SKIP", "resume": "SKIP",
                              "accumulation": "SKIP"},
                             "FAIL metrics [Task.eval_sums / Task.eval_metrics]: the task "
                             "declares ['val_loss', 'val_mae'] but eval_metrics returns "
                             "['val_loss']"),
    "NoisyLossTask": ({"loss-sum": "FAIL", "accumulation": "SKIP"},
                      "FAIL loss-sum [Task.loss_sum]: loss_sum is not deterministic: the same "
                      "batch of 8 items gave "),
}


@pytest.mark.parametrize("cls", sorted(CASES))
def test_check_names_the_broken_rule_and_exits_1(cls):
    result, lines, statuses = check(f"{BROKEN}:{cls}")
    expected, fail_line = CASES[cls]
    assert result.exit_code == 1, result.output
    assert list(statuses) == list(RULES)
    assert not_passed(statuses) == expected
    assert [line for line in lines if line.startswith("FAIL")][0].startswith(fail_line)
    assert lines[-1] == f"{len(expected)} of {len(RULES)} rules did not pass"


def test_a_mean_loss_is_refused_saying_why_a_sum_and_how_to_write_one():
    _, lines, _ = check(f"{BROKEN}:MeanLossTask")
    line = next(line for line in lines if line.startswith("FAIL loss-sum"))
    assert "divides each micro-batch's loss_sum by the number of items" in line
    assert "of the whole accumulation group" in line
    assert 'reduction="sum"' in line and "mask of real tokens" in line


def test_a_rule_whose_premise_failed_is_skipped_naming_the_premise():
    _, lines, _ = check(f"{BROKEN}:MissingObjectiveTask")
    skipped = [line for line in lines if line.startswith("SKIP")]
    assert skipped == ["SKIP determinism: needs metrics", "SKIP resume: needs metrics, "
                       "determinism", "SKIP accumulation: needs metrics, determinism"]
    assert not any("KeyError" in line for line in lines)


def test_a_nondeterministic_loss_is_called_so_not_a_mean():
    _, lines, _ = check(f"{BROKEN}:NoisyLossTask")
    line = next(line for line in lines if line.startswith("FAIL loss-sum"))
    assert "mean" not in line and "divided twice" not in line
    assert "with the model in eval mode" in line and "Fix: " in line
    assert "SKIP accumulation: needs loss-sum" in lines


@pytest.mark.parametrize("target", ["tests.trainers.toy_tasks:RegressionTask",
                                    "tests.trainers.toy_tasks:TokenTask"])
def test_check_passes_tasks_that_keep_the_contract(target):
    result, lines, statuses = check(target)
    assert result.exit_code == 0, result.output
    assert statuses == {rule: "PASS" for rule in RULES}
    assert lines[-1] == f"all {len(RULES)} rules passed"


@pytest.mark.parametrize("target, why", [
    ("no-such-task", "unknown task 'no-such-task'"),
    ("no_such_module_12:Task", "cannot import 'no_such_module_12:Task': ModuleNotFoundError"),
    ("tests.trainers.toy_tasks:flat_params", "is not a trainers.Task subclass"),
    ("trainers:Task", "'trainers:Task' names the abstract base Task; give your subclass"),
    ("trainers.tasks.base:Task", "names the abstract base Task; give your subclass"),
    (f"{BROKEN}:AbstractRegressionTask", f"'{BROKEN}:AbstractRegressionTask' names an "
                                         "abstract class (abstract: loss_sum); give a "
                                         "subclass that defines them"),
])
def test_a_target_that_names_no_task_fails_the_import_rule(target, why):
    result, lines, statuses = check(target)
    assert result.exit_code == 1
    assert statuses == {"import": "FAIL", **{r: "SKIP" for r in RULES[1:]}}
    assert lines[0].startswith("FAIL import [entry point / module]: ") and why in lines[0]
    # an abstract class is found: installing it again would not help
    assert ("pip install DIR" in lines[0]) is ("abstract" not in why)


# -- the scaffold -----------------------------------------------------------------------------


@pytest.mark.parametrize("name, why", [
    ("My Task", "must be 1-40 characters of a-z, 0-9, _ and -"),
    ("9lives", "starting with a letter"),
    # pip refuses a distribution name ending in - or _ (PEP 508)
    ("a-b-c-", "ending with a letter or digit"),
    ("x_", "ending with a letter or digit"),
    ("a--b", "no two of _ and - in a row"),
    ("a_-b", "no two of _ and - in a row"),
    ("class", "is a Python keyword"),
    ("digits", "a task named 'digits' is already registered"),
    ("json", "a module named 'json' is already importable here"),
    ("sitecustomize", "which Python imports at every start of an interpreter"),  # helper-41
    ("usercustomize", "which Python imports at every start of an interpreter"),
])
def test_new_refuses_a_bad_name_naming_the_argument(tmp_path, name, why):
    result = runner.invoke(app, ["task", "new", name, str(tmp_path / "pkg")])
    assert result.exit_code == 2
    assert result.output.startswith("error: NAME: ")
    assert why in " ".join(result.output.split())
    assert not (tmp_path / "pkg").exists()


@pytest.mark.parametrize("name", ["a", "x1", "my-task", "a_b-c", "a1-b2_c3", "z" * 40])
def test_new_accepts_names_that_name_a_distribution_a_module_and_an_entry_point(name,
                                                                               monkeypatch):
    # the rule of names alone: what this environment has installed (the README's own-task
    # steps pip-install ``my-task`` into the project's venv) is the json case above
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *args: None
                        if module == module_name(name) else find_spec(module, *args))
    check_name(name, [])
    assert canonicalize_name(name, validate=True) == name.replace("_", "-")  # PEP 508, as pip
    assert module_name(name).isidentifier()


@pytest.mark.parametrize("name", ["a-b-c-", "x_", "a--b", "a__b", "-a", "_a", "a" * 41, "a.b"])
def test_new_refuses_every_name_pip_or_python_would_mangle(name):
    with pytest.raises(ScaffoldError, match="^NAME: "):
        check_name(name, [])


@pytest.mark.parametrize("name", ["tests", "build", "dist"])
def test_new_refuses_a_name_whose_package_would_be_a_directory_of_the_project(
        name, monkeypatch):
    """The breaker: ``hpo task new tests DIR`` made the package ``tests/``, and the scaffold's
    own ``tests/test_task.py`` landed inside it and shipped with it."""
    monkeypatch.setattr(importlib.util, "find_spec", lambda module, *args: None)
    with pytest.raises(ScaffoldError, match=f"^NAME: '{name}' would name the package "
                                            f"directory {name}/"):
        check_name(name, [])


def test_new_refuses_a_directory_inside_a_file(tmp_path):
    (tmp_path / "afile").write_text("mine")
    result = runner.invoke(app, ["task", "new", "fresh-task", str(tmp_path / "afile" / "sub")])
    assert result.exit_code == 2
    assert result.output == f"error: DIR: cannot create {tmp_path / 'afile' / 'sub'}: Not a " \
                            "directory\n"
    assert [p.name for p in tmp_path.iterdir()] == ["afile"]


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
def test_new_refuses_a_directory_that_cannot_be_created():
    result = runner.invoke(app, ["task", "new", "fresh-task", "/proc/hpo-task-new"])
    assert result.exit_code == 2
    assert result.output == "error: DIR: cannot create /proc/hpo-task-new: No such file or " \
                            "directory\n"


@pytest.mark.parametrize("existing", [False, True])
def test_a_failed_write_leaves_nothing_behind(tmp_path, monkeypatch, existing):
    """Disk full on the third file: what was written is removed; a DIR given empty stays."""
    directory = tmp_path / "new" / "pkg"
    if existing:
        directory.mkdir(parents=True)
    write_text, n_written = Path.write_text, []

    def full_disk(self, text, *args, **kwargs):
        if len(n_written) == 2:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(self))
        n_written.append(self)
        return write_text(self, text, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", full_disk)
    result = runner.invoke(app, ["task", "new", "fresh-task", str(directory)])
    assert result.exit_code == 2
    assert result.output == f"error: DIR: cannot write {directory / 'fresh_task' / '__init__.py'}" \
                            ": No space left on device\n"
    assert [p.name for p in tmp_path.iterdir()] == (["new"] if existing else [])
    assert not existing or list(directory.iterdir()) == []


def test_new_refuses_a_non_empty_directory(tmp_path):
    (tmp_path / "notes.txt").write_text("mine")
    result = runner.invoke(app, ["task", "new", "fresh-task", str(tmp_path)])
    assert result.exit_code == 2
    assert " ".join(result.output.split()) == \
        f"error: DIR: {tmp_path} is not empty; give a new or empty directory"
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]


def install_scaffold(tmp_path: Path, name: str) -> tuple[Path, Path]:
    """Scaffold task ``name`` into tmp_path/pkg and ``pip install`` it into tmp_path/site
    (no dependencies, no index: the venv already has torch); return both directories."""
    package, site = tmp_path / "pkg", tmp_path / "site"
    result = runner.invoke(app, ["task", "new", name, str(package)])
    assert result.exit_code == 0, result.output
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index",
                    "--no-build-isolation", "--target", str(site), str(package)],
                   check=True, capture_output=True)
    return package, site


@pytest.fixture
def forget_module(monkeypatch):
    """Drop the scaffolded package's modules after the test."""
    names: list[str] = []
    yield names.append
    for module in list(sys.modules):
        if module.split(".")[0] in names:
            del sys.modules[module]
    importlib.invalidate_caches()


@pytest.mark.slow  # 6.5 s here (2 idle cores)
def test_the_scaffold_installs_and_passes_the_check_and_its_own_test_unchanged(
        tmp_path, monkeypatch, forget_module):
    package, site = install_scaffold(tmp_path, "my-task")
    forget_module("my_task")
    files = sorted(str(p.relative_to(package)) for p in package.rglob("*")
                   if p.is_file() and "build" not in p.parts and ".egg-info" not in str(p))
    assert files == ["README.md", "my_task/__init__.py", "my_task/task.py", "pyproject.toml",
                     "tests/test_task.py"]
    source = (package / "my_task" / "task.py").read_text()
    assert source.count("# REPLACE:") >= 6 and 'reduction="sum"' in source
    assert '[project.entry-points."hpo.trainers"]\nmy-task = "my_task.task:MyTaskTask"' in \
        (package / "pyproject.toml").read_text()

    monkeypatch.syspath_prepend(str(site))
    assert "my-task" in trainers.list_tasks()
    result, _, statuses = check("my-task")
    assert result.exit_code == 0, result.output
    assert statuses == {rule: "PASS" for rule in RULES}
    assert statuses and "PASS bounds (11 bound(s))" in result.output

    # its own test: a few updates of training, and the contract
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    run = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                          "tests"], cwd=package, env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed" in run.stdout


def test_check_finds_module_colon_class_in_the_current_directory(
        tmp_path, monkeypatch, forget_module):
    package = tmp_path / "pkg"
    assert runner.invoke(app, ["task", "new", "here-task", str(package)]).exit_code == 0
    forget_module("here_task")
    monkeypatch.chdir(package)
    monkeypatch.setattr(sys, "path", [p for p in sys.path if p not in ("", str(package))])
    result, _, statuses = check("here_task.task:HereTaskTask")
    assert result.exit_code == 0, result.output
    assert statuses == {rule: "PASS" for rule in RULES}


@pytest.mark.parametrize("given, shown", [("my-task", "./my-task"), ("./my-task", "./my-task"),
                                          ("sub dir/my-task", "'./sub dir/my-task'")])
def test_new_says_to_install_the_directory_as_a_path_not_a_pypi_name(
        tmp_path, monkeypatch, given, shown):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["task", "new", "fresh-task", given])
    assert result.exit_code == 0, result.output
    bin_dir = Path(sys.executable).parent  # this environment's tools, not a bare pip
    pip, hpo = (str(bin_dir / tool) if (bin_dir / tool).exists() else tool
                for tool in ("pip", "hpo"))
    assert result.output.splitlines()[-1] == \
        f"next: {pip} install {shown} && {hpo} task check fresh-task"
    assert pip != "pip"  # (the tests run in the project's venv, which has pip)


def test_the_reserved_result_keys_hold_ray_tunes_own():
    """trainers does not import Ray: its list of the keys Tune adds to a report is checked
    against Tune's here."""
    from ray.tune import result

    from trainers.reporting import RESERVED_RESULT_KEYS
    assert set(result.AUTO_RESULT_KEYS) | {result.DONE, result.SHOULD_CHECKPOINT,
                                           result.TRIAL_ID, result.EXPERIMENT_TAG} \
        <= RESERVED_RESULT_KEYS


def test_a_nested_class_is_checked_as_trainers_load_task_takes_it():
    result, lines, _ = check(f"{BROKEN}:Outer.Inner")
    assert result.exit_code == 0, result.output
    assert lines[-1] == "all 10 rules passed"
