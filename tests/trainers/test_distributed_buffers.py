"""BatchNorm buffers under DDP and FSDP2: every rank reads rank 0's (one model's).

Each rank updates its running statistics from its own samples; DDP broadcasts rank
0's only at a forward that syncs gradients, FSDP2 never. Before, the EMA folded in
each rank's own buffers, every rank evaluated its shard with them and a checkpoint
kept one rank's: a resumed run's EMA (DDP) and reports (FSDP) differed from the
uninterrupted run's, and a model file's evaluation missed the run's metrics.
"""

from __future__ import annotations

import contextlib

import pytest
import torch

from tests.trainers.bn_worker import CONFIG, OPTIONS, RESUMES, VARIANTS
from tests.trainers.torchrun import rank_results
from tests.trainers.toy_tasks import RegressionTask
from trainers import TrainConfig
from trainers.distributed import DistInfo
from trainers.evaluation import evaluate

pytestmark = pytest.mark.slow  # one torchrun, 2 ranks, 9 runs: about 20 s on 2 idle cores


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return rank_results("tests.trainers.bn_worker", tmp_path_factory.mktemp("bn"), timeout=400)


def _assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor], what) -> None:
    assert list(a) == list(b), what
    for key in a:
        assert torch.equal(a[key], b[key]), (what, key)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_resume_is_bit_identical_on_every_rank(ranks, name):
    for r, got in enumerate(ranks):
        full = got[(name, None)]
        for step in RESUMES:
            resumed = got[(name, step)]
            _assert_equal(resumed["model"], full["model"], (r, step, "model"))
            if full["ema"] is not None:
                _assert_equal(resumed["ema"], full["ema"], (r, step, "ema"))
            assert resumed["val_loss"] == full["val_loss"][-len(resumed["val_loss"]):]
            # a breaker: resumed between evaluations, every rank took rank 0's loss window
            assert resumed["train_loss"] == full["train_loss"][-len(resumed["train_loss"]):]
    # both ranks hold one model: rank 0's buffers
    _assert_equal(ranks[1][(name, None)]["model"], ranks[0][(name, None)]["model"], name)


@pytest.mark.parametrize("name", list(VARIANTS))
def test_the_final_weights_evaluated_in_one_process_give_the_reported_val_loss(ranks, name):
    got = ranks[0][(name, None)]
    task = RegressionTask(OPTIONS)
    model = task.build_model(TrainConfig(**CONFIG, **VARIANTS[name]))
    model.load_state_dict(got["ema"] or got["model"])
    _, val_set = task.datasets(0)
    metrics = evaluate(task, model, val_set, DistInfo(0, 1, 0, torch.device("cpu")),
                       contextlib.nullcontext, CONFIG["micro_batch_size"])
    assert abs(metrics["val_loss"] - got["val_loss"][-1]) <= 1e-6
