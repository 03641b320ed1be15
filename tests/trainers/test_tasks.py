"""Built-in tasks on real data, and the task registry with installed entry points."""

from __future__ import annotations

import sys
import textwrap

import numpy as np
import pytest
import torch

from trainers import ConfigError, ListReporter, TrainConfig, UnknownTaskError, fit
from trainers.tasks import create, get_task, list_tasks
from trainers.tasks.charlm import CharLMTask, stdlib_files


@pytest.mark.slow  # 8 s here (2 idle cores)
def test_digits_default_config_reaches_97_percent():
    task, config = create("digits")
    result = fit(task, config)
    assert result.metrics["val_accuracy"] >= 0.97
    assert len(task.datasets(0)[0]) + len(task.datasets(0)[1]) == 1797


def test_digits_split_is_stratified_and_seeded():
    task, _ = create("digits", {"split_seed": 3})
    _, val = task.datasets(0)
    labels = val.tensors[1].bincount(minlength=10)
    assert labels.min() >= 35 and labels.max() <= 37  # 360 images, 10 balanced classes
    _, again = create("digits", {"split_seed": 3})[0].datasets(5)
    assert (again.tensors[1] == val.tensors[1]).all()


@pytest.mark.slow  # 60-75 s on 2 cores
def test_charlm_default_corpus_is_the_stdlib_and_val_loss_falls_below_unigram_entropy(tmp_path):
    assert len(stdlib_files()) > 100
    task, config = create("charlm", {"cache_dir": str(tmp_path)})
    corpus = task.corpus()
    assert 4_000_000 < len(corpus.tokens) < 6_000_000
    entropy = corpus.unigram_entropy_nats()
    reporter = ListReporter()
    result = fit(task, config.replace(max_updates=240, eval_interval=80), reporter)
    assert result.metrics["val_loss"] < entropy - 0.6
    assert result.metrics["val_bpc"] == pytest.approx(result.metrics["val_loss"] / 0.693147, 1e-4)
    assert reporter.reports[-1]["tokens_per_s"] > 0
    # the token file is cached: a second task reads the same memory map
    assert CharLMTask(task.options).corpus().tokens.filename == corpus.tokens.filename


def test_registry_lists_builtin_tasks_with_fields_and_metrics():
    assert {"digits", "charlm"} <= set(list_tasks())
    digits = get_task("digits")
    assert digits.metrics == {"val_loss": "minimize", "val_accuracy": "maximize"}
    assert {f.name for f in digits.fields()} >= {"width", "depth", "dropout"}
    with pytest.raises(UnknownTaskError, match="unknown task 'nope'"):
        get_task("nope")


def test_create_splits_params_and_names_bad_ones():
    task, config = create("digits", {"lr": 0.01, "width": 8, "max_epochs": 1})
    assert (config.lr, config.max_epochs, task.options.width) == (0.01, 1, 8)
    assert config.micro_batch_size == 64  # from the task's default_config
    with pytest.raises(ConfigError) as info:
        create("digits", {"widht": 8})
    assert info.value.field == "widht"
    with pytest.raises(ConfigError) as info:
        create("digits", {"dropout": 1.5})
    assert info.value.field == "dropout"
    with pytest.raises(ConfigError) as info:
        create("charlm", {"n_head": 3})
    assert info.value.field == "n_head"
    # asked of a task without blocks to recompute: an error, never a silent no-op
    with pytest.raises(ConfigError) as info:
        create("digits", {"activation_checkpointing": True})
    assert info.value.field == "activation_checkpointing"
    assert create("charlm", {"activation_checkpointing": True})[1].activation_checkpointing
    task, config = create("digits", {"max_epochs": 1})  # a config changed by hand: fit refuses
    with pytest.raises(ConfigError) as info:
        fit(task, config.replace(activation_checkpointing=True))
    assert info.value.field == "activation_checkpointing"


@pytest.mark.parametrize("windows", [0, 10_000_001, 2**58])
def test_charlm_windows_per_epoch_is_bounded(windows):
    """Each epoch draws every window's offset up front: 2**58 windows (in a member's spec,
    a model file's options) asked an allocation of 2 EiB, a worker's OOM kill."""
    with pytest.raises(ConfigError) as info:
        create("charlm", {"windows_per_epoch": windows})
    assert (info.value.field, info.value.reason) == (
        "windows_per_epoch", f"must be in 1..10,000,000, got {windows}")


def test_charlm_draws_the_most_windows_in_80_mb(tmp_path):
    from trainers.data import TokenWindows

    windows = TokenWindows(np.zeros(64, dtype=np.uint8), 8, 10_000_000, seed=0)
    assert windows.starts.dtype == torch.int64 and windows.starts.numel() == 10_000_000
    x, y = windows[9_999_999]
    assert x.shape == y.shape == (8,) and x.dtype == torch.int64


