"""Run by ``torchrun --nproc_per_node 2`` from test_distributed_buffers.py: BatchNorm under
DDP with EMA and under FSDP, each trained once with checkpoints, then resumed from a
checkpoint between evaluations (3) and from one of an evaluation (4); writes each rank's
weights, buffers and reports."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import ListReporter, TrainConfig, fit
from trainers.distributed import exit_rank
from trainers.fsdp import full_parameters

OPTIONS = RegressionOptions(n_samples=69, batch_norm=True)  # 35 and 34 samples a rank
CONFIG = dict(micro_batch_size=4, grad_accum_steps=3, max_updates=8, max_epochs=None,
              lr=0.05, eval_interval=4, checkpoint_interval=3, seed=11,
              keep_last_checkpoints=100, checkpoint_fsync=False)
VARIANTS = {"ddp-ema": dict(ema_decay=0.5), "fsdp": dict(parallelism="fsdp"),
            "fsdp-ema": dict(parallelism="fsdp", ema_decay=0.5)}
RESUMES = (3, 4)


def weights(model) -> dict[str, torch.Tensor]:
    """Full parameters and this rank's buffers, by name; collective under FSDP."""
    return {**full_parameters(model), **{k: b.clone() for k, b in model.named_buffers()}}


def run(out: Path, name: str, resume: int | None) -> dict:
    reporter = ListReporter()
    root = out / name / ("full" if resume is None else f"from-{resume}")
    source = None if resume is None else out / name / "full" / f"checkpoint-{resume:08d}"
    result = fit(RegressionTask(OPTIONS),
                 TrainConfig(checkpoint_dir=str(root), **CONFIG, **VARIANTS[name]),
                 reporter, resume_from=source)
    ema = None if result.ema_model is None else weights(result.ema_model)
    return {"model": weights(result.model), "ema": ema,
            "val_loss": [r["val_loss"] for r in reporter.reports],
            "train_loss": [r["train_loss"] for r in reporter.reports]}


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    got = {(name, resume): run(out, name, resume)
           for name in VARIANTS for resume in (None, *RESUMES)}
    torch.save(got, out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_rank(0)
