"""The ``Task`` protocol: what the loop needs to know about a model and its data.

A task owns a model, its datasets and its loss. The loop owns everything else
(batching, accumulation, precision, schedules, checkpoints, DDP). Losses are
returned as *sums* over items (samples, or real tokens for token losses) so that
the loop can average over the whole accumulation group, across ranks, exactly.

Tensor shape legend used by the built-in tasks: B batch, T time (tokens),
C channels, H/W height/width, V vocabulary, D model width.
"""

from __future__ import annotations

import abc
import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import torch
from torch import nn
from torch.utils.data import Dataset, default_collate

from trainers.config import TrainConfig
from trainers.errors import ConfigError
from trainers.fields import FieldInfo, describe

Direction = Literal["minimize", "maximize"]


@dataclasses.dataclass(frozen=True, kw_only=True)
class NoOptions:
    """A task without options of its own."""


class Task(abc.ABC):
    """A trainable problem: a model, its data, its loss and its evaluation metrics.

    Subclasses set the class attributes and implement the abstract methods.

    Class attributes:
        name: the registry name (``digits``).
        Options: a keyword-only dataclass of the task's own hyperparameters
            (model width, dropout, ...), declared with ``trainers.fields.option``.
        metrics: every evaluation metric the task reports, with its direction.
        objective: the default metric to optimize (a key of ``metrics``).
        item_unit: ``"sample"`` or ``"token"``: what ``n_items`` counts and the
            loss is averaged over. With ``"token"`` the loop reports tokens/s.
        default_config: ``TrainConfig`` values with which the task trains well.
        mutable_options: options that may change when a run resumes from a
            checkpoint (they change no parameter shape), e.g. dropout; PBT may
            mutate only these and the optimizer's hyperparameters.
        supports_activation_checkpointing: whether ``build_model`` honours
            ``config.activation_checkpointing`` (asking a task that does not is
            an error, not a silent no-op).
    """

    name: ClassVar[str]
    Options: ClassVar[type] = NoOptions
    metrics: ClassVar[Mapping[str, Direction]]
    objective: ClassVar[str]
    item_unit: ClassVar[Literal["sample", "token"]] = "sample"
    default_config: ClassVar[Mapping[str, Any]] = {}
    supports_activation_checkpointing: ClassVar[bool] = False
    mutable_options: ClassVar[frozenset[str]] = frozenset()

    def __init__(self, options: Any = None) -> None:
        self.options = options if options is not None else self.Options()

    # -- what a task must provide -------------------------------------------------------

    @abc.abstractmethod
    def datasets(self, seed: int) -> tuple[Dataset, Dataset]:
        """The training and validation datasets (map-style: ``len`` and ``__getitem__``).

        ``seed`` is the run's seed, for data drawn at random (the loop's own
        shuffling does not need it). A training dataset with a
        ``set_epoch(epoch)`` method is told every epoch before it is read.
        """

    @abc.abstractmethod
    def build_model(self, config: TrainConfig) -> nn.Module:
        """A freshly initialized model; the loop seeds the global RNG before calling.

        ``config.activation_checkpointing`` asks for per-block recomputation.
        """

    @abc.abstractmethod
    def loss_sum(self, model: nn.Module, batch: Any) -> torch.Tensor:
        """The *sum* of per-item losses of a micro-batch: a 0-dim float tensor."""

    @abc.abstractmethod
    def eval_sums(self, model: nn.Module, batch: Any) -> dict[str, torch.Tensor]:
        """Additive statistics of one evaluation batch (0-dim tensors), e.g. loss sum, count."""

    @abc.abstractmethod
    def eval_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
        """The evaluation metrics from the statistics summed over the whole validation set."""

    # -- defaults that suit most tasks ----------------------------------------------------

    def collate(self, samples: list[Any]) -> Any:
        """Stack a list of samples into a micro-batch."""
        return default_collate(samples)

    def n_samples(self, batch: Any) -> int:
        """Number of samples in a micro-batch (default: length of the first tensor)."""
        first = batch[0] if isinstance(batch, tuple | list) else batch
        return int(first.shape[0])

    def n_items(self, batch: Any) -> int:
        """Number of loss items in a micro-batch: samples, or real (unpadded) tokens."""
        return self.n_samples(batch)

    def blocks(self, model: nn.Module) -> list[nn.Module]:
        """The submodules FSDP shards one by one (``TrainConfig.parallelism = "fsdp"``).

        Each is all-gathered for its own forward and backward, so a rank holds
        at most one block's full parameters at a time; the rest of the model is
        sharded as the root. Default: none (the root is sharded as one unit).
        Transformer blocks are the usual choice.
        """
        return []

    def parameter_count(self, config: TrainConfig) -> int:
        """Number of parameters (elements, >= 0) of the model ``build_model`` would build,
        without allocating them: the default builds it on PyTorch's ``meta`` device.

        A service bounds a study's model size with it when the study is created
        (``HPO_MAX_MODEL_PARAMETERS``). Override it when building the model reads data or
        takes time (``charlm`` counts by formula).

        Raises:
            ConfigError: the options give no model.
        """
        with torch.device("meta"):
            model = self.build_model(config)
        return sum(p.numel() for p in model.parameters())

    @classmethod
    def fields(cls) -> list[FieldInfo]:
        """The task's own options (``TrainConfig`` fields are described separately)."""
        return describe(cls.Options)

    @classmethod
    def check_config(cls, config: TrainConfig) -> None:
        """Refuse training options this task cannot honour.

        Called by ``trainers.create`` and again by every run (``fit``), so a
        config built by hand is held to the same rules.

        Raises:
            ConfigError: ``objective`` (field ``task``) or ``early_stopping_metric`` is
                not one of ``metrics``, or
                ``activation_checkpointing`` is asked of a task that does not
                support it.
        """
        if config.early_stopping_metric is None and cls.objective not in cls.metrics:
            # the class's own mistake, no config field's (helper-41 saw it blamed on
            # early_stopping_metric, which the spec did not set)
            raise ConfigError("task", f"the task class {cls.__module__}.{cls.__qualname__} "
                                      f"declares objective {cls.objective!r}, which is not one "
                                      f"of its metrics {sorted(cls.metrics)}")
        metric = config.early_stopping_metric or cls.objective
        if metric not in cls.metrics:
            raise ConfigError("early_stopping_metric",
                              f"task {cls.name!r} reports {sorted(cls.metrics)}, not {metric!r}")
        if config.activation_checkpointing and not cls.supports_activation_checkpointing:
            raise ConfigError("activation_checkpointing",
                              f"task {cls.name!r} has no blocks to recompute; only tasks "
                              "that support it (charlm) accept true")
