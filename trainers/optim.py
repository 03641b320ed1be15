"""Optimizer construction: AdamW or SGD, with no weight decay on biases and norm weights."""

from __future__ import annotations

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.errors import ConfigError


def param_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Split trainable parameters into a decayed and a non-decayed group.

    Matrices and embeddings (``ndim >= 2``) decay; biases and the weights of
    normalization layers (``ndim < 2``) do not (the convention of nanoGPT and
    of "Decoupled Weight Decay Regularization", Loshchilov & Hutter, 2019).
    Order follows ``model.named_parameters()``, so it is deterministic.
    """
    decay, no_decay = [], []
    for _, p in model.named_parameters():
        if p.requires_grad:
            (decay if p.ndim >= 2 else no_decay).append(p)
    return [
        {"params": decay, "weight_decay": weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]


def build_optimizer(model: nn.Module, config: TrainConfig) -> torch.optim.Optimizer:
    """The optimizer named by ``config.optimizer`` at the peak LR ``config.lr``.

    Raises:
        ConfigError: another optimizer name (never taken for the default).
    """
    groups = param_groups(model, config.weight_decay)
    if config.optimizer == "sgd":
        return torch.optim.SGD(groups, lr=config.lr, momentum=config.momentum)
    if config.optimizer == "adamw":
        return torch.optim.AdamW(groups, lr=config.lr,
                                 betas=(config.adam_beta1, config.adam_beta2))
    raise ConfigError("optimizer", f"must be adamw or sgd, got {config.optimizer!r}")
