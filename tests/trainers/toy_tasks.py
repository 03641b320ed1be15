"""Tiny tasks with known answers, for the loop's tests (importable by the DDP worker too)."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

from trainers.config import TrainConfig
from trainers.data import pad_collate
from trainers.fields import option
from trainers.tasks.base import Task


class IndexedDataset(Dataset):
    """Items ``(index, *tensors[index])``, so a task can record the order it saw."""

    def __init__(self, *tensors: torch.Tensor) -> None:
        self.tensors = tensors

    def __len__(self) -> int:
        return len(self.tensors[0])

    def __getitem__(self, i: int):
        return (torch.tensor(i), *(t[i] for t in self.tensors))


@dataclasses.dataclass(frozen=True, kw_only=True)
class RegressionOptions:
    n_samples: int = option(64, "training samples")
    n_features: int = option(4, "input features")
    hidden: int = option(8, "hidden units")
    dropout: float = option(0.0, "dropout")
    batch_norm: bool = option(False, "BatchNorm after the hidden layer")


class RegressionTask(Task):
    """An MLP fitting a fixed random linear target with MSE (per-sample losses)."""

    name = "toy-regression"
    Options = RegressionOptions
    metrics: Mapping[str, str] = {"val_loss": "minimize"}
    objective = "val_loss"

    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.seen: list[int] = []            # sample indices, in training order
        self.sync_flags: list[bool] = []     # DDP gradient sync on, per micro-batch
        self.model: nn.Module | None = None

    def datasets(self, seed: int):
        o = self.options
        g = torch.Generator().manual_seed(1234)
        w = torch.randn(o.n_features, generator=g)
        x = torch.randn(o.n_samples + 32, o.n_features, generator=g)
        y = x @ w + 0.1 * torch.randn(o.n_samples + 32, generator=g)
        n = o.n_samples
        return IndexedDataset(x[:n], y[:n]), IndexedDataset(x[n:], y[n:])

    def build_model(self, config: TrainConfig) -> nn.Module:
        o = self.options
        layers = [nn.Linear(o.n_features, o.hidden)]
        layers += [nn.BatchNorm1d(o.hidden)] if o.batch_norm else []
        layers += [nn.Tanh(), nn.Dropout(o.dropout), nn.Linear(o.hidden, 1)]
        self.model = nn.Sequential(*layers)
        return self.model

    def loss_sum(self, model: nn.Module, batch) -> torch.Tensor:
        idx, x, y = batch
        self.seen.extend(idx.tolist())
        if isinstance(model, nn.parallel.DistributedDataParallel):
            self.sync_flags.append(model.require_backward_grad_sync)
        return ((model(x).squeeze(-1) - y) ** 2).sum()

    def eval_sums(self, model: nn.Module, batch):
        idx, x, y = batch
        return {"loss": ((model(x).squeeze(-1) - y) ** 2).sum(), "n": torch.tensor(len(idx))}

    def eval_metrics(self, sums):
        return {"val_loss": sums["loss"] / sums["n"]}


class LinearParams(nn.Module):
    """One parameter vector ``p`` (2,), zeros; ``forward(c_B2) = c_B2 @ p`` (B,)."""

    def __init__(self) -> None:
        super().__init__()
        self.p = nn.Parameter(torch.zeros(2))

    def forward(self, c_B2: torch.Tensor) -> torch.Tensor:
        return c_B2 @ self.p


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinearOptions:
    n_samples: int = option(10, "training samples")
    c1: float = option(3.0, "first coefficient of every sample")
    c2: float = option(4.0, "second coefficient of every sample")


class LinearTask(Task):
    """Loss per sample ``c . p`` with the same ``c`` for every sample: the gradient is ``c``.

    Whatever the batching, the gradient of the mean loss is exactly ``c``
    (norm 5 for the default c = (3, 4)).
    """

    name = "toy-linear"
    Options = LinearOptions
    metrics: Mapping[str, str] = {"val_loss": "minimize"}
    objective = "val_loss"

    def datasets(self, seed: int):
        o = self.options
        c = torch.tensor([[o.c1, o.c2]]).repeat(o.n_samples, 1)
        return IndexedDataset(c), IndexedDataset(c[:2])

    def build_model(self, config: TrainConfig) -> nn.Module:
        self.model = LinearParams()
        return self.model

    def loss_sum(self, model, batch) -> torch.Tensor:
        _, c = batch
        return model(c).float().sum()

    def eval_sums(self, model, batch):
        _, c = batch
        return {"loss": model(c).float().sum(), "n": torch.tensor(len(c))}

    def eval_metrics(self, sums):
        return {"val_loss": sums["loss"] / sums["n"]}


@dataclasses.dataclass(frozen=True, kw_only=True)
class TokenOptions:
    n_samples: int = option(8, "sequences")
    vocab_size: int = option(11, "vocabulary size (token 0 is padding)")
    max_len: int = option(9, "longest sequence")
    d_model: int = option(6, "embedding width")


class TokenTask(Task):
    """Next-token prediction over variable-length, right-padded sequences (token loss)."""

    name = "toy-tokens"
    Options = TokenOptions
    metrics: Mapping[str, str] = {"val_loss": "minimize"}
    objective = "val_loss"
    item_unit = "token"

    def datasets(self, seed: int):
        o = self.options
        g = torch.Generator().manual_seed(99)
        lengths = torch.randint(1, o.max_len + 1, (o.n_samples + 4,), generator=g).tolist()
        seqs = [torch.randint(1, o.vocab_size, (n + 1,), generator=g) for n in lengths]
        items = [(s[:-1], s[1:]) for s in seqs]
        return _ListDataset(items[:o.n_samples]), _ListDataset(items[o.n_samples:])

    def collate(self, samples):
        x_BT, mask_BT = pad_collate([x for x, _ in samples])
        y_BT, _ = pad_collate([y for _, y in samples])
        return x_BT, y_BT, mask_BT

    def n_items(self, batch) -> int:
        return int(batch[2].sum())

    def build_model(self, config: TrainConfig) -> nn.Module:
        o = self.options
        self.model = nn.Sequential(nn.Embedding(o.vocab_size, o.d_model),
                                   nn.Linear(o.d_model, o.vocab_size))
        return self.model

    def token_losses(self, model, batch) -> torch.Tensor:
        x_BT, y_BT, mask_BT = batch
        logits_BTV = model(x_BT).float()
        losses_BT = F.cross_entropy(logits_BTV.transpose(1, 2), y_BT, reduction="none")
        return losses_BT * mask_BT

    def loss_sum(self, model, batch) -> torch.Tensor:
        return self.token_losses(model, batch).sum()

    def eval_sums(self, model, batch):
        return {"loss": self.loss_sum(model, batch), "n": batch[2].sum()}

    def eval_metrics(self, sums):
        return {"val_loss": sums["loss"] / sums["n"]}


class _ListDataset(Dataset):
    def __init__(self, items) -> None:
        self.items = items

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


def flat_params(model: nn.Module) -> torch.Tensor:
    """All parameters of ``model`` as one detached fp32 vector."""
    return torch.cat([p.detach().float().flatten() for p in model.parameters()])
