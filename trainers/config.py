"""``TrainConfig``: every knob of the training loop, validated at construction.

A "step" is always an optimizer update; a micro-batch is what one forward and
backward pass sees; ``grad_accum_steps`` micro-batches make one update, so the
effective batch size is ``micro_batch_size * grad_accum_steps * world_size``.
"""

from __future__ import annotations

import dataclasses
from typing import Literal

from trainers.fields import check_fields, option, require

Precision = Literal["fp32", "bf16", "fp16"]
Schedule = Literal["constant", "linear", "cosine", "wsd"]
Parallelism = Literal["ddp", "fsdp"]
# DataLoader processes a run may start: a larger count forks until memory runs out (2**32
# went to the out-of-memory killer); ``hpo``'s spec check uses the same bound
MAX_NUM_WORKERS = 256
# lr and weight_decay at most this: far above any trained rate, and far below what the
# optimizers' float32 arithmetic overflows at (AdamW's lr / (1 - beta1**t), lr * weight_decay:
# helper-38's lr 1e308 was a traceback from inside AdamW's step)
MAX_RATE = 1e6


@dataclasses.dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """The configuration of one training run. All counts of steps are optimizer updates.

    Raises:
        ConfigError: at construction, naming the first invalid field.
    """

    # data and batching
    micro_batch_size: int = option(32, "samples per micro-batch per process (>= 1)")
    grad_accum_steps: int = option(1, "micro-batches accumulated into one optimizer update (>= 1)")
    eval_batch_size: int | None = option(
        None, "samples per evaluation batch (>= 1); default: micro_batch_size"
    )
    num_workers: int = option(0, f"DataLoader worker processes (0..{MAX_NUM_WORKERS})")
    # length of training
    max_updates: int | None = option(None, "stop after this many optimizer updates (>= 1)")
    max_epochs: int | None = option(10, "stop after this many epochs (>= 1)")
    # optimizer
    optimizer: Literal["adamw", "sgd"] = option("adamw", "optimizer: adamw, or sgd with momentum")
    lr: float = option(1e-3, "peak learning rate, in (0, 1e6]")
    weight_decay: float = option(
        0.0, "weight decay in [0, 1e6]: decoupled with adamw, L2 folded into the gradient "
             "with sgd; never applied to biases and norm weights"
    )
    momentum: float = option(0.9, "SGD momentum in [0, 1)")
    adam_beta1: float = option(0.9, "AdamW beta1 in [0, 1)")
    adam_beta2: float = option(0.999, "AdamW beta2 in [0, 1)")
    # learning-rate schedule
    schedule: Schedule = option("cosine", "LR schedule after warmup: constant, linear, cosine, wsd")
    warmup_steps: int = option(0, "linear warmup length in optimizer updates (>= 0)")
    min_lr_ratio: float = option(0.0, "final LR as a fraction of lr, in [0, 1]")
    wsd_decay_fraction: float = option(
        0.2, "wsd: fraction of the post-warmup updates spent decaying, in (0, 1]"
    )
    # precision and stability
    precision: Precision = option("fp32", "fp32, bf16 (autocast) or fp16 (autocast + GradScaler)")
    init_loss_scale: float = option(2.0**16, "fp16: initial loss scale (> 0)")
    max_grad_norm: float | None = option(
        1.0, "clip the global gradient L2 norm to this value (> 0); null: no clipping"
    )
    # EMA
    ema_decay: float | None = option(
        None, "EMA of parameters and buffers with this decay in [0, 1); null: no EMA"
    )
    eval_with_ema: bool = option(True, "evaluate the EMA weights when EMA is on")
    # memory and speed
    activation_checkpointing: bool = option(
        False, "recompute each transformer block in backward (use_reentrant=False)"
    )
    compile: bool = option(False, "torch.compile the model")
    device: str = option("auto", "auto, cpu, cuda or cuda:N; auto picks cuda when available")
    parallelism: Parallelism = option(
        "ddp", "with torch.distributed initialized (torchrun, Ray Train): ddp replicates the "
               "model; fsdp shards it with FSDP2 and writes sharded (DCP) checkpoints"
    )
    # evaluation, checkpoints, early stopping
    eval_interval: int | None = option(
        None, "evaluate every this many updates (>= 1); null: at the end of every epoch"
    )
    checkpoint_dir: str | None = option(None, "directory for checkpoints; null: none written",
                                        path=True)
    checkpoint_interval: int | None = option(
        None, "checkpoint every this many updates (>= 1); null: at every evaluation"
    )
    keep_last_checkpoints: int = option(2, "checkpoints kept besides the best (>= 1)")
    checkpoint_fsync: bool = option(
        True, "fsync checkpoints before renaming them into place (they survive an OS crash); "
              "false where each is copied elsewhere at once (a Ray Tune trial)"
    )
    early_stopping_metric: str | None = option(
        None, "evaluation metric watched by early stopping; null: the task's objective"
    )
    early_stopping_patience: int | None = option(
        None, "stop after this many evaluations without improvement (>= 1); null: off"
    )
    early_stopping_min_delta: float = option(
        0.0, "an improvement must exceed this amount (>= 0)"
    )
    seed: int = option(0, "seed of model init, data order, dropout, in [0, 2**32)")

    def __post_init__(self) -> None:
        check_fields(self)  # types, choices, finiteness: what build() checks of a mapping
        positive = ["micro_batch_size", "grad_accum_steps", "eval_batch_size", "max_updates",
                    "max_epochs", "eval_interval", "checkpoint_interval", "keep_last_checkpoints",
                    "early_stopping_patience"]
        for name in positive:
            value = getattr(self, name)
            require(value is None or value >= 1, name, f"must be >= 1, got {value}")
        for name in ["num_workers", "warmup_steps", "weight_decay", "early_stopping_min_delta",
                     "seed"]:
            value = getattr(self, name)
            require(value >= 0, name, f"must be >= 0, got {value}")
        require(self.max_updates is not None or self.max_epochs is not None, "max_updates",
                "set max_updates or max_epochs (or both)")
        require(0 < self.lr <= MAX_RATE, "lr", f"must be in (0, 1e6], got {self.lr}")
        require(self.weight_decay <= MAX_RATE, "weight_decay",
                f"must be <= 1e6, got {self.weight_decay}")
        require(0 < self.init_loss_scale <= 2.0**127, "init_loss_scale",
                f"must be in (0, 2**127] (fp32 range), got {self.init_loss_scale}")
        require(self.seed < 2**32, "seed", f"must be < 2**32, got {self.seed}")
        require(self.num_workers <= MAX_NUM_WORKERS, "num_workers",
                f"must be <= {MAX_NUM_WORKERS}, got {self.num_workers}")
        for name in ["momentum", "adam_beta1", "adam_beta2"]:
            value = getattr(self, name)
            require(0 <= value < 1, name, f"must be in [0, 1), got {value}")
        require(0 <= self.min_lr_ratio <= 1, "min_lr_ratio",
                f"must be in [0, 1], got {self.min_lr_ratio}")
        require(0 < self.wsd_decay_fraction <= 1, "wsd_decay_fraction",
                f"must be in (0, 1], got {self.wsd_decay_fraction}")
        require(self.max_grad_norm is None or self.max_grad_norm > 0, "max_grad_norm",
                f"must be > 0 or null, got {self.max_grad_norm}")
        require(self.ema_decay is None or 0 <= self.ema_decay < 1, "ema_decay",
                f"must be in [0, 1) or null, got {self.ema_decay}")
        require(self.checkpoint_dir is None or self.checkpoint_dir.strip() != "",
                "checkpoint_dir", f"must be a directory or null (no checkpoints), got "
                                  f"{self.checkpoint_dir!r}")
        device = self.device
        require(device in ("auto", "cpu", "cuda") or (device.startswith("cuda:")
                and device[5:].isdigit()), "device",
                f"must be auto, cpu, cuda or cuda:N, got {device!r}")

    def replace(self, **changes: object) -> TrainConfig:
        """A copy with some fields changed (validated again)."""
        return dataclasses.replace(self, **changes)
