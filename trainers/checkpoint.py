"""Atomic checkpoints on disk, with retention of the last N and the best.

Layout of a checkpoint root::

    root/checkpoint-00000120/state.pt   everything needed to resume (torch.save)
    root/checkpoint-00000120/meta.json  step, epoch, metrics: readable without torch
    root/best.json                      {"step": 120, "metric": ..., "value": ...}
    root/retired-checkpoint-00000140-*  another trajectory's, moved aside (``publish``)

A sharded checkpoint (``parallelism: fsdp``, ``trainers.dcp``) has the same
name, ``meta.json`` and atomic rename, with ``train_state.pt`` (counters,
schedule, scaler, RNG states) and the DCP files of the weights and optimizer
state instead of ``state.pt``; retention and ``best.json`` treat both alike.

A checkpoint directory is written under a temporary name, fsync'ed, then
renamed into place, so a process killed while writing leaves the previous
checkpoints untouched and loadable; leftovers of dead writers are removed by the
next save. Replacing a checkpoint of the same step takes two renames (the old one
away, the new one in); a writer killed between them leaves both under temporary
names, and the next listing (any resume) puts the complete new one in place.
``state.pt`` holds only tensors and plain Python values and is read
with ``weights_only=True``.

What a resume takes from where (``trainers.resume.restore``). The rule: the
checkpoint gives the run's *state*, the config gives every *hyperparameter*;
what follows from both (the current LR) is derived, never read back.

=======================  ==================================  ==========================
component                from the checkpoint (state)         from the config
=======================  ==================================  ==========================
model                    weights and buffers                 --
optimizer                moments, momentum buffers, counts   ``lr``, ``weight_decay``,
                                                             betas / momentum (also
                                                             ``initial_lr``)
LR schedule              position (updates applied)          kind, warmup, total updates
                                                             (from ``max_updates`` /
                                                             ``max_epochs``), ``min_lr_ratio``;
                                                             the LR is ``lr * factor(position)``
fp16 loss scaler         current scale, growth tracker       ``init_loss_scale`` only where
                                                             the checkpoint has no scale
EMA                      shadow weights, updates folded in   ``ema_decay``
early stopping           best value and step, evaluations    patience, ``min_delta``;
                         without improvement                 another watched metric starts
                                                             the count afresh
loop                     updates, epoch, data position,      ``max_updates``,
                         RNG states, metrics history         ``max_epochs``, intervals,
                                                             ``max_grad_norm``, precision
=======================  ==================================  ==========================

A stop condition already met at the checkpoint (patience exhausted,
``max_updates`` or ``max_epochs`` reached, under the config's values) ends the
resumed run before any update. A reporter's stop is not kept: it is the
outside's decision (a scheduler pausing a trial resumes it on purpose).

What a resume cannot change (``trainers.resume.check_same_run``, a ``ConfigError``
naming it): the ``seed`` and the task's options but for its ``mutable_options`` and its
path options; another optimizer is a ``CheckpointError``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from trainers.data import read_json, write_atomically
from trainers.errors import CheckpointWriteError
from trainers.process import process_alive

_log = logging.getLogger(__name__)

_NAME = re.compile(r"^checkpoint-(\d{8})$")
_TMP = re.compile(r"^\.(tmp|trash)-.*-(?P<pid>\d+)-[0-9a-f]{8}$")
_LEFTOVER = re.compile(r"^\.(tmp|trash)-(?P<name>checkpoint-\d{8})-(?P<pid>\d+)-[0-9a-f]{8}$")
_TMP_FILE = re.compile(r"^\..+\.(?P<pid>\d+)\.tmp$")  # trainers.data.write_atomically
STATE_FILE = "state.pt"
SHARDED_STATE_FILE = "train_state.pt"  # trainers.dcp
META_FILE = "meta.json"
BEST_FILE = "best.json"


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _is_complete(path: Path) -> bool:
    return (path / META_FILE).is_file() and (
        (path / STATE_FILE).is_file() or (path / SHARDED_STATE_FILE).is_file())


def list_checkpoints(root: Path) -> list[tuple[int, Path]]:
    """Complete checkpoints under ``root`` as ``(step, path)``, oldest first.

    A replacement that a dead writer left half done is finished first (:func:`_recover`).
    """
    if not root.is_dir():
        return []
    _recover(root)
    found = []
    for child in root.iterdir():
        m = _NAME.match(child.name)
        if m and _is_complete(child):
            found.append((int(m.group(1)), child))
    return sorted(found)


def _recover(root: Path) -> None:
    """Put back the checkpoint a writer killed between :func:`publish`'s two renames
    left under temporary names: its complete new version (``.tmp-``, written and
    fsync'ed before the renames) or else the replaced one (``.trash-``). Only for
    writers that are dead, and steps with no checkpoint in place.

    A ``.tmp-`` is put in place only beside its ``.trash-`` twin, the mark of a replace
    cut between its renames: one alone was never published (its writer died before the
    rename, or its save failed), and stays a leftover for :func:`_prune` to remove, as
    before. Putting it back would revive a step that a resumed run had just retired."""
    try:
        children = sorted(root.iterdir(), key=lambda p: not p.name.startswith(".tmp-"))
    except OSError:
        return
    for child in children:  # the new versions first
        m = _LEFTOVER.match(child.name)
        if m is None or _alive(int(m.group("pid"))):
            continue
        final = root / m.group("name")
        if child.name.startswith(".tmp-") and not _trash_of(child).exists():
            continue
        if not final.exists() and _is_complete(child):
            with contextlib.suppress(OSError):  # a concurrent reader recovered it first
                os.rename(child, final)


def _alive(pid: int) -> bool:
    return pid == os.getpid() or process_alive(pid)


def _trash_of(tmp: Path) -> Path:
    """Where :func:`publish` moves the checkpoint that ``tmp`` (``.tmp-...``) replaces."""
    return tmp.parent / f".trash-{tmp.name[len('.tmp-'):]}"


def latest_checkpoint(root: Path) -> Path | None:
    """The newest complete checkpoint under ``root``, or ``None``."""
    found = list_checkpoints(Path(root))
    return found[-1][1] if found else None


def best_checkpoint(root: Path) -> Path | None:
    """The checkpoint marked best under ``root``, or ``None`` (also when ``best.json`` is bad)."""
    best = Path(root) / BEST_FILE
    try:
        step = int(read_json(best)["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return None
    path = Path(root) / f"checkpoint-{step:08d}"
    return path if _is_complete(path) else None


def save_checkpoint(root: Path, step: int, state: dict[str, Any], meta: dict[str, Any],
                    keep_last: int, durable: bool = True) -> Path:
    """Write ``state`` as the checkpoint of ``step`` atomically, then apply retention.

    A checkpoint already present for the same step is replaced.

    Args:
        root: the checkpoint root (created if missing).
        step: optimizer updates so far, names the directory.
        state: tensors and plain Python values (``torch.save``).
        meta: JSON-compatible summary written beside it.
        keep_last: number of newest checkpoints kept, besides the best (>= 1).
        durable: fsync files and directories, so the checkpoint survives an OS
            crash; without it a killed process still never leaves a torn one
            (temporary directory + rename).

    Returns:
        The checkpoint directory.

    Raises:
        CheckpointWriteError: the file system refused (disk full, permissions, ...);
            the temporary directory is removed, the earlier checkpoints are untouched.
    """
    tmp, final = new_temp_dir(Path(root), step)
    with writing(final, tmp):
        with open(tmp / STATE_FILE, "wb") as f:
            torch.save(state, f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        write_atomically(tmp / META_FILE, json.dumps(meta, indent=1, sort_keys=True), durable)
    publish(tmp, final, keep_last, durable)
    return final


@contextlib.contextmanager
def writing(final: Path, tmp: Path | None = None) -> Iterator[None]:
    """Turn an ``OSError`` raised while writing the checkpoint ``final`` into
    :class:`CheckpointWriteError` naming it, after removing ``tmp`` (its temporary
    directory, if any: on a full disk, what it holds is best given back at once)."""
    try:
        yield
    except (OSError, RuntimeError) as e:
        error = write_error(final, e)
        if error is None:  # a RuntimeError of anything but the file system
            raise
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)
        raise error from e


def write_error(final: Path, e: BaseException) -> CheckpointWriteError | None:
    """The :class:`CheckpointWriteError` of checkpoint ``final`` if ``e`` is (or was raised
    while handling) an ``OSError``, naming it; else ``None``."""
    cause = _os_error(e)
    if cause is None:
        return None
    return CheckpointWriteError(f"cannot write checkpoint {final}: {type(cause).__name__}: "
                                f"{cause}")


def _os_error(e: BaseException) -> OSError | None:
    """``e`` if an ``OSError``, else the ``OSError`` in its cause or context chain, if any:
    ``torch.save`` failing mid-write (a full disk) raises its zip writer's
    ``RuntimeError: [enforce fail at inline_container.cc] unexpected pos`` from the
    ``OSError``."""
    seen: set[int] = set()
    while e is not None and id(e) not in seen:
        if isinstance(e, OSError):
            return e
        seen.add(id(e))
        e = e.__cause__ or e.__context__
    return None


def new_temp_dir(root: Path, step: int) -> tuple[Path, Path]:
    """A new temporary directory for the checkpoint of ``step`` (created, with ``root``),
    and the checkpoint's final path; the name carries this process's id, so that a
    later save removes it if this process dies before :func:`publish`."""
    final = root / f"checkpoint-{step:08d}"
    tmp = root / f".tmp-{final.name}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with writing(final):
        root.mkdir(parents=True, exist_ok=True)
        tmp.mkdir()
    return tmp, final


def publish(tmp: Path, final: Path, keep_last: int, durable: bool) -> None:
    """Rename the complete checkpoint ``tmp`` to ``final``, then retire the checkpoints of
    later steps (:func:`_retire_later`) and apply retention under their root. A
    checkpoint already at ``final`` is replaced when it is of the same task, config and
    options (this run's own), else retired.

    Raises:
        CheckpointWriteError: the file system refused; ``tmp`` is removed.
    """
    root = final.parent
    trash = None
    with writing(final, tmp):
        if durable:
            _fsync_dir(tmp)
        if final.exists() and not _same_trajectory(final, tmp):
            os.rename(final, _retired_name(final))  # another run's: kept, see _retire_later
        elif final.exists():
            trash = _trash_of(tmp)
            os.rename(final, trash)
        try:  # killed right here: the next reader puts tmp in place (_recover)
            os.rename(tmp, final)
        except OSError:
            if trash is not None:  # put the replaced one back
                os.rename(trash, final)
            raise
        if durable:
            _fsync_dir(root)
    if trash is not None:
        shutil.rmtree(trash, ignore_errors=True)
    _retire_later(root, int(_NAME.match(final.name).group(1)))
    _prune(root, keep_last)


_RUN_KEYS = ("task", "config", "options")  # what meta.json says of the run (not its position)
# config fields that say where and how a run keeps or loads things, not which run it is: a
# resume may give them anew (another spelling of the checkpoint directory, more workers)
_PLACE_KEYS = ("checkpoint_dir", "checkpoint_fsync", "keep_last_checkpoints",
               "checkpoint_interval", "num_workers", "eval_batch_size", "device")


def _same_trajectory(old: Path, new: Path) -> bool:
    """Whether the checkpoint ``old`` of the same step as ``new`` is of the same run: their
    ``meta.json`` agree on task, config and options (config but for ``_PLACE_KEYS``). A run
    writes a step twice when an evaluation follows a checkpoint of the interval (the
    metrics differ, and at an epoch's end the epoch and position too: the interval's is
    kept so that an evaluation that fails, an out-of-memory at ``eval_batch_size``, is
    resumed without training again), and again when resumed from it with nothing left
    to train and asked for its last report's checkpoint; another config
    resumed into the root (or anything unreadable) is another trajectory."""
    try:
        metas = [read_json(path / META_FILE) for path in (old, new)]
        for meta in metas:
            meta["config"] = {k: v for k, v in meta["config"].items() if k not in _PLACE_KEYS}
        return all(metas[0][key] == metas[1][key] for key in _RUN_KEYS)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _retired_name(path: Path) -> Path:
    return path.parent / f"retired-{path.name}-{uuid.uuid4().hex[:8]}"


def _retire_later(root: Path, step: int) -> None:
    """Move the checkpoints of steps after ``step`` out of the way: a run only goes
    forward, so they are another trajectory's (a run resumed from an older checkpoint
    into the same root). Left where they are, retention would prune the resumed run's
    own and a resume of the root would continue the abandoned trajectory; renamed
    ``retired-checkpoint-NNNNNNNN-XXXXXXXX`` they are kept, but never resumed nor pruned.
    """
    for later, path in list_checkpoints(root):
        if later > step:
            with contextlib.suppress(OSError):  # a concurrent writer retired it first
                os.rename(path, _retired_name(path))


def mark_best(root: Path, step: int, metric: str, value: float, durable: bool = True,
              keep_last: int | None = None) -> None:
    """Record (atomically) that the checkpoint of ``step`` is the best so far, then, with
    ``keep_last``, apply retention again: the previous best, kept by the save of
    ``step`` while it was still marked, is pruned unless among the ``keep_last`` newest.

    Raises:
        CheckpointWriteError: the file system refused.
    """
    payload = {"step": step, "metric": metric, "value": value}
    with writing(Path(root) / BEST_FILE):
        write_atomically(Path(root) / BEST_FILE, json.dumps(payload), durable)
    if keep_last is not None:
        _prune(Path(root), keep_last)


def remark_best(root: Path, step: int, metric: str, value: float, *, resumed_at: int,
                run: dict[str, Any], durable: bool = True,
                keep_last: int | None = None) -> bool:
    """Mark the checkpoint of ``step`` best again unless ``best.json`` already names it; for
    a run resumed at step ``resumed_at`` whose restored state says ``step`` is its best. A
    process killed between a new best's checkpoint and its ``best.json`` (two writes,
    :func:`mark_best` after :func:`save_checkpoint`) left ``best.json`` naming an older
    checkpoint, or none, and retention, which spares only the one it names, then pruned
    the real best. With ``keep_last``, retention follows, as after :func:`mark_best` (the
    older best goes), unless the root holds checkpoints after ``resumed_at``: another
    trajectory's, retired (not pruned) by the run's first write (:func:`publish`).

    Only the run's own checkpoint is marked: its ``meta.json`` must hold ``value`` as
    ``metric`` (the evaluation that made it the best) and the task and options of ``run``
    (the resumed run's meta). A run resumed into another run's directory finds that run's
    checkpoint of the same step there, which is not its best.

    Returns:
        Whether ``best.json`` was written (``False``: it named ``step`` already, or the
        checkpoint of ``step`` is gone or another run's).

    Raises:
        CheckpointWriteError: the file system refused.
    """
    path = Path(root) / f"checkpoint-{step:08d}"
    if best_checkpoint(root) == path or not _is_complete(path):
        return False
    try:
        meta = read_json(path / META_FILE)
        own = (meta["metrics"].get(metric) == value and meta["task"] == run["task"]
               and meta["options"] == json.loads(json.dumps(run["options"])))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        own = False
    if not own:
        return False
    mark_best(root, step, metric, value, durable)
    if keep_last is not None and all(s <= resumed_at for s, _ in list_checkpoints(root)):
        _prune(Path(root), keep_last)
    return True


def _prune(root: Path, keep_last: int) -> None:
    found = list_checkpoints(root)  # first: it may put back the best one
    best = best_checkpoint(root)
    for _, path in found[:-keep_last]:
        if path != best:
            shutil.rmtree(path, ignore_errors=True)
    for child in root.iterdir():  # leftovers of writers that died
        m = _TMP.match(child.name) or _TMP_FILE.match(child.name)
        if m and not _alive(int(m.group("pid"))):
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
