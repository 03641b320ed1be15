"""Run by ``torchrun --nproc_per_node 2`` from test_ddp.py; writes what each rank saw."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask, flat_params
from trainers import ListReporter, TrainConfig, fit, loop
from trainers.distributed import exit_rank

CONFIG = dict(grad_accum_steps=2, max_epochs=3, lr=0.05, eval_interval=2, seed=11,
              schedule="cosine", warmup_steps=2)
OPTIONS = RegressionOptions(n_samples=64)


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    writes: list[int] = []
    real_save = loop.ckpt.save_checkpoint

    def spy(*args, **kwargs):
        writes.append(rank)
        return real_save(*args, **kwargs)

    loop.ckpt.save_checkpoint = spy
    task = RegressionTask(OPTIONS)
    reporter = ListReporter()
    config = TrainConfig(micro_batch_size=4, checkpoint_dir=str(out / "ckpt"), **CONFIG)
    result = fit(task, config, reporter)
    torch.save({"params": flat_params(result.model), "seen": task.seen, "sync": task.sync_flags,
                "reports": reporter.reports, "writes": writes}, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_rank(0)  # as python -m trainers ends a rank: without the finalization's SIGABRT
