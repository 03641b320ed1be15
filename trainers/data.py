"""Data order, micro-batching, padding and token-window datasets.

The order of an epoch comes from ``torch.utils.data.DistributedSampler``
(shuffled with seed ``seed`` and ``set_epoch(epoch)``), also in a single process
where it is the 1-replica case. The order therefore depends on the seed and the
epoch only, never on the micro-batch size, and ``world_size`` ranks together
see exactly the samples one process would: rank ``r`` takes positions
``r, r + world_size, ...`` of the same permutation. (When the dataset size is
not a multiple of ``world_size`` the sampler pads with a few repeated samples,
so that every rank makes the same number of updates.)

Random augmentation: in one process (``num_workers`` 0) a dataset draws from the
process's RNGs, which checkpoints keep. In worker processes each micro-batch
first seeds torch's, numpy's and Python's RNGs from ``(seed, epoch, rank, the
batch's offset in the epoch)`` (``batch_seeds``), so epochs draw new numbers,
the number of workers changes nothing, and a resumed run draws what the
uninterrupted one drew. (The two settings draw different numbers.)

Tensor shape legend: B batch, T time (tokens).
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, DistributedSampler


def epoch_order(dataset: Dataset, *, seed: int, epoch: int, rank: int = 0,
                world_size: int = 1) -> list[int]:
    """The indices this rank visits in ``epoch``, in order (``DistributedSampler``)."""
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True,
                                 seed=seed, drop_last=False)
    sampler.set_epoch(epoch)
    return list(sampler)


def micro_batches(order: Sequence[int], micro_batch_size: int) -> list[list[int]]:
    """Consecutive micro-batches of ``order``; the last one may be smaller."""
    return [list(order[i:i + micro_batch_size]) for i in range(0, len(order), micro_batch_size)]


def n_updates_per_epoch(n_samples: int, micro_batch_size: int, grad_accum_steps: int) -> int:
    """Optimizer updates in one epoch of ``n_samples`` (per rank); a partial group counts."""
    n_micro = -(-n_samples // micro_batch_size)
    return -(-n_micro // grad_accum_steps)


def batch_seeds(*, seed: int, epoch: int, rank: int, offsets: Sequence[int]) -> list[int]:
    """One seed per micro-batch, from the run's seed, the epoch, the rank and the batch's offset.

    ``offsets[k]`` is the position of micro-batch ``k``'s first sample in this
    rank's order of ``epoch`` (``epoch_order``), so a batch's seed does not depend
    on where a run was resumed, nor on which worker process loads it.

    Returns:
        64-bit seeds in [0, 2**64), one per offset.
    """
    return [int(np.random.SeedSequence([seed, epoch, rank, offset]).generate_state(
        1, np.uint64)[0]) for offset in offsets]


class _SeededBatches(Dataset):
    """``dataset`` loading ``(batch_seed, indices)`` pairs: each batch in a worker process
    first seeds torch's, numpy's (legacy global) and Python's ``random`` RNGs with its seed.

    Every batch therefore draws the same random numbers (a random augmentation in
    ``__getitem__``) wherever and whenever it is loaded: each epoch draws new ones,
    and a resumed run draws those the uninterrupted one drew, whichever worker
    (``DataLoader`` hands batches round-robin from its start) loads the batch.
    """

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, seeded: tuple[int, list[int]]) -> list:
        seed, indices = seeded
        torch.manual_seed(seed)
        np.random.seed([seed & 0xFFFFFFFF, seed >> 32])
        random.seed(seed)
        getitems = getattr(self.dataset, "__getitems__", None)
        return getitems(indices) if getitems else [self.dataset[i] for i in indices]


def loader(dataset: Dataset, batches: list[list[int]], collate, *, num_workers: int = 0,
           pin_memory: bool = False, seeds: Sequence[int] | None = None) -> DataLoader:
    """A ``DataLoader`` that yields exactly ``batches`` (lists of indices), in order.

    The loader gets its own generator so that creating its iterator never draws
    from the global torch RNG, which dropout uses (a resumed run would otherwise
    drift from the uninterrupted one).

    With ``num_workers`` > 0 each batch is loaded after seeding the worker's RNGs
    with ``seeds[k]`` (``batch_seeds``; one per batch, required then). In one
    process (``num_workers`` 0) a dataset draws from the process's own RNGs, whose
    states the checkpoints keep, as dropout does.

    Raises:
        ValueError: ``num_workers`` > 0 without one seed per batch.
    """
    if num_workers > 0:
        if seeds is None or len(seeds) != len(batches):
            raise ValueError(f"num_workers={num_workers} needs one seed per batch "
                             f"({len(batches)} batches)")
        dataset = _SeededBatches(dataset)
        batches = list(zip(seeds, batches, strict=True))
    return DataLoader(dataset, batch_sampler=batches, collate_fn=collate,
                      num_workers=num_workers, pin_memory=pin_memory,
                      generator=torch.Generator().manual_seed(0))


def grouped(it: Iterator, group_size: int) -> Iterator[list]:
    """Consecutive groups of ``group_size`` items of ``it``; the last may be smaller."""
    group: list = []
    for item in it:
        group.append(item)
        if len(group) == group_size:
            yield group
            group = []
    if group:
        yield group


def pad_collate(sequences: Sequence[torch.Tensor], pad_id: int = 0
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-pad 1-D token sequences into a batch.

    Args:
        sequences: B tensors of shape (T_i,), int64.

    Returns:
        tokens_BT: int64, padded with ``pad_id``; mask_BT: bool, True on real tokens.
    """
    t_max = max(len(s) for s in sequences)
    tokens_BT = torch.full((len(sequences), t_max), pad_id, dtype=torch.long)
    mask_BT = torch.zeros((len(sequences), t_max), dtype=torch.bool)
    for i, s in enumerate(sequences):
        tokens_BT[i, :len(s)] = s
        mask_BT[i, :len(s)] = True
    return tokens_BT, mask_BT


