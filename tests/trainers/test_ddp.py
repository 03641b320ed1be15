"""DDP under torchrun (2 processes, gloo, CPU) equals one process with the same effective batch."""

from __future__ import annotations

import pytest
import torch

from tests.trainers.ddp_worker import CONFIG, OPTIONS
from tests.trainers.torchrun import rank_results
from tests.trainers.toy_tasks import RegressionTask, flat_params
from trainers import ListReporter, TrainConfig, fit

pytestmark = pytest.mark.slow  # the torchrun of the module fixture: 8 s here (2 idle cores)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("ddp")
    return rank_results("tests.trainers.ddp_worker", out), out


def test_parameters_identical_on_both_ranks_and_equal_single_process(ranks):
    (r0, r1), _ = ranks
    assert torch.equal(r0["params"], r1["params"])
    # one process, micro-batch 8 x 2 accumulation = the same effective batch of 16
    single = fit(RegressionTask(OPTIONS), TrainConfig(micro_batch_size=8, **CONFIG))
    assert (flat_params(single.model) - r0["params"]).abs().max().item() <= 1e-6


def test_each_epoch_a_new_order_and_every_sample_once(ranks):
    (r0, r1), _ = ranks
    per_rank_epoch = 32  # 64 samples over 2 ranks
    for epoch in range(3):
        a = r0["seen"][epoch * per_rank_epoch:(epoch + 1) * per_rank_epoch]
        b = r1["seen"][epoch * per_rank_epoch:(epoch + 1) * per_rank_epoch]
        assert sorted(a + b) == list(range(64))
    assert r0["seen"][:32] != r0["seen"][32:64]


def test_gradient_sync_only_on_last_micro_batch_of_each_group(ranks):
    (r0, r1), _ = ranks
    for r in (r0, r1):
        # 3 epochs x 4 updates (32 samples per rank / 8) x 2 micro-batches
        assert r["sync"] == [False, True] * (3 * 4)


def test_metrics_reduced_across_ranks_and_only_rank_0_writes(ranks):
    (r0, r1), out = ranks
    assert r0["reports"] == [
        {**r, "time_s": r0["reports"][i]["time_s"],
         "samples_per_s": r0["reports"][i]["samples_per_s"],
         "peak_memory_bytes": r0["reports"][i]["peak_memory_bytes"]}
        for i, r in enumerate(r1["reports"])]
    single = ListReporter()
    fit(RegressionTask(OPTIONS), TrainConfig(micro_batch_size=8, **CONFIG), single)
    assert len(single.reports) == len(r0["reports"]) == 6  # 12 updates, evaluated every 2
    for s, d in zip(single.reports, r0["reports"], strict=True):
        assert s["step"] == d["step"] and s["samples"] == d["samples"]
        assert abs(s["train_loss"] - d["train_loss"]) <= 1e-6
        assert abs(s["val_loss"] - d["val_loss"]) <= 1e-6
    assert r0["writes"] and not r1["writes"]
    assert (out / "ckpt" / "checkpoint-00000012").is_dir()
