"""Tasks that each break one rule of the task contract (``trainers.contract``).

Each is the toy regression task (which keeps every rule) with one fault.
"""

from __future__ import annotations

import abc
import dataclasses
import os
import sys
import threading

import torch
from torch import nn

from tests.trainers.toy_tasks import IndexedDataset, RegressionOptions, RegressionTask
from trainers.fields import option, require


class MeanLossTask(RegressionTask):
    """``loss_sum`` returns the mean over the micro-batch: the most common mistake."""

    def loss_sum(self, model, batch) -> torch.Tensor:
        _, x, y = batch
        return ((model(x).squeeze(-1) - y) ** 2).mean()


class MissingMetricTask(RegressionTask):
    """Declares ``val_r2`` but ``eval_metrics`` never returns it."""

    metrics = {"val_loss": "minimize", "val_r2": "maximize"}


class ReservedMetricTask(RegressionTask):
    """Reports a metric named ``done``, a key Ray Tune reads (helper-41: its trial ended at
    the first report)."""

    metrics = {"val_loss": "minimize", "done": "maximize"}

    def eval_metrics(self, sums):
        return {**super().eval_metrics(sums), "done": sums["n"] * 0.0}


class NondeterministicTask(RegressionTask):
    """Draws its data from the operating system's entropy, not from the seed."""

    def datasets(self, seed: int):
        g = torch.Generator().manual_seed(int.from_bytes(os.urandom(4), "little"))
        x = torch.randn(96, 4, generator=g)
        y = torch.randn(96, generator=g)
        return IndexedDataset(x[:64], y[:64]), IndexedDataset(x[64:], y[64:])


class _CountingModel(nn.Module):
    """Scales its output by the number of training forward passes, kept in a plain attribute
    (not a buffer): a checkpoint does not hold it."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner = inner
        self.n_forward = 0

    def forward(self, x):
        if self.training:
            self.n_forward += 1
        return self.inner(x) * (1.0 + 0.1 * self.n_forward)


class NonResumableTask(RegressionTask):
    def build_model(self, config):
        return _CountingModel(super().build_model(config))


class MutableShapeTask(RegressionTask):
    """Declares ``hidden`` mutable, though it sets the width of two layers."""

    mutable_options = frozenset({"hidden"})


class UnpicklableTask(RegressionTask):
    def __init__(self, options=None) -> None:
        super().__init__(options)
        self.lock = threading.Lock()


class BuildRaisesTask(RegressionTask):
    def build_model(self, config):
        raise RuntimeError("no such layer: Linear3000")


class ExitsInBuildTask(RegressionTask):
    """Calls ``sys.exit(0)``, which is no Exception (helper-41: the checks let it end them)."""

    def build_model(self, config):
        sys.exit(0)


class ChdirTask(RegressionTask):
    """Changes the process's working directory and torch's default dtype as it builds its
    data (helper-41: the service's relative paths moved with it)."""

    def datasets(self, seed):
        os.chdir("/")
        torch.set_default_dtype(torch.float64)
        return super().datasets(seed)


class ItemInBuildTask(RegressionTask):
    """Reads a tensor's value in build_model: fine on the CPU, impossible on the meta device
    the checks build on."""

    def build_model(self, config):
        model = super().build_model(config)
        model.scale = torch.tensor(4.0).rsqrt().item()
        return model


class CountedItemTask(ItemInBuildTask):
    """:class:`ItemInBuildTask` with its own parameter count, as the hint says."""

    def parameter_count(self, config) -> int:
        o = self.options
        return (o.n_features + 1) * o.hidden + (o.hidden + 1) + 2 * o.hidden * o.batch_norm


class InitRaisesTask(RegressionTask):
    """Raises a plain RuntimeError (not ConfigError) when it is created with more than 8
    hidden units, and KeyError from ``check_config`` for 3 or more updates."""

    def __init__(self, options=None) -> None:
        super().__init__(options)
        if self.options.hidden > 8:
            raise RuntimeError("hidden units over 8 need the GPU kernel")

    @classmethod
    def check_config(cls, config) -> None:
        super().check_config(config)
        if config.max_updates is not None and config.max_updates >= 3:
            raise KeyError("schedule table")


@dataclasses.dataclass(frozen=True, kw_only=True)
class WrongBoundOptions(RegressionOptions):
    width: int = option(8, "hidden units (1..64)")

    def __post_init__(self) -> None:
        require(1 <= self.width <= 32, "width", f"must be in 1..32, got {self.width}")


class WrongBoundTask(RegressionTask):
    """Documents ``width`` up to 64 but refuses more than 32."""

    Options = WrongBoundOptions


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShadowingOptions(RegressionOptions):
    lr: float = option(0.1, "the task's own rate, named like TrainConfig's lr")


class ShadowingOptionTask(RegressionTask):
    """An option named like a TrainConfig field (helper-41: one value set both)."""

    Options = ShadowingOptions


class MissingObjectiveTask(RegressionTask):
    """Declares ``val_mae`` as its objective but ``eval_metrics`` never returns it: the loop,
    which reads the objective after each evaluation, cannot train the task."""

    metrics = {"val_loss": "minimize", "val_mae": "minimize"}
    objective = "val_mae"


class UndeclaredObjectiveTask(RegressionTask):
    """Names an objective that is not among its declared metrics."""

    objective = "acc"


class NoisyLossTask(RegressionTask):
    """``loss_sum`` adds noise from the global RNG: the same batch twice gives two losses
    (two runs from one seed are still identical: the loop seeds that RNG)."""

    def loss_sum(self, model, batch) -> torch.Tensor:
        return super().loss_sum(model, batch) + 0.5 + torch.rand(())


class AbstractRegressionTask(RegressionTask):
    """A base for other tasks: ``loss_sum`` is left to its subclasses."""

    @abc.abstractmethod
    def loss_sum(self, model, batch) -> torch.Tensor: ...


class Outer:
    class Inner(RegressionTask):
        """A sound task nested in a class (``module:Outer.Inner``)."""


class UnprintableError(Exception):
    def __str__(self):
        return 42  # not a str: str() of it raises TypeError


class UnprintableErrorTask(RegressionTask):
    """Raises an exception whose message cannot be shown (helper-41: a traceback)."""

    def build_model(self, config):
        raise UnprintableError()
