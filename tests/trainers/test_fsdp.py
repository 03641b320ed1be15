"""FSDP2 under torchrun (2 processes, gloo, CPU): exactness, sharded checkpoints, resume.

Two torchrun launches serve every test (``fsdp_worker.py``): ``main`` (FSDP and
DDP runs of one config, a resume mid-epoch, a resume of a 1-process checkpoint,
charlm in bf16 and fp16) and ``kill`` (both ranks killed while writing a
checkpoint). Each launch has a timeout, so a hang fails.
"""

from __future__ import annotations

import subprocess
import sysconfig
from pathlib import Path

import pytest
import torch

from tests.trainers.fsdp_worker import CONFIG, OPTIONS
from tests.trainers.torchrun import rank_results, torchrun
from tests.trainers.toy_tasks import RegressionTask, flat_params
from trainers import CheckpointError, ListReporter, TrainConfig, fit
from trainers import checkpoint as ckpt
from trainers.checkpoint_read import load_checkpoint

pytestmark = pytest.mark.slow  # about 30 s on 2 idle cores

VOLATILE = ("time_s", "samples_per_s", "tokens_per_s", "peak_memory_bytes")


def _torchrun(mode: str, out: Path) -> subprocess.CompletedProcess:
    return torchrun("tests.trainers.fsdp_worker", mode, str(out))


def _stable(reports: list[dict]) -> list[dict]:
    return [{k: v for k, v in r.items() if not k.startswith(VOLATILE)} for r in reports]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp")
    stdlib = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    (out / "corpus.txt").write_text("".join(p.read_text() for p in stdlib[:3])[:40_000])
    # a 1-process FSDP-config run: a sharded checkpoint of world size 1 at update 4
    fit(RegressionTask(OPTIONS), TrainConfig(micro_batch_size=8, checkpoint_dir=str(out / "single"),
                                             **{**CONFIG, "max_updates": 4}))
    main = _torchrun("main", out)
    assert main.returncode == 0, main.stderr[-3000:]
    killed = _torchrun("kill", out)
    assert killed.returncode != 0  # SIGKILL by design
    ranks = [torch.load(out / f"rank{r}.pt", weights_only=False) for r in (0, 1)]
    return ranks, out


def test_fsdp_parameters_equal_the_single_process_run_with_the_same_effective_batch(runs):
    (r0, r1), _ = runs
    assert torch.equal(r0["full"], r1["full"]) and r0["n_updates"] == 12
    # one process, micro-batch 8 x 2 accumulation = 2 ranks x 4 x 2: 16 per update
    single = fit(RegressionTask(OPTIONS), TrainConfig(micro_batch_size=8,
                                                      **{**CONFIG, "parallelism": "ddp"}))
    assert (flat_params(single.model) - r0["full"]).abs().max().item() <= 1e-6


def test_fsdp_equals_ddp_on_the_same_config_grad_norm_included(runs):
    (r0, _), _ = runs
    assert (r0["ddp"] - r0["full"]).abs().max().item() <= 1e-6
    for f, d in zip(r0["reports"], r0["ddp_reports"], strict=True):
        assert f["step"] == d["step"] and f["samples"] == d["samples"]
        for key in ("train_loss", "val_loss", "grad_norm", "lr"):
            assert abs(f[key] - d[key]) <= 1e-6, key


def test_gradient_sync_only_on_the_last_micro_batch_of_each_group(runs):
    (r0, r1), _ = runs
    assert r0["syncs"] == r1["syncs"] == [False, True] * 12  # 12 updates x 2 micro-batches


def test_metrics_reduced_across_ranks_and_peak_memory_reported_per_rank(runs):
    (r0, r1), _ = runs
    assert _stable(r0["reports"]) == _stable(r1["reports"])
    for report in r0["charlm_reports"]:
        assert report["peak_memory_bytes_rank0"] == report["peak_memory_bytes"] > 0
        assert report["peak_memory_bytes_rank1"] > 0
    assert _stable(r0["charlm_reports"]) == _stable(r1["charlm_reports"])


def test_resume_mid_epoch_is_bit_identical(runs):
    (r0, r1), _ = runs
    # checkpoint-00000006: half-way through the second epoch (4 updates per epoch)
    assert torch.equal(r0["resumed"], r0["full"]) and torch.equal(r1["resumed"], r1["full"])
    assert _stable(r0["resumed_reports"]) == _stable(r0["reports"][3:])


def test_checkpoint_is_one_directory_of_dcp_shards_of_every_rank(runs):
    _, out = runs
    path = out / "fsdp" / "checkpoint-00000006"
    names = {p.name for p in path.iterdir()}
    assert names == {".metadata", "__0_0.distcp", "__1_0.distcp", "meta.json", "train_state.pt"}
    state = torch.load(path / "train_state.pt", weights_only=True)
    assert state["world_size"] == 2 and len(state["rng"]) == 2
    assert state["trainer"]["step"] == 6 and state["trainer"]["position"] == 16
    with pytest.raises(CheckpointError, match="parallelism=fsdp"):
        load_checkpoint(path)  # the single-file loader refuses it by name


