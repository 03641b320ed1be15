"""Sharded checkpoints (``parallelism: fsdp``) with ``torch.distributed.checkpoint``.

Layout of one checkpoint (the name, ``meta.json``, retention and ``best.json``
as in ``trainers.checkpoint``)::

    root/checkpoint-00000120/.metadata        DCP: where every tensor shard lies
    root/checkpoint-00000120/__<rank>_0.distcp DCP: each rank's shards of the model,
                                               optimizer state and EMA shadow
    root/checkpoint-00000120/train_state.pt   rank 0: counters, data position, LR
                                               schedule, loss scaler, EMA update count,
                                               metrics history, every rank's RNG states
    root/checkpoint-00000120/meta.json

Writing is collective and atomic: rank 0 creates a temporary directory and
tells every rank its name; every rank writes its shards there (DCP); rank 0
adds ``train_state.pt`` and ``meta.json``; after a barrier rank 0 renames the
directory into place. A run killed at any point before the rename leaves the
previous checkpoints untouched and loadable (the next save removes the
leftover). A write that fails on any rank (a full disk) fails on every rank,
as ``CheckpointWriteError`` where the file system refused: the barriers say
whether a rank failed, so that none waits for the others, and rank 0 removes
the temporary directory. The checkpoint root must be one directory all ranks reach (one
machine, or shared storage).

Weights and optimizer state go through ``torch.distributed.checkpoint.state_dict``
(``get_state_dict`` / ``set_state_dict``: keys are parameter names, values
``DTensor`` shards under FSDP), so a checkpoint loads into any number of ranks:
DCP reshards on load (2 ranks -> 1 process, 1 -> 2). Resumed with the same
number of ranks the run continues bit for bit (fp32, CPU); with another, the
RNG states are not restored (the seed's are kept) and the data position is
carried over as the same fraction of the epoch, so training continues but
takes another path.

``torch.distributed.checkpoint`` is imported at the first sharded save or load
(about a second of import that other runs should not pay).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from trainers import checkpoint as ckpt
from trainers.components import Run
from trainers.data import write_atomically
from trainers.distributed import all_reduce_max
from trainers.errors import CheckpointError, CheckpointWriteError, ConfigError, misfit
from trainers.resume import (
    CHECKPOINT_FORMAT,
    Restored,
    TrainState,
    check_same_run,
    restore_loop_state,
)


@contextlib.contextmanager
def _quiet_if_alone(run: Run) -> Iterator[None]:
    """Silence DCP's warning that one process saves or loads alone: that is meant here."""
    with warnings.catch_warnings():
        if not run.dist.enabled:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


def _tensor_state(run: Run, with_ema: bool) -> dict[str, Any]:
    """Model, optimizer and (if ``with_ema``) EMA shadow state, keyed by parameter name."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model, optimizer = get_state_dict(run.model, run.optimizer)
    state = {"model": model, "optimizer": optimizer}
    if with_ema and run.ema is not None:
        state["ema"] = get_model_state_dict(run.ema.module)
    return state


def _agreed_temp_dir(run: Run, step: int) -> tuple[Path, Path]:
    """Rank 0's new temporary directory and the final path, on every rank.

    Raises:
        CheckpointWriteError: on every rank, when rank 0 could not create it.
    """
    names: list[Any] = [None, None, None]  # tmp, final, rank 0's error
    if run.dist.is_main:
        try:
            names[:2] = [str(p) for p in ckpt.new_temp_dir(run.checkpoint_root, step)]
        except CheckpointWriteError as e:
            names[2] = str(e)
    if run.dist.enabled:
        dist.broadcast_object_list(names, src=0)
    if names[2] is not None:
        raise CheckpointWriteError(names[2] if run.dist.is_main else f"rank 0: {names[2]}")
    return Path(names[0]), Path(names[1])


def _agree_on_failure(run: Run, failure: BaseException | None, final: Path,
                      tmp: Path | None) -> None:
    """Whether any rank failed a part of a save, on every rank (collective: it is the
    save's barrier); if one did, every rank raises, so that none waits for the others
    at the next collective, and rank 0 removes ``tmp``.

    Raises:
        CheckpointWriteError: a rank's write failed in the file system (a full disk);
            ranks that did not fail say so of another rank.
        BaseException: this rank's own failure, if not the file system's (DCP's
            ``CheckpointException`` of another error is a ``BaseException``).
    """
    if all_reduce_max(0.0 if failure is None else 1.0, run.dist) == 0.0:
        return
    if run.dist.is_main and tmp is not None:
        shutil.rmtree(tmp, ignore_errors=True)
    if failure is None:
        raise CheckpointWriteError(f"cannot write checkpoint {final}: another rank failed")
    error = None
    for cause in _failures(failure):
        error = error or ckpt.write_error(final, cause)
    if error is None:
        raise failure
    raise error from failure


def _failures(e: BaseException) -> list[BaseException]:
    """``e``, or the ranks' exceptions a ``CheckpointException`` of DCP gathered (its
    ``failures``: rank -> exception, or (exception, traceback) as DCP wraps them)."""
    failures = getattr(e, "failures", None)
    if not isinstance(failures, dict):
        return [e]
    return [f[0] if isinstance(f, tuple) else f for f in failures.values()]


def save(run: Run, state: dict[str, Any], meta: dict[str, Any]) -> Path | None:
    """Write the sharded checkpoint of ``state["trainer"]["step"]``; collective.

    Args:
        run: the run, with ``checkpoint_root`` set.
        state: ``trainers.resume.run_state(..., sharded=True)``: plain values,
            written by rank 0 as ``train_state.pt``.
        meta: JSON-compatible summary, written by rank 0 as ``meta.json``.

    Returns:
        The checkpoint directory on rank 0; ``None`` on the other ranks.
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException  # a BaseException

    durable = run.config.checkpoint_fsync
    tmp, final = _agreed_temp_dir(run, state["trainer"]["step"])
    failure: BaseException | None = None
    try:
        with _quiet_if_alone(run):
            dcp.save(_tensor_state(run, with_ema=True),
                     storage_writer=dcp.FileSystemWriter(tmp, sync_files=durable),
                     no_dist=not run.dist.enabled)
        if run.dist.is_main:
            with open(tmp / ckpt.SHARDED_STATE_FILE, "wb") as f:
                torch.save(state, f)
                f.flush()
                if durable:
                    os.fsync(f.fileno())
            write_atomically(tmp / ckpt.META_FILE, json.dumps(meta, indent=1, sort_keys=True),
                             durable)
    except (Exception, CheckpointException) as e:  # every rank must hear of it
        failure = e
    _agree_on_failure(run, failure, final, tmp)  # every rank's shards are in tmp
    if run.dist.is_main:
        try:
            ckpt.publish(tmp, final, run.config.keep_last_checkpoints, durable)
        except Exception as e:  # publish removed tmp
            failure = e
    # no rank goes on (and perhaps reads it) before it is in place
    _agree_on_failure(run, failure, final, None)
    return final if run.dist.is_main else None


