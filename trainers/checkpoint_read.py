"""Reading a checkpoint back (``trainers.checkpoint`` writes them): the state of one
checkpoint directory, or of the newest one under a root that loads, agreed between the
ranks of a run."""

from __future__ import annotations

import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from trainers import checkpoint as ckpt
from trainers.checkpoint import SHARDED_STATE_FILE, STATE_FILE
from trainers.errors import CheckpointError

_log = logging.getLogger("trainers.checkpoint")  # the warnings as they were named


def load_checkpoint(path: Path, fall_back: bool = True,
                    agree: Callable[[int], list[int]] | None = None) -> dict[str, Any]:
    """Read the state of a checkpoint directory, or of the newest one under a root that
    loads: with ``fall_back``, one whose ``state.pt`` a power loss tore (written without
    ``checkpoint_fsync``: it does not unpickle) is skipped with a warning naming it, for
    the one before it; the resumed run's next checkpoint then retires the skipped one
    (:func:`trainers.checkpoint.publish`). An ``OSError`` or ``MemoryError`` reading it
    is no tear and is raised.

    ``agree`` makes the ranks of one run load the same checkpoint (helper-40: two DDP
    ranks that fell back on their own resumed from different steps): a collective that
    gathers an int of every rank (``fit`` passes
    :func:`trainers.distributed.gather_objects`). Each rank offers the step of the newest
    checkpoint it can load; while they differ, every rank looks for the newest at or
    before the oldest offered. A rank's error raises on every rank, each naming it, so
    that none waits on the others.

    Raises:
        CheckpointError: nothing loadable at ``path`` (a directory: its state; a root:
            its newest, or any of its checkpoints with ``fall_back``), or the newest is
            sharded (FSDP); with ``agree``, also where another rank could not load one.
    """
    path = Path(path)
    listing_error = None
    try:
        if (path / STATE_FILE).is_file() or (path / SHARDED_STATE_FILE).is_file():
            found = [(0, path)]
        else:
            found = list(reversed(ckpt.list_checkpoints(path)))  # newest first
    except OSError as e:  # a stat's EIO or EACCES: every rank must hear of it
        found, listing_error = [], _read_error(f"cannot list the checkpoints of {path}", e)
    failures: list[CheckpointError] = []

    def newest_loadable(bound: int | None) -> tuple[int, dict[str, Any]] | CheckpointError:
        """(step, state) of the newest checkpoint at or before ``bound`` that loads, or the
        error that ends the search."""
        if listing_error is not None:
            return listing_error
        for step, checkpoint in found:
            if bound is not None and step > bound:
                continue
            try:
                return step, _load_state(checkpoint)
            except CheckpointError as e:
                error = e
            except Exception as e:  # noqa: BLE001 - a stat's EIO: no tear, and no rank may
                error = _read_error(f"cannot read checkpoint {checkpoint}", e)  # raise alone
            if not fall_back or len(found) == 1 or isinstance(
                    error.__cause__, OSError | MemoryError) or _sharded(checkpoint):
                return error
            failures.append(error)
            _log.warning("skipping checkpoint %s: %s", checkpoint.name, error)
        if not found:
            return CheckpointError(f"no checkpoint at {path} (expected {STATE_FILE} or "
                                   f"checkpoint-NNNNNNNN/ directories)")
        if bound is not None:  # the ranks' searches met no checkpoint all of them load
            return CheckpointError(f"no checkpoint under {path} at or before step {bound} "
                                   f"loads on this rank, and no later one on every rank "
                                   f"of this run")
        return CheckpointError(f"{failures[0]}; no older checkpoint under {path} loads "
                               f"either")

    bound, held = None, None
    while True:
        if held is None or (bound is not None and held[0] > bound):
            held = got = None  # its state freed before the next one loads
            got = newest_loadable(bound)
            held = None if isinstance(got, CheckpointError) else got
        offers = [-1 if held is None else held[0]]
        if agree is not None:
            offers = [int(offer) for offer in agree(offers[0])]
        if held is None:
            raise got
        if -1 in offers:
            raise CheckpointError(f"another rank of this run could not load a checkpoint "
                                  f"of {path}: see its error")
        if len(set(offers)) == 1:
            if held[0] != found[0][0]:
                _log.warning("resuming from %s, the newest checkpoint that loads%s",
                             dict(found)[held[0]].name,
                             "" if agree is None else " on every rank")
            return held[1]
        bound = min(offers)  # another rank cannot load the newer one this rank holds


def _read_error(message: str, e: BaseException) -> CheckpointError:
    error = CheckpointError(f"{message}: {type(e).__name__}: {e}")
    error.__cause__ = e
    return error


def _sharded(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` is FSDP's (``trainers.dcp``); unknowable counts as sharded,
    which no search falls back past."""
    try:
        return (checkpoint / SHARDED_STATE_FILE).is_file()
    except OSError:
        return True


def _load_state(path: Path) -> dict[str, Any]:
    if not (path / STATE_FILE).is_file():
        raise CheckpointError(f"{path} is a sharded (FSDP) checkpoint: resume it with "
                              "parallelism=fsdp")
    try:
        return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same to the caller
        raise CheckpointError(f"cannot read checkpoint {path}: {type(e).__name__}: {e}") from e