def test_world_size_1_to_2_loads_and_training_continues(runs):
    (r0, _), _ = runs
    assert r0["grown_updates"] == 12 and r0["grown_finite"]
    assert [r["step"] for r in r0["grown_reports"]] == [6, 8, 10, 12]


def test_kill_during_a_checkpoint_write_leaves_the_previous_one_loadable_into_1_process(runs):
    _, out = runs
    root = out / "killed"
    assert [step for step, _ in ckpt.list_checkpoints(root)] == [2]
    leftovers = [p for p in root.iterdir() if p.name.startswith(".tmp-checkpoint-00000004-")]
    assert len(leftovers) == 1 and {"__0_0.distcp", "__1_0.distcp"} <= {
        p.name for p in leftovers[0].iterdir()}
    reporter = ListReporter()  # 2 ranks -> 1 process: DCP reshards on load
    result = fit(RegressionTask(OPTIONS), TrainConfig(micro_batch_size=8, **{
        **CONFIG, "checkpoint_dir": str(root)}), reporter, resume_from=root)
    assert result.n_updates == 12 and [r["step"] for r in reporter.reports][0] == 4
    assert torch.isfinite(flat_params(result.model)).all()
    assert not any(p.name.startswith(".tmp-") for p in root.iterdir())  # the next save cleaned


def test_charlm_shards_each_block_then_the_root_and_the_ema_alike(runs):
    (r0, r1), _ = runs
    assert r0["charlm_sharded_modules"] == r0["charlm_ema_sharded_modules"] == 3  # 2 blocks + root
    total = sum(r0["charlm_local_numel"].values()) + sum(r1["charlm_local_numel"].values())
    assert sum(r0["charlm_local_numel"].values()) < total
    # bf16 computes in bf16, but the sharded parameters the optimizer updates stay fp32
    assert r0["charlm_param_dtype"] == "torch.float32"
    assert all(r["skipped_updates"] == 0 and r["loss_scale"] == 1.0 for r in r0["charlm_reports"])


def test_fp16_skipped_updates_are_agreed_by_all_ranks(runs):
    (r0, r1), _ = runs
    # init scale 2**40 overflows until halved 23 times, on both ranks together
    assert [r["skipped_updates"] for r in r0["fp16_reports"]] == [23, 23]
    assert _stable(r0["fp16_reports"]) == _stable(r1["fp16_reports"])
    assert r0["fp16_reports"][-1]["loss_scale"] == 2.0**17


FULL_DISK = "OSError: [Errno 28] No space left on device"


@pytest.mark.parametrize("where, said", [
    ("mkdir", [FULL_DISK, f"rank 0: cannot write checkpoint {{final}}: {FULL_DISK}"]),
    ("shards", [FULL_DISK, FULL_DISK]),  # DCP tells every rank of rank 1's failure
    ("meta", [FULL_DISK, "another rank failed"]),
    ("rename", [FULL_DISK, "another rank failed"]),
])
def test_a_sharded_write_that_fails_on_one_rank_fails_on_every_rank(tmp_path, where, said):
    """A full disk on one rank, at each step of a sharded save: before, rank 0's failures
    (creating the temporary directory, ``meta.json``, the rename) left rank 1 at the
    next collective, to fail only when rank 0's process went away (or wait for the
    process group's timeout), a shard's was DCP's traceback-laden
    ``CheckpointException``, and the temporary directory stayed. Every rank now raises
    ``CheckpointWriteError`` at once, and only the earlier checkpoint is left."""
    ranks = rank_results("tests.trainers.dcp_failure_worker", tmp_path, where, timeout=120)
    final = tmp_path / "ckpt" / "checkpoint-00000002"
    expected = [f"cannot write checkpoint {final}: {text}" if not text.startswith("rank 0")
                else text.format(final=final) for text in said]
    assert [r["raised"] for r in ranks] == [("CheckpointWriteError", e) for e in expected]
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "best.json", "checkpoint-00000001"]


def test_a_sharded_write_that_fails_otherwise_fails_on_every_rank_and_leaves_nothing(
        tmp_path):
    """Not the file system's failure (a bug in a writer): every rank raises it as DCP
    gathered it, none waits for the others, and the temporary directory is removed."""
    ranks = rank_results("tests.trainers.dcp_failure_worker", tmp_path, "bug", timeout=120)
    for r in ranks:
        name, text = r["raised"]
        assert name == "CheckpointException" and "ValueError: bug" in text
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == [
        "best.json", "checkpoint-00000001"]
