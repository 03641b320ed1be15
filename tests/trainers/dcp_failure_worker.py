"""Run by ``torchrun --nproc_per_node 2`` from test_fsdp.py: an FSDP run whose second
sharded checkpoint fails on one rank, at one place (``where``, below); each rank
writes what it raised to ``OUT/rankR.pt``.

``where``: ``mkdir`` (rank 0 creates the temporary directory), ``shards`` (rank 1's
DCP shard write), ``meta`` (rank 0's ``meta.json``), ``rename`` (rank 0's rename into
place), ``bug`` (rank 1's shard write raises a ``ValueError``, not the file system's).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp

from tests.trainers.toy_tasks import RegressionOptions, RegressionTask
from trainers import TrainConfig, fit
from trainers import checkpoint as ckpt
from trainers import dcp as trainers_dcp
from trainers.distributed import exit_rank

FULL = OSError(28, "No space left on device")


def failing_second(real, error=FULL):
    calls = {"n": 0}

    def wrapper(*args, **kwargs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise error
        return real(*args, **kwargs)
    return wrapper


def raise_(error: BaseException):
    raise error


def main(out: Path, where: str) -> None:
    rank = int(os.environ["RANK"])
    second = ".tmp-checkpoint-00000002"
    if where == "mkdir" and rank == 0:
        real_mkdir = Path.mkdir
        Path.mkdir = lambda path, *a, **kw: raise_(FULL) if path.name.startswith(
            second) else real_mkdir(path, *a, **kw)
    elif where in ("shards", "bug") and rank == 1:
        dcp.FileSystemWriter.write_data = failing_second(
            dcp.FileSystemWriter.write_data, FULL if where == "shards" else ValueError("bug"))
    elif where == "meta" and rank == 0:
        trainers_dcp.write_atomically = failing_second(trainers_dcp.write_atomically)
    elif where == "rename" and rank == 0:
        real_rename = os.rename
        ckpt.os.rename = lambda a, b: raise_(FULL) if Path(a).name.startswith(
            second) else real_rename(a, b)
    config = TrainConfig(micro_batch_size=4, max_updates=4, max_epochs=None, eval_interval=1,
                         lr=0.05, parallelism="fsdp", checkpoint_dir=str(out / "ckpt"),
                         checkpoint_fsync=False, seed=3)
    try:
        fit(RegressionTask(RegressionOptions(n_samples=32)), config)
        raised = None
    except BaseException as e:  # noqa: BLE001 - what each rank raised is the result
        raised = (type(e).__name__, str(e))
    torch.save({"raised": raised, "world_size": dist.get_world_size()},
               out / f"rank{rank}.pt")
    dist.destroy_process_group()
    exit_rank(0)


if __name__ == "__main__":
    dist.init_process_group("gloo")
    main(Path(sys.argv[1]), sys.argv[2])
