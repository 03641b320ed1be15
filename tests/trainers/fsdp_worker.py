"""Run by ``torchrun --nproc_per_node 2`` from test_fsdp.py; writes what each rank saw.

``main OUT``: FSDP runs (toy regression: full run with checkpoints, the same
under DDP, a resume mid-epoch, a resume of a 1-process checkpoint; charlm with
its blocks sharded, bf16 + EMA, then fp16). ``kill OUT``: an FSDP run killed
(SIGKILL, both ranks) while writing its second checkpoint.
"""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.fsdp import FSDPModule

import trainers.fsdp
from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import ListReporter, TrainConfig, fit
from trainers.distributed import exit_rank
from trainers.tasks.charlm import CharLMOptions, CharLMTask

CONFIG = dict(grad_accum_steps=2, max_epochs=3, lr=0.05, eval_interval=2, seed=11,
              schedule="cosine", warmup_steps=2, parallelism="fsdp", keep_last_checkpoints=100,
              checkpoint_fsync=False)
OPTIONS = RegressionOptions(n_samples=64)
CHARLM = dict(block_size=16, n_layer=2, n_head=2, d_model=16, windows_per_epoch=64,
              max_eval_blocks=5)  # 5 blocks: 3 on rank 0, 2 on rank 1
CHARLM_CONFIG = dict(micro_batch_size=4, grad_accum_steps=2, max_updates=4, eval_interval=2,
                     lr=1e-2, max_grad_norm=0.5, parallelism="fsdp", seed=3)


def flat(model) -> torch.Tensor:
    """Every parameter, full (all-gathered), as one fp32 vector; collective."""
    return torch.cat([p.float().flatten()
                      for p in trainers.fsdp.full_parameters(model).values()])


def _regression(out: Path, **changes):
    reporter, resume = ListReporter(), changes.pop("resume", None)
    result = fit(RegressionTask(OPTIONS), TrainConfig(micro_batch_size=4, **{**CONFIG, **changes}),
                 reporter, resume_from=resume)
    return flat(result.model), reporter.reports, result


def main(out: Path) -> dict:
    syncs: list[bool] = []
    real_sync = trainers.fsdp._fsdp_sync
    trainers.fsdp._fsdp_sync = lambda model, sync: (syncs.append(sync), real_sync(model, sync))[1]
    full, reports, result = _regression(out, checkpoint_dir=str(out / "fsdp"))
    trainers.fsdp._fsdp_sync = real_sync
    ddp, ddp_reports, _ = _regression(out, parallelism="ddp")
    resumed, resumed_reports, _ = _regression(
        out, checkpoint_dir=str(out / "resumed"), resume=str(out / "fsdp" / "checkpoint-00000006"))
    grown, grown_reports, grown_result = _regression(
        out, checkpoint_dir=str(out / "grown"), resume=str(out / "single"))
    return {"full": full, "reports": reports, "syncs": syncs, "ddp": ddp,
            "ddp_reports": ddp_reports, "resumed": resumed, "resumed_reports": resumed_reports,
            "grown_updates": grown_result.n_updates, "grown_reports": grown_reports,
            "grown_finite": bool(torch.isfinite(grown).all()),
            "n_updates": result.n_updates, **_charlm(out)}


def _charlm(out: Path) -> dict:
    corpus = out / "corpus.txt"  # written by the test
    task = CharLMTask(CharLMOptions(corpus=str(corpus), cache_dir=str(out / "cache"), **CHARLM))
    reporter = ListReporter()
    result = fit(task, TrainConfig(precision="bf16", ema_decay=0.9, **CHARLM_CONFIG), reporter)
    sharded = sum(isinstance(m, FSDPModule) for m in result.model.modules())
    ema_sharded = sum(isinstance(m, FSDPModule) for m in result.ema_model.modules())
    local = {n: p.to_local().numel() for n, p in result.model.named_parameters()}
    fp16 = ListReporter()
    fit(CharLMTask(task.options), TrainConfig(precision="fp16", init_loss_scale=2.0**40,
                                              **CHARLM_CONFIG), fp16)
    return {"charlm_reports": reporter.reports, "charlm_sharded_modules": sharded,
            "charlm_ema_sharded_modules": ema_sharded, "charlm_local_numel": local,
            "charlm_param_dtype": str(next(result.model.parameters()).dtype),
            "fp16_reports": fp16.reports}


def kill(out: Path) -> dict:
    """Kill both ranks after their shards of the second checkpoint are written,
    before rank 0 renames it into place."""
    import torch.distributed.checkpoint

    real_save, calls = torch.distributed.checkpoint.save, []

    def save_then_die(*args, **kwargs):
        real_save(*args, **kwargs)
        calls.append(1)
        if len(calls) == 2:
            dist.barrier()
            os.kill(os.getpid(), signal.SIGKILL)

    torch.distributed.checkpoint.save = save_then_die
    _regression(out, checkpoint_dir=str(out / "killed"))
    return {}


if __name__ == "__main__":
    dist.init_process_group("gloo")
    target = Path(sys.argv[2])
    results = {"main": main, "kill": kill}[sys.argv[1]](target)
    torch.save(results, target / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()
    exit_rank(0)  # as python -m trainers ends a rank: without the finalization's SIGABRT
