"""``TrainConfig`` built directly is held to what ``create`` holds a mapping to, and the
optimizer and parallelism dispatch never takes an unknown name for the default."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
from torch import nn

from tests.trainers.cli_in_process import run_main
from trainers.config import TrainConfig
from trainers.errors import ConfigError
from trainers.fsdp import is_sharded
from trainers.optim import build_optimizer
from trainers.tasks import create


@pytest.mark.parametrize(("changes", "field", "reason"), [
    ({"optimizer": "adam"}, "optimizer", "must be one of ['adamw', 'sgd'], got 'adam'"),
    ({"parallelism": "zero3"}, "parallelism", "must be one of ['ddp', 'fsdp'], got 'zero3'"),
    ({"precision": "fp64"}, "precision", "must be one of ['fp32', 'bf16', 'fp16'], got 'fp64'"),
    ({"schedule": "cosnie"}, "schedule",
     "must be one of ['constant', 'linear', 'cosine', 'wsd'], got 'cosnie'"),
    ({"eval_with_ema": "no"}, "eval_with_ema", "expected bool, got str 'no'"),
    ({"compile": 1}, "compile", "expected bool, got int 1"),
    ({"micro_batch_size": 2.5}, "micro_batch_size", "expected int, got float 2.5"),
    ({"micro_batch_size": "4"}, "micro_batch_size", "expected int, got str '4'"),
    ({"max_epochs": True}, "max_epochs", "expected int, got bool True"),
    ({"lr": math.inf}, "lr", "must be a finite number, got inf"),
    ({"max_grad_norm": math.nan}, "max_grad_norm", "must be a finite number, got nan"),
    ({"device": None}, "device", "must not be null"),
    ({"checkpoint_dir": 3}, "checkpoint_dir", "expected str, got int 3"),
])
def test_trainconfig_built_directly_refuses_what_create_refuses(changes, field, reason):
    with pytest.raises(ConfigError) as direct:
        TrainConfig(**changes)
    assert (direct.value.field, direct.value.reason) == (field, reason)
    with pytest.raises(ConfigError) as built:
        create("digits", changes)
    assert (built.value.field, built.value.reason) == (field, reason)


def test_trainconfig_takes_an_int_for_a_float_field_as_a_float():
    config = TrainConfig(lr=1, weight_decay=0)
    assert (config.lr, type(config.lr), type(config.weight_decay)) == (1.0, float, float)
    assert type(config.replace(lr=2).lr) is float


def _unchecked(**changes) -> TrainConfig:
    """A config whose fields were changed behind validation's back."""
    config = TrainConfig()
    for name, value in changes.items():
        object.__setattr__(config, name, value)
    return config


def test_an_unknown_optimizer_is_never_built_as_adamw():
    with pytest.raises(ConfigError) as info:
        build_optimizer(nn.Linear(2, 2), _unchecked(optimizer="adam"))
    assert (info.value.field, info.value.reason) == ("optimizer",
                                                     "must be adamw or sgd, got 'adam'")


def test_an_unknown_parallelism_is_never_run_as_ddp():
    dist = SimpleNamespace(enabled=True)
    with pytest.raises(ConfigError) as info:
        is_sharded(_unchecked(parallelism="zero3"), dist)
    assert (info.value.field, info.value.reason) == ("parallelism",
                                                     "must be ddp or fsdp, got 'zero3'")
    assert is_sharded(_unchecked(parallelism="fsdp"), dist) is True
    assert is_sharded(TrainConfig(), dist) is False


@pytest.mark.parametrize("empty", ["", "  "])
def test_an_empty_checkpoint_dir_is_refused_not_taken_for_none(empty):
    with pytest.raises(ConfigError) as info:
        TrainConfig(checkpoint_dir=empty)
    assert (info.value.field, info.value.reason) == (
        "checkpoint_dir", f"must be a directory or null (no checkpoints), got {empty!r}")
    proc = run_main("digits", "--checkpoint-dir", empty)
    assert proc.returncode == 2
    assert proc.stderr.splitlines()[-1] == (
        f"trainers: error: --checkpoint-dir: must be a directory or null (no checkpoints), "
        f"got {empty!r}")


@pytest.mark.parametrize(("flag", "value", "message"), [
    # scikit-learn's train_test_split refused it with a traceback (exit 1)
    ("--split-seed", "4294967296", "must be in 0..4294967295, got 4294967296"),
    ("--split-seed", "-1", "must be in 0..4294967295, got -1"),
    ("--seed", "4294967296", "must be < 2**32, got 4294967296"),
    # each DataLoader worker is a process: 2**32 forked until the out-of-memory killer came
    ("--num-workers", "4294967296", "must be <= 256, got 4294967296"),
    ("--num-workers", "257", "must be <= 256, got 257"),
])
def test_seeds_and_worker_counts_beyond_what_their_consumers_take_are_one_line(
        flag, value, message):
    """The breaker's finding: these were checked for >= 0 only; ``hpo`` bounded them in
    specs, the ``trainers`` CLI and ``trainers.create`` did not."""
    proc = run_main("digits", flag, value, "--max-updates", "1")
    assert (proc.returncode, proc.stderr.splitlines()[-1]) == (
        2, f"trainers: error: {flag}: {message}")
    field = flag[2:].replace("-", "_")
    with pytest.raises(ConfigError) as info:
        create("digits", {field: int(value)})
    assert (info.value.field, info.value.reason) == (field, message)


def test_the_largest_split_seed_and_worker_count_are_taken():
    task, config = create("digits", {"split_seed": 2**32 - 1, "num_workers": 256})
    assert task.options.split_seed == 2**32 - 1 and config.num_workers == 256
    train, val = task.datasets(0)
    assert len(train) + len(val) == 1797
