"""A resume keeps the run it continues: the seed and the task's options other than its
``mutable_options`` cannot change (helper-38: a resumed ``split_seed`` validated on
images already trained on, a resumed ``seed`` reshuffled the epoch under way from the same
position), the hyperparameters and the mutable options can, and so can the options that
are paths. ``trainers --resume DIR`` takes no task word after DIR."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from tests.trainers.cli_in_process import run_main
from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import ConfigError, TrainConfig, fit
from trainers.checkpoint import list_checkpoints
from trainers.fields import option


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlacedOptions(RegressionOptions):
    data_dir: str = option("/data/a", "where the data lies", path=True)


class PlacedTask(RegressionTask):
    """The toy regression with a path option, and dropout mutable on resume."""

    name = "toy-regression-placed"
    Options = PlacedOptions
    mutable_options = frozenset({"dropout"})


def _config(root: Path, **changes) -> TrainConfig:
    base = dict(micro_batch_size=8, max_updates=4, max_epochs=None, eval_interval=2,
                checkpoint_dir=str(root), checkpoint_fsync=False, seed=7)
    return TrainConfig(**{**base, **changes})


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("run")
    fit(PlacedTask(PlacedOptions(dropout=0.1)), _config(root))
    return root


@pytest.mark.parametrize(("name", "options", "config"), [
    ("seed", {}, {"seed": 8}),
    ("n_samples", {"n_samples": 48}, {}),   # another training set
    ("hidden", {"hidden": 16}, {}),         # another model shape
    ("batch_norm", {"batch_norm": True}, {}),
])
def test_a_resume_that_changes_the_seed_or_a_fixed_option_is_refused_naming_it(
        trained, name, options, config):
    before = sorted(p.name for p in trained.iterdir())
    task = PlacedTask(PlacedOptions(dropout=0.1, **options))
    with pytest.raises(ConfigError) as info:
        fit(task, _config(trained, max_updates=6, **config), resume_from=trained)
    assert info.value.field == name
    assert "the checkpoint was made with" in str(info.value)
    assert sorted(p.name for p in trained.iterdir()) == before  # nothing written


@pytest.mark.parametrize(("options", "config"), [
    ({"dropout": 0.4}, {}),                       # a mutable option (PBT's)
    ({"data_dir": "/elsewhere/a"}, {}),           # a path: where the data lies
    ({}, {"lr": 0.5, "weight_decay": 0.1, "micro_batch_size": 4}),  # hyperparameters
])
def test_a_resume_may_change_hyperparameters_mutable_options_and_paths(
        trained, tmp_path, options, config):
    copy = tmp_path / "copy"
    copy.mkdir()
    for step, path in list_checkpoints(trained):
        if step == 4:
            shutil.copytree(path, copy / path.name)
    task = PlacedTask(PlacedOptions(**{"dropout": 0.1, **options}))
    result = fit(task, _config(copy, max_updates=6, **config), resume_from=copy)
    assert result.n_updates == 6


@pytest.mark.parametrize("args", [
    ["charlm", "--max-updates", "5"],
    ["--batch-norm", "false"],
    ["--quiet", "charlm"],
])
def test_a_word_after_resume_is_refused_naming_it(tmp_path, args):
    root = tmp_path / "ckpt"
    made = run_main("digits", "--width", "4", "--max-updates", "2", "--max-epochs", "none",
                    "--checkpoint-dir", str(root), "--quiet")
    assert made.returncode == 0, made.stderr
    before = sorted(p.name for p in root.iterdir())
    proc = run_main("--resume", str(root), *args)
    assert proc.returncode == 2, proc.stderr
    word = next(a for a in args if not a.startswith("-") and a not in {"5"})
    assert f"TASK: unexpected argument {word!r}" in proc.stderr
    assert sorted(p.name for p in root.iterdir()) == before


def test_the_cli_names_the_flag_of_a_changed_fixed_option(tmp_path):
    root = tmp_path / "ckpt"
    assert run_main("digits", "--width", "4", "--max-updates", "2", "--max-epochs", "none",
                    "--checkpoint-dir", str(root), "--quiet").returncode == 0
    proc = run_main("--resume", str(root), "--split-seed", "7", "--max-updates", "4")
    assert proc.returncode == 2
    assert "--split-seed: the checkpoint was made with split_seed=0, this run has 7" in \
        proc.stderr
    assert "Traceback" not in proc.stderr
