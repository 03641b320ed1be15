"""Run by ``torchrun --nproc_per_node 2`` from test_evaluation.py: a validation set of one
sample (fewer than the ranks), then an empty one; writes what each rank got."""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist

from tests.trainers.toy_tasks import IndexedDataset, RegressionOptions, RegressionTask
from trainers import TrainConfig, TrainersError, fit
from trainers.distributed import exit_rank


class FewValidation(RegressionTask):
    """``RegressionTask`` with only the first ``n_val`` validation samples."""

    def __init__(self, options, n_val: int) -> None:
        super().__init__(options)
        self.n_val = n_val

    def datasets(self, seed: int):
        train, val = super().datasets(seed)
        return train, IndexedDataset(*(t[:self.n_val] for t in val.tensors))


def main(out: Path) -> None:
    dist.init_process_group("gloo")
    config = TrainConfig(micro_batch_size=4, max_updates=2, max_epochs=None, lr=0.05, seed=5)
    task = FewValidation(RegressionOptions(n_samples=16), n_val=1)
    result = fit(task, config)
    _, x, y = task.datasets(0)[1][0]
    with torch.no_grad():  # the one sample's squared error, evaluated here directly
        expected = float(((result.model.eval()(x[None]).squeeze(-1) - y) ** 2).sum())
    try:
        fit(FewValidation(RegressionOptions(n_samples=16), n_val=0), config)
        empty = "no error"
    except TrainersError as e:
        empty = str(e)
    torch.save({"val_loss": result.metrics["val_loss"], "expected": expected, "empty": empty},
               out / f"rank{dist.get_rank()}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
    exit_rank(0)
