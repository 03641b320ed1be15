"""Activation checkpointing per transformer block leaves gradients unchanged."""

from __future__ import annotations

import torch

from trainers import TrainConfig
from trainers.tasks.charlm import CharLMOptions, CharLMTask


def _counting(forward, calls: list):
    def wrapped(*args, **kwargs):
        calls.append(1)
        return forward(*args, **kwargs)

    return wrapped


def _grads(task, batch, activation_checkpointing: bool, calls: list):
    torch.manual_seed(0)
    model = task.build_model(TrainConfig(activation_checkpointing=activation_checkpointing))
    for block in model.blocks:  # count every run of a block's forward, recomputations too
        block.forward = _counting(block.forward, calls)
    task.loss_sum(model, batch).backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}


def test_gradients_equal_without_checkpointing(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("def f(x):\n    return x * 2 + 1\n" * 200)
    options = CharLMOptions(corpus=str(corpus), cache_dir=str(tmp_path / "cache"), block_size=32,
                            n_layer=3, n_head=2, d_model=32)
    task = CharLMTask(options)
    train, _ = task.datasets(0)
    batch = task.collate([train[i] for i in range(4)])
    plain_calls, ckpt_calls = [], []
    plain = _grads(task, batch, False, plain_calls)
    checkpointed = _grads(task, batch, True, ckpt_calls)
    assert len(plain_calls) == 3 and len(ckpt_calls) == 6  # each block recomputed in backward
    for name in plain:
        assert (plain[name] - checkpointed[name]).abs().max().item() <= 1e-6, name