def checkpoint_path(path: Path) -> Path:
    """The sharded checkpoint at ``path``, or the newest one under the root ``path``.

    Raises:
        CheckpointError: none there, or the newest is a single-file (DDP) checkpoint.
    """
    if not (path / ckpt.SHARDED_STATE_FILE).is_file():
        newest = ckpt.latest_checkpoint(path)
        if newest is None:
            raise CheckpointError(f"no checkpoint at {path} (expected "
                                  f"{ckpt.SHARDED_STATE_FILE} or checkpoint-NNNNNNNN/)")
        path = newest
    if not (path / ckpt.SHARDED_STATE_FILE).is_file():
        raise CheckpointError(f"{path} is not a sharded checkpoint: resume it with "
                              "parallelism=ddp")
    return path


def restore(run: Run, state: TrainState, path: Path) -> Restored:
    """Load a sharded checkpoint into a freshly built run (any number of ranks); collective.

    The rule of ``trainers.checkpoint`` holds: the checkpoint gives the state,
    the config every hyperparameter.

    Raises:
        CheckpointError: no sharded checkpoint at ``path``, or it does not fit
            this run (another model or optimizer).
    """
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    path = checkpoint_path(Path(path))
    try:
        saved = torch.load(path / ckpt.SHARDED_STATE_FILE, map_location="cpu",
                           weights_only=True)
        _check_compatible(run, saved)
        has_ema = saved["ema"] is not None
        tensors = _tensor_state(run, with_ema=has_ema)
        with _quiet_if_alone(run):
            dcp.load(tensors, storage_reader=dcp.FileSystemReader(path),
                     no_dist=not run.dist.enabled)
        set_state_dict(run.model, run.optimizer, model_state_dict=tensors["model"],
                       optim_state_dict=tensors["optimizer"])
        run.scheduler.load_state_dict(saved["scheduler"])
        if saved["scaler"]:
            run.scaler.load_state_dict(saved["scaler"])
        if run.ema is not None and has_ema:
            set_model_state_dict(run.ema.module, tensors["ema"])
            run.ema.n_updates = saved["ema"]["n_updates"]
        elif run.ema is not None:  # EMA switched on at resume: start from the loaded weights
            run.ema.restart_from(run.model)
        restored = restore_loop_state(run, state, saved)
    except (CheckpointError, ConfigError):
        raise
    except (KeyError, ValueError, RuntimeError, TypeError, OSError) as e:
        raise CheckpointError(misfit(f"checkpoint {path.name}", e)) from e
    old, new = saved["world_size"], run.dist.world_size
    if old != new:  # the same fraction of the epoch, in this world's per-rank samples
        state.position = min(state.position * old // new, run.samples_per_rank)
    return restored


def _check_compatible(run: Run, saved: dict[str, Any]) -> None:
    if saved.get("format") != CHECKPOINT_FORMAT:
        raise CheckpointError(f"unsupported checkpoint format {saved.get('format')!r}")
    check_same_run(run, saved)
