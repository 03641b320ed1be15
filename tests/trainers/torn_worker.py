"""Run by ``torchrun --nproc_per_node 2`` from test_ddp_resume.py: two DDP ranks resume a
root whose newest checkpoint one rank, or both, cannot load; writes what each rank saw."""

from __future__ import annotations

import pickle
import shutil
import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask, flat_params
from trainers import Decision, ListReporter, TrainConfig, fit
from trainers.checkpoint import list_checkpoints
from trainers.distributed import exit_rank
from trainers.errors import CheckpointError

OPTIONS = RegressionOptions(n_samples=64)
CONFIG = dict(micro_batch_size=4, max_updates=8, max_epochs=None, lr=0.05, eval_interval=1,
              checkpoint_interval=2, keep_last_checkpoints=100, checkpoint_fsync=False,
              seed=11)
STOP_AT = 6  # the interrupted run's last step: its newest checkpoint
# what rank 1 (or both) meets reading the newest checkpoint's state.pt
SCENARIOS = ("torn-on-rank-1", "torn-on-both", "eio-on-rank-1", "all-torn-on-rank-1")


class StopAt(ListReporter):
    def report(self, metrics, save_checkpoint):
        super().report(metrics, save_checkpoint)
        return Decision.STOP if metrics["step"] == STOP_AT else Decision.CONTINUE


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    full = fit(RegressionTask(OPTIONS), TrainConfig(checkpoint_dir=str(out / "full"), **CONFIG))
    cut = out / "cut"
    fit(RegressionTask(OPTIONS), TrainConfig(checkpoint_dir=str(cut), **CONFIG), StopAt())
    got: dict = {"full": flat_params(full.model),
                 "steps": [step for step, _ in list_checkpoints(cut)]}
    newest = list_checkpoints(cut)[-1][1].name
    real_load = torch.load
    for name in SCENARIOS:
        root = out / name
        if rank == 0:
            shutil.copytree(cut, root)
            if name == "torn-on-both":
                with open(root / newest / "state.pt", "r+b") as f:
                    f.truncate(100)
        dist.barrier()

        def load(f, *args, _root=root, _name=name, **kwargs):
            here = Path(f).parent if isinstance(f, str | Path) else None  # not a gather's
            if rank == 1 and here is not None and here.parent == _root and (
                    here.name == newest or _name == "all-torn-on-rank-1"):
                if _name == "eio-on-rank-1":
                    raise OSError(5, "Input/output error")
                if _name != "torn-on-both":
                    raise pickle.UnpicklingError("torn as this rank reads it")
            return real_load(f, *args, **kwargs)

        torch.load = load
        reporter = ListReporter()
        try:
            result = fit(RegressionTask(OPTIONS), TrainConfig(checkpoint_dir=str(root), **CONFIG),
                         reporter, resume_from=root)
            got[name] = {"params": flat_params(result.model),
                         "first_step": reporter.reports[0]["step"]}
        except CheckpointError as e:
            got[name] = {"error": str(e)}
        finally:
            torch.load = real_load
        dist.barrier()
    torch.save(got, out / f"rank{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_rank(0)