class TokenWindows(Dataset):
    """Random windows of ``block_size + 1`` tokens read from a memory-mapped token file.

    Nothing but the windows asked for is read, so the token file may be far
    larger than memory. Item ``i`` of epoch ``e`` is the window starting at
    offset ``starts[i]``, with ``starts`` drawn from a generator seeded with
    ``(seed, e)``: every epoch sees fresh windows, and the data order stays
    index-based so that the position in an epoch can be checkpointed and
    sharded across ranks like any map-style dataset.

    Args:
        tokens: a 1-D integer array (``np.memmap``), the token stream.
        block_size: tokens of model input per window (>= 1).
        n_windows: windows per epoch (>= 1).
        seed: seed of the window offsets.

    Items: ``(x_T, y_T)``, int64, ``y`` is ``x`` shifted by one token.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, n_windows: int, seed: int) -> None:
        if len(tokens) <= block_size + 1:
            raise ValueError(f"token stream of {len(tokens)} tokens is shorter than a window "
                             f"({block_size=} + 1)")
        self.tokens, self.block_size = tokens, block_size
        self.n_windows, self.seed = n_windows, seed
        self.set_epoch(0)

    def set_epoch(self, epoch: int) -> None:
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
        high = len(self.tokens) - self.block_size - 1
        # a tensor (8 bytes an offset), not a list (about 36)
        self.starts = torch.randint(0, high + 1, (self.n_windows,), generator=g)

    def __len__(self) -> int:
        return self.n_windows

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = int(self.starts[i])
        chunk = torch.from_numpy(self.tokens[start:start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


class ContiguousBlocks(Dataset):
    """Non-overlapping windows of a token stream, for evaluation.

    With ``max_blocks`` smaller than the number of blocks, the blocks kept are
    spread evenly over the whole stream (not its first part), so a small
    evaluation budget still samples all of it.

    Items: ``(x_T, y_T)`` int64 as in :class:`TokenWindows`.
    """

    def __init__(self, tokens: np.ndarray, block_size: int, max_blocks: int | None = None) -> None:
        n = (len(tokens) - 1) // block_size
        self.tokens, self.block_size = tokens, block_size
        kept = n if max_blocks is None else min(n, max_blocks)
        self.blocks = np.linspace(0, n - 1, kept).round().astype(np.int64).tolist()

    def __len__(self) -> int:
        return len(self.blocks)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        start = self.blocks[i] * self.block_size
        chunk = torch.from_numpy(self.tokens[start:start + self.block_size + 1].astype(np.int64))
        return chunk[:-1], chunk[1:]


def write_atomically(path: Path, data: bytes | str, durable: bool = True) -> None:
    """Write a file through a temporary file and ``os.replace`` (readers never see half).

    ``durable``: fsync before the rename, so that the file survives an OS crash too
    (a killed process never leaves half a file either way).
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    mode = "wb" if isinstance(data, bytes) else "w"
    with open(tmp, mode) as f:
        f.write(data)
        f.flush()
        if durable:
            os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: Path) -> dict:
    return json.loads(path.read_text())


def strict_json(data: Any, **dumps_options: Any) -> str:
    """``data`` as standard JSON: a non-finite float (NaN, +-inf; a diverged run's loss)
    becomes ``null``, where ``json.dumps`` writes ``NaN`` and ``Infinity``, which JSON
    readers (``jq``, browsers, other languages) refuse."""
    return json.dumps(_finite(data), allow_nan=False, **dumps_options)


def _finite(node: Any) -> Any:
    if isinstance(node, float) and not math.isfinite(node):
        return None
    if isinstance(node, dict):
        return {k: _finite(v) for k, v in node.items()}
    if isinstance(node, (list, tuple)):
        return [_finite(v) for v in node]
    return node