def test_installed_task_is_found_through_the_entry_point_group(tmp_path, monkeypatch):
    pkg = tmp_path / "mytasks"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from tests.trainers.toy_tasks import RegressionTask

        class MyTask(RegressionTask):
            name = "my-task"
    """))
    dist_info = tmp_path / "mytasks-1.0.dist-info"
    dist_info.mkdir()
    (dist_info / "METADATA").write_text("Metadata-Version: 2.1\nName: mytasks\nVersion: 1.0\n")
    (dist_info / "entry_points.txt").write_text("[hpo.trainers]\nmy-task = mytasks:MyTask\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert "my-task" in list_tasks()
    task, config = create("my-task", {"max_updates": 2, "max_epochs": None, "hidden": 3})
    assert task.options.hidden == 3
    assert fit(task, config).n_updates == 2
    sys.modules.pop("mytasks", None)


def _install(site, dist: str, entry: str) -> None:
    info = site / f"{dist}-1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(f"[hpo.trainers]\n{entry}\n")


def test_entry_points_are_read_once_and_again_on_a_miss_or_a_removal(tmp_path, monkeypatch):
    import shutil

    from trainers import tasks

    reads = []
    real = tasks.importlib.metadata.entry_points
    monkeypatch.setattr(tasks.importlib.metadata, "entry_points",
                        lambda **kw: reads.append(kw) or real(**kw))
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "cachedtasks.py").write_text(
        "from tests.trainers.toy_tasks import RegressionTask\n"
        "class A(RegressionTask):\n    name = 'cached-a'\n")
    _install(tmp_path, "cached_a", "cached-a = cachedtasks:A")
    assert tasks.task_target("digits") == "trainers.tasks.digits:DigitsTask" and reads == []
    assert get_task("cached-a").__name__ == "A"  # a miss of the last reading: read again
    n = len(reads)
    assert get_task("cached-a").__name__ == "A" and len(reads) == n  # the reading kept
    _install(tmp_path, "cached_b", "cached-b = cachedtasks:A")  # installed after the reading
    assert tasks.task_target("cached-b") == "cachedtasks:A" and len(reads) == n + 1
    # removed: its module and entry point gone, the reading still has it; the import
    # fails, a fresh reading tells it is not installed any more
    shutil.rmtree(tmp_path / "cached_b-1.0.dist-info")
    _install(tmp_path, "cached_c", "cached-c = gonetasks:A")
    tasks.task_target("cached-c")
    shutil.rmtree(tmp_path / "cached_c-1.0.dist-info")
    with pytest.raises(UnknownTaskError):
        get_task("cached-c")
    # moved while installed: the cached target's module is gone, or has no such class
    (tmp_path / "movedtasks.py").write_text(
        "from tests.trainers.toy_tasks import RegressionTask\n"
        "class B(RegressionTask):\n    name = 'cached-m'\n")
    for gone in ("gonetasks:A", "cachedtasks:Gone"):
        _install(tmp_path, "cached_m", f"cached-m = {gone}")
        tasks.task_target("cached-m")
        shutil.rmtree(tmp_path / "cached_m-1.0.dist-info")
        _install(tmp_path, "cached_m", "cached-m = movedtasks:B")
        assert get_task("cached-m").__name__ == "B", gone
        shutil.rmtree(tmp_path / "cached_m-1.0.dist-info")
    # an old reading is read again
    monkeypatch.setattr(tasks, "ENTRY_POINTS_MAX_AGE_S", 0.0)
    n = len(reads)
    with pytest.raises(UnknownTaskError):
        tasks.task_target("cached-b")
    assert len(reads) > n
    sys.modules.pop("cachedtasks", None)
    sys.modules.pop("movedtasks", None)


def test_a_name_registered_twice_is_the_first_on_the_path_with_a_warning(tmp_path,
                                                                         monkeypatch, caplog):
    """helper-41: the later, lower-priority registration won, silently."""
    from trainers import tasks

    first, second = tmp_path / "first", tmp_path / "second"
    _install(first, "twice_a", "twice-task = twice_first:Task")
    _install(second, "twice_b", "twice-task = twice_second:Task")
    monkeypatch.syspath_prepend(str(second))
    monkeypatch.syspath_prepend(str(first))  # first on sys.path
    with caplog.at_level("WARNING", logger="trainers.tasks"):
        assert tasks.task_target("twice-task") == "twice_first:Task"
        assert tasks.list_tasks().count("twice-task") == 1
    assert [r.getMessage() for r in caplog.records] == [
        "task 'twice-task' is registered twice: twice_first:Task is used, "
        "twice_second:Task is not"]  # once, however often the entry points are read


def test_a_task_option_named_like_a_train_config_field_is_refused_naming_it():
    from tests.trainers.broken_tasks import ShadowingOptionTask

    for params in ({"lr": 0.01}, {}):
        with pytest.raises(ConfigError) as info:
            create(ShadowingOptionTask, params)
        assert info.value.field == "task"
        assert str(info.value) == (
            "task: the task class tests.trainers.broken_tasks.ShadowingOptionTask has an "
            "option named like the TrainConfig field 'lr': rename the option")


def test_config_validation_names_the_field():
    bad = [("lr", 0.0), ("micro_batch_size", 0), ("ema_decay", 1.0), ("min_lr_ratio", 2.0),
           ("device", "tpu"), ("max_grad_norm", -1.0), ("momentum", 1.0)]
    for field, value in bad:
        with pytest.raises(ConfigError) as info:
            TrainConfig(**{field: value})
        assert info.value.field == field
    with pytest.raises(ConfigError, match="max_updates"):
        TrainConfig(max_updates=None, max_epochs=None)
    with pytest.raises(ConfigError, match="precision"):
        create("digits", {"precision": "fp8"})
    with pytest.raises(ConfigError, match="lr"):
        create("digits", {"lr": "fast"})
    with pytest.raises(ConfigError, match="lr"):
        create("digits", {"lr": float("nan")})


def test_charlm_corpus_too_small_or_too_varied_is_named(tmp_path):
    tiny = tmp_path / "tiny.txt"
    tiny.write_text("abc")
    with pytest.raises(ConfigError) as info:
        create("charlm", {"corpus": str(tiny)})
    assert info.value.field == "corpus" and "too small" in info.value.reason
    wide = tmp_path / "wide.txt"
    wide.write_text("".join(chr(c) for c in range(0x10000, 0x10000 + 70_000)))
    task, _ = create("charlm", {"corpus": str(wide), "cache_dir": str(tmp_path / "cache")})
    with pytest.raises(ConfigError, match="distinct characters"):
        task.corpus()
    assert not [p for p in (tmp_path / "cache").iterdir() if p.name.startswith(".tmp-")]


@pytest.mark.parametrize("name", ["max_epochs", "micro_batch_size", "seed", "width"])
def test_create_refuses_a_float_for_an_int_field_even_when_integral(name):
    with pytest.raises(ConfigError) as info:
        create("digits", {name: 2.0})
    assert (info.value.field, info.value.reason) == (name, "expected int, got float 2.0")


def test_a_task_registered_under_another_name_than_its_class_says_can_be_evaluated(
        tmp_path, monkeypatch):
    """The breaker: entry point ``renamed-task`` naming a class whose ``name`` is
    ``something-else`` trained, but its checkpoints and model files recorded the class's
    name, and ``trainers evaluate`` then answered "unknown task 'something-else'"."""
    from trainers.checkpoint import latest_checkpoint
    from trainers.model_file import evaluate_model, model_from_checkpoint

    (tmp_path / "renamedtasks.py").write_text(
        "from tests.trainers.toy_tasks import RegressionTask\n"
        "class OtherNameTask(RegressionTask):\n    name = 'something-else'\n")
    _install(tmp_path, "renamedtasks", "renamed-task = renamedtasks:OtherNameTask")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        task, config = create("renamed-task", {"max_updates": 2, "max_epochs": None,
                                               "checkpoint_dir": str(tmp_path / "ck")})
        assert task.name == "renamed-task"
        result = fit(task, config)
        model = model_from_checkpoint(latest_checkpoint(tmp_path / "ck"))
        assert model["task"] == "renamed-task"
        assert evaluate_model(model)["val_loss"] == pytest.approx(result.metrics["val_loss"],
                                                                  abs=1e-6)
        # a class (as a trial loads it from shipped code) keeps its own name
        assert create(get_task("renamed-task"))[0].name == "something-else"
    finally:
        sys.modules.pop("renamedtasks", None)


@pytest.mark.parametrize(("fraction", "n_val"), [(0.001, 2), (0.005, 9), (0.9945, 1788),
                                                 (0.999, 1796)])
def test_digits_val_fraction_that_leaves_a_class_out_of_a_side_is_named(fraction, n_val):
    with pytest.raises(ConfigError) as info:
        create("digits", {"val_fraction": fraction})
    assert info.value.field == "val_fraction"
    assert info.value.reason == (
        f"must hold out 10 to 1787 of the 1797 images (one per class on either side of the "
        f"split), got {fraction} ({n_val} images)")


@pytest.mark.parametrize(("fraction", "n_val"), [(0.0051, 10), (0.9944, 1787)])
def test_digits_val_fraction_at_the_bounds_splits(fraction, n_val):
    task, _ = create("digits", {"val_fraction": fraction})
    train, val = task.datasets(seed=0)
    assert (len(train), len(val)) == (1797 - n_val, n_val)


@pytest.mark.parametrize("where", ["a_file", "a_file/below", "/proc/nope"])
def test_charlm_cache_dir_that_cannot_hold_the_cache_is_named(where, tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("abcdefgh " * 200)
    (tmp_path / "a_file").write_text("")
    cache_dir = where if where.startswith("/") else str(tmp_path / where)
    task, _ = create("charlm", {"corpus": str(corpus), "cache_dir": cache_dir,
                                "block_size": 8})
    with pytest.raises(ConfigError) as info:
        task.corpus()
    assert info.value.field == "cache_dir"
    assert info.value.reason.startswith(f"cannot keep the token cache in {cache_dir}: ")
