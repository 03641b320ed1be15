"""``tabular-mlp``: a residual MLP on scikit-learn's bundled tabular datasets.

A complete third-party task for the HPO service: an installable package that
registers itself through the ``hpo.trainers`` entry point (see
``pyproject.toml``). Nothing is downloaded: both datasets ship with
scikit-learn.

* ``breast_cancer``: 569 samples, 30 features, 2 classes;
* ``wine``: 178 samples, 13 features, 3 classes.

A stratified, seeded train/validation split; features standardized with the
*training* split's mean and standard deviation (the validation split never
leaks into them). Model: a linear stem, ``depth`` pre-norm residual blocks
(LayerNorm, Linear, activation, dropout, Linear), a final LayerNorm and a
linear head. Training-time augmentation: Gaussian noise on the standardized
features. Each block can be recomputed in backward (activation
checkpointing); LayerNorm weights and biases get no weight decay (the loop
decides that from the parameter's shape).

Metrics: ``val_loss`` (mean cross entropy without label smoothing, nats),
``val_accuracy`` (fraction correct) and ``val_macro_f1`` (mean over classes of
``2 TP / (2 TP + FP + FN)``, from counts summed over the whole validation set).

Shapes: features x_BF float32 (B, F); labels y_B int64 in [0, K); logits
(B, K). Legend: B batch, F features, D width, K classes.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from sklearn.datasets import load_breast_cancer, load_wine
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import Dataset, TensorDataset

from trainers import Task, TrainConfig
from trainers.fields import option, require

LOADERS = {"breast_cancer": load_breast_cancer, "wine": load_wine}
ACTIVATIONS = {"relu": nn.ReLU, "gelu": nn.GELU, "silu": nn.SiLU}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TabularOptions:
    """Options of the ``tabular-mlp`` task: each is a hyperparameter a study may search."""

    dataset: Literal["breast_cancer", "wine"] = option(
        "breast_cancer", "scikit-learn's bundled dataset: breast_cancer (2 classes) or wine (3)")
    width: int = option(64, "width of the residual stream (8..1024)")
    depth: int = option(2, "residual blocks (1..8)")
    expansion: int = option(2, "hidden units of a block per unit of width (1..8)")
    activation: Literal["relu", "gelu", "silu"] = option("gelu", "activation inside each block")
    dropout: float = option(0.1, "dropout inside each block, in [0, 1)")
    input_noise: float = option(
        0.0, "std of the Gaussian noise added to the standardized features in training, in "
             "[0, 2] (augmentation; 0: off)")
    label_smoothing: float = option(0.0, "label smoothing of the training loss, in [0, 0.5]")
    val_fraction: float = option(0.25, "fraction of the samples held out for validation, "
                                        "in [0.1, 0.5]")
    split_seed: int = option(0, "seed of the stratified train/validation split (>= 0)")

    def __post_init__(self) -> None:
        require(8 <= self.width <= 1024, "width", f"must be in 8..1024, got {self.width}")
        require(1 <= self.depth <= 8, "depth", f"must be in 1..8, got {self.depth}")
        require(1 <= self.expansion <= 8, "expansion",
                f"must be in 1..8, got {self.expansion}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        require(0 <= self.input_noise <= 2, "input_noise",
                f"must be in [0, 2], got {self.input_noise}")
        require(0 <= self.label_smoothing <= 0.5, "label_smoothing",
                f"must be in [0, 0.5], got {self.label_smoothing}")
        require(0.1 <= self.val_fraction <= 0.5, "val_fraction",
                f"must be in [0.1, 0.5], got {self.val_fraction}")
        require(self.split_seed >= 0, "split_seed", f"must be >= 0, got {self.split_seed}")


@functools.cache
def load_table(dataset: str) -> tuple[np.ndarray, np.ndarray]:
    """Features (N, F) float64 and labels (N,) int64 of a bundled dataset (cached)."""
    data = LOADERS[dataset]()
    return data.data.astype(np.float64), data.target.astype(np.int64)


def standardized_split(dataset: str, val_fraction: float, split_seed: int
                       ) -> tuple[TensorDataset, TensorDataset]:
    """Stratified train/validation datasets, standardized with the training split's
    statistics only."""
    x, y = load_table(dataset)
    x_tr, x_va, y_tr, y_va = train_test_split(x, y, test_size=val_fraction, stratify=y,
                                              random_state=split_seed)
    mean, std = x_tr.mean(0), np.maximum(x_tr.std(0), 1e-8)

    def tensors(x_NF: np.ndarray, y_N: np.ndarray) -> TensorDataset:
        x_NF = ((x_NF - mean) / std).astype(np.float32)
        return TensorDataset(torch.from_numpy(x_NF), torch.from_numpy(y_N))

    return tensors(x_tr, y_tr), tensors(x_va, y_va)


class GaussianNoise(nn.Module):
    """Adds N(0, std^2) noise in training mode, like dropout; the identity in eval mode."""

    def __init__(self, std: float) -> None:
        super().__init__()
        self.std = std

    def forward(self, x_BF: torch.Tensor) -> torch.Tensor:
        if not self.training or self.std == 0:
            return x_BF
        return x_BF + self.std * torch.randn_like(x_BF)


class ResidualBlock(nn.Module):
    """``x + W2 dropout(act(W1 LayerNorm(x)))``: a pre-norm MLP block."""

    def __init__(self, width: int, expansion: int, activation: str, dropout: float) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(width)
        self.up = nn.Linear(width, width * expansion)
        self.act = ACTIVATIONS[activation]()
        self.drop = nn.Dropout(dropout)
        self.down = nn.Linear(width * expansion, width)

    def forward(self, x_BD: torch.Tensor) -> torch.Tensor:
        return x_BD + self.down(self.drop(self.act(self.up(self.norm(x_BD)))))


class TabularMLP(nn.Module):
    """Stem, residual blocks (each optionally recomputed in backward), LayerNorm, head."""

    def __init__(self, n_features: int, n_classes: int, o: TabularOptions,
                 activation_checkpointing: bool) -> None:
        super().__init__()
        self.noise = GaussianNoise(o.input_noise)
        self.stem = nn.Linear(n_features, o.width)
        self.blocks = nn.ModuleList(ResidualBlock(o.width, o.expansion, o.activation, o.dropout)
                                    for _ in range(o.depth))
        self.norm = nn.LayerNorm(o.width)
        self.head = nn.Linear(o.width, n_classes)
        self.activation_checkpointing = activation_checkpointing

    def forward(self, x_BF: torch.Tensor) -> torch.Tensor:
        """Logits (B, K) of standardized features (B, F)."""
        h_BD = self.stem(self.noise(x_BF))
        for block in self.blocks:
            if self.activation_checkpointing and torch.is_grad_enabled():
                h_BD = checkpoint(block, h_BD, use_reentrant=False)
            else:
                h_BD = block(h_BD)
        return self.head(self.norm(h_BD))


class TabularMLPTask(Task):
    """Classify a bundled scikit-learn table with a residual MLP (see the module doc)."""

    name = "tabular-mlp"
    Options = TabularOptions
    metrics: Mapping[str, str] = {"val_loss": "minimize", "val_accuracy": "maximize",
                                  "val_macro_f1": "maximize"}
    objective = "val_loss"
    # regularizers that change no parameter shape: a resumed run (PBT) may change them
    mutable_options = frozenset({"dropout", "input_noise", "label_smoothing"})
    supports_activation_checkpointing = True
    default_config = {"micro_batch_size": 32, "lr": 2e-3, "weight_decay": 1e-2,
                      "max_epochs": 20, "warmup_steps": 20, "schedule": "cosine",
                      "ema_decay": 0.98}

    def datasets(self, seed: int) -> tuple[Dataset, Dataset]:
        o = self.options
        return standardized_split(o.dataset, o.val_fraction, o.split_seed)

    def build_model(self, config: TrainConfig) -> nn.Module:
        x, y = load_table(self.options.dataset)
        return TabularMLP(x.shape[1], int(y.max()) + 1, self.options,
                          config.activation_checkpointing)

    def loss_sum(self, model: nn.Module, batch) -> torch.Tensor:
        # a SUM over the micro-batch: the loop divides by the samples of the whole
        # accumulation group, so gradients do not depend on how a batch is split
        x_BF, y_B = batch
        return F.cross_entropy(model(x_BF).float(), y_B, reduction="sum",
                               label_smoothing=self.options.label_smoothing)

    def eval_sums(self, model: nn.Module, batch) -> dict[str, torch.Tensor]:
        # additive counts only: F1 is computed once from the sums over the whole set
        x_BF, y_B = batch
        logits_BK = model(x_BF).float()
        pred_B = logits_BK.argmax(1)
        sums = {"loss": F.cross_entropy(logits_BK, y_B, reduction="sum"),
                "correct": (pred_B == y_B).sum(), "n": torch.tensor(y_B.numel())}
        for k in range(logits_BK.shape[1]):
            sums[f"tp_{k}"] = ((pred_B == k) & (y_B == k)).sum()
            sums[f"fp_{k}"] = ((pred_B == k) & (y_B != k)).sum()
            sums[f"fn_{k}"] = ((pred_B != k) & (y_B == k)).sum()
        return sums

    def eval_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
        classes = [key[3:] for key in sums if key.startswith("tp_")]
        f1 = [2 * sums[f"tp_{k}"] / d if (d := 2 * sums[f"tp_{k}"] + sums[f"fp_{k}"]
                                          + sums[f"fn_{k}"]) else 0.0 for k in classes]
        return {"val_loss": sums["loss"] / sums["n"], "val_accuracy": sums["correct"] / sums["n"],
                "val_macro_f1": sum(f1) / len(f1)}
