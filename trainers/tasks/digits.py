"""``digits``: scikit-learn's bundled 8x8 handwritten digits with a small CNN.

1,797 grayscale images of 8x8 pixels (values 0..16, scaled to [0, 1]), 10
classes; no download. A stratified, seeded train/validation split (the split
seed is an option of its own, so trials with different training seeds are
evaluated on the same validation set). Metrics: ``val_loss`` (mean cross
entropy, nats) and ``val_accuracy`` (fraction correct).

Shapes: images x_BCHW float32 (B, 1, 8, 8); labels y_B int64 in [0, 10).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import Dataset, TensorDataset

from trainers.config import TrainConfig
from trainers.fields import option, require
from trainers.tasks.base import Task

N_IMAGES = 1797  # scikit-learn's digits
N_CLASSES = 10


@dataclasses.dataclass(frozen=True, kw_only=True)
class DigitsOptions:
    """Options of the ``digits`` task."""

    width: int = option(32, "channels of every conv layer (1..512)")
    depth: int = option(2, "conv blocks, each conv3x3 + (BatchNorm) + ReLU (1..6)")
    dropout: float = option(0.1, "dropout before the classifier, in [0, 1)")
    batch_norm: bool = option(True, "BatchNorm after every conv layer")
    val_fraction: float = option(0.2, "fraction of the images held out for validation, (0, 1)")
    split_seed: int = option(0, "seed of the stratified train/validation split "
                                        "(0..4294967295)")

    def __post_init__(self) -> None:
        require(1 <= self.width <= 512, "width", f"must be in 1..512, got {self.width}")
        require(1 <= self.depth <= 6, "depth", f"must be in 1..6, got {self.depth}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        require(0 < self.val_fraction < 1, "val_fraction",
                f"must be in (0, 1), got {self.val_fraction}")
        # the stratified split needs one image of each class on either side
        n_val = math.ceil(self.val_fraction * N_IMAGES)  # as train_test_split counts
        require(N_CLASSES <= n_val <= N_IMAGES - N_CLASSES, "val_fraction",
                f"must hold out {N_CLASSES} to {N_IMAGES - N_CLASSES} of the {N_IMAGES} "
                f"images (one per class on either side of the split), got "
                f"{self.val_fraction} ({n_val} images)")
        # scikit-learn's random_state range (a larger one was its traceback)
        require(0 <= self.split_seed <= 2**32 - 1, "split_seed",
                f"must be in 0..4294967295, got {self.split_seed}")


class DigitsCNN(nn.Module):
    """``depth`` conv blocks (a 2x2 max-pool after the first), then dropout and a linear head."""

    def __init__(self, width: int, depth: int, dropout: float, batch_norm: bool) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 1
        for i in range(depth):
            layers += [nn.Conv2d(channels, width, 3, padding=1, bias=not batch_norm)]
            layers += [nn.BatchNorm2d(width)] if batch_norm else []
            layers += [nn.ReLU()]
            if i == 0:
                layers += [nn.MaxPool2d(2)]
            channels = width
        self.features = nn.Sequential(*layers)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(width * 4 * 4, 10)

    def forward(self, x_BCHW: torch.Tensor) -> torch.Tensor:
        """Logits (B, 10) of images (B, 1, 8, 8)."""
        return self.head(self.dropout(self.features(x_BCHW).flatten(1)))


class DigitsTask(Task):
    """Classify scikit-learn's 8x8 digits (see module doc)."""

    name = "digits"
    Options = DigitsOptions
    metrics: Mapping[str, str] = {"val_loss": "minimize", "val_accuracy": "maximize"}
    objective = "val_accuracy"
    mutable_options = frozenset({"dropout"})
    default_config = {"micro_batch_size": 64, "lr": 3e-3, "weight_decay": 1e-4,
                      "max_epochs": 20, "warmup_steps": 20, "schedule": "cosine"}

    def datasets(self, seed: int) -> tuple[Dataset, Dataset]:
        data = load_digits()
        x = (data.images.astype(np.float32) / 16.0)[:, None, :, :]
        y = data.target.astype(np.int64)
        x_tr, x_va, y_tr, y_va = train_test_split(
            x, y, test_size=self.options.val_fraction, stratify=y,
            random_state=self.options.split_seed)
        return (TensorDataset(torch.from_numpy(x_tr), torch.from_numpy(y_tr)),
                TensorDataset(torch.from_numpy(x_va), torch.from_numpy(y_va)))

    def build_model(self, config: TrainConfig) -> nn.Module:
        o = self.options
        return DigitsCNN(o.width, o.depth, o.dropout, o.batch_norm)

    def loss_sum(self, model: nn.Module, batch) -> torch.Tensor:
        x_BCHW, y_B = batch
        return F.cross_entropy(model(x_BCHW).float(), y_B, reduction="sum")

    def eval_sums(self, model: nn.Module, batch) -> dict[str, torch.Tensor]:
        x_BCHW, y_B = batch
        logits_BK = model(x_BCHW).float()
        return {"loss": F.cross_entropy(logits_BK, y_B, reduction="sum"),
                "correct": (logits_BK.argmax(1) == y_B).sum(),
                "n": torch.tensor(y_B.numel())}

    def eval_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
        return {"val_loss": sums["loss"] / sums["n"], "val_accuracy": sums["correct"] / sums["n"]}
