"""Data loading: random augmentation in worker processes (``num_workers`` > 0).

A dataset whose ``__getitem__`` draws from torch's, numpy's or Python's RNG must
draw new numbers every epoch, the same numbers whichever worker loads a batch,
and the same numbers in a resumed run as in the uninterrupted one.
"""

from __future__ import annotations

import random

import numpy as np
import torch

from tests.trainers.toy_tasks import IndexedDataset, RegressionOptions, RegressionTask
from trainers import TrainConfig, fit
from trainers.data import batch_seeds


class Augmented(IndexedDataset):
    """Items ``(index, x + noise, y)``: noise from torch's, numpy's and Python's RNGs."""

    def __getitem__(self, i: int):
        idx, x, y = super().__getitem__(i)
        noise = 0.1 * torch.randn_like(x) + float(np.random.rand()) + random.random()
        return idx, x + noise, y


class AugmentedTask(RegressionTask):
    """``RegressionTask`` with a random augmentation; records the noise of each micro-batch."""

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.noise: list[torch.Tensor] = []

    def datasets(self, seed: int):
        train, val = super().datasets(seed)
        self.x = train.tensors[0]
        return Augmented(*train.tensors), val

    def loss_sum(self, model, batch):
        idx, x, _ = batch
        self.noise.append(x - self.x[idx])
        return super().loss_sum(model, batch)


OPTIONS = RegressionOptions(n_samples=32)  # 4 micro-batches, 2 updates per epoch


def _config(root, num_workers: int) -> TrainConfig:
    return TrainConfig(micro_batch_size=8, grad_accum_steps=2, max_epochs=2, lr=0.05,
                       num_workers=num_workers, eval_interval=1, checkpoint_dir=str(root),
                       keep_last_checkpoints=10, checkpoint_fsync=False, seed=3)


def test_batch_seeds_differ_by_epoch_rank_and_offset_and_repeat_exactly():
    seeds = batch_seeds(seed=3, epoch=0, rank=0, offsets=[0, 8])
    assert seeds == batch_seeds(seed=3, epoch=0, rank=0, offsets=[0, 8])
    others = [batch_seeds(seed=3, epoch=1, rank=0, offsets=[0])[0],
              batch_seeds(seed=3, epoch=0, rank=1, offsets=[0])[0],
              batch_seeds(seed=4, epoch=0, rank=0, offsets=[0])[0]]
    assert len({*seeds, *others}) == 5 and all(0 <= s < 2**64 for s in seeds + others)


def test_resume_with_workers_is_bit_identical_and_epochs_draw_new_augmentations(tmp_path):
    task = AugmentedTask(OPTIONS)
    full = fit(task, _config(tmp_path / "full", num_workers=2))
    assert full.n_updates == 4
    # each micro-batch of epoch 1 draws other numbers than its place in epoch 0
    pairs = zip(task.noise[:4], task.noise[4:], strict=True)
    assert not any(torch.allclose(a, b, atol=1e-5) for a, b in pairs)
    # one worker loads every batch: the same numbers as two workers dealing them out
    one = AugmentedTask(OPTIONS)
    fit(one, _config(tmp_path / "one", num_workers=1))
    assert all(torch.equal(a, b) for a, b in zip(one.noise, task.noise, strict=True))
    # resumed mid-epoch (update 1) and at the epoch boundary (update 2): the batches
    # after the checkpoint get the uninterrupted run's augmentations, bit for bit
    for step in (1, 2):
        again = AugmentedTask(OPTIONS)
        resumed = fit(again, _config(tmp_path / f"from-{step}", num_workers=2),
                      resume_from=tmp_path / "full" / f"checkpoint-{step:08d}")
        later = task.noise[2 * step:]
        assert all(torch.equal(a, b) for a, b in zip(again.noise, later, strict=True))
        for key, value in full.model.state_dict().items():
            assert torch.equal(resumed.model.state_dict()[key], value), (step, key)
