"""A trained model as one file: its weights and everything needed to rebuild and evaluate it.

A model file is one ``torch.save``'d dict of tensors and plain Python values
(readable with ``torch.load(..., weights_only=True)``)::

    format          "trainers.model"
    format_version  1 (FORMAT_VERSION; a reader refuses a newer one)
    task            the task's registered name, e.g. "digits"
    options         the task's options (dict)
    config          the run's TrainConfig (dict, ``trainers.fields.to_dict``), its
                    ``checkpoint_dir`` null: where the run kept its checkpoints is a path
                    of the machine that trained it, no part of the model (a file served
                    to a user names no server path)
    weights         the model's ``state_dict`` (tensors on CPU): the weights the run's
                    evaluations used, i.e. the EMA weights when the run kept an EMA and
                    evaluated it (``ema_decay`` set, ``eval_with_ema`` true, the
                    default), else the trained weights
    weights_kind    "ema" or "model": which of the two ``weights`` holds
    step            optimizer updates the weights had when saved
    metrics         the run's evaluation at that step (the last report), e.g.
                    {"val_accuracy": ..., "val_loss": ..., "step": ...}
    origin          free provenance from whoever made the file (``hpo`` puts the
                    study, the trial's number, params and values), or {}

:func:`model_from_checkpoint` builds it from a checkpoint directory of
``trainers.checkpoint`` (``state.pt``); :func:`evaluate_model` rebuilds the task
from the file's own ``task``, ``options`` and ``config`` (options overridable),
loads ``weights`` and runs the same evaluation the training loop runs
(``trainers.evaluation.evaluate``, same batch size and autocast), so that on the
run's own validation set it gives the run's recorded metrics again. It builds no model
larger than the file's ``weights``: the options are a few bytes of the file and could
otherwise ask for any size (a 3 KB file asked for 155 GB); the weights the file holds
were read into memory already.
"""

from __future__ import annotations

import os
import re
import uuid
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from trainers import checkpoint as ckpt
from trainers.checkpoint_read import load_checkpoint
from trainers.components import build_run
from trainers.config import TrainConfig
from trainers.errors import CheckpointError, TrainersError
from trainers.evaluation import evaluate
from trainers.fields import describe
from trainers.tasks import Task, create, get_task

FORMAT = "trainers.model"
FORMAT_VERSION = 1


def model_from_checkpoint(path: str | Path, origin: Mapping[str, Any] | None = None
                          ) -> dict[str, Any]:
    """The model file's content (see the module doc) from a checkpoint directory.

    Args:
        path: a checkpoint directory (``state.pt`` inside, or a sharded one of
            ``parallelism: fsdp``, ``trainers.dcp``: its full weights are gathered in
            this process), or a checkpoint root (its newest checkpoint is used).
        origin: provenance kept as the file's ``origin`` (JSON-compatible values).

    Raises:
        CheckpointError: nothing loadable at ``path``, or the checkpoint lacks the
            model's weights, task or config.
    """
    path = Path(path)
    if not any((path / name).is_file() for name in (ckpt.STATE_FILE, ckpt.SHARDED_STATE_FILE)):
        path = ckpt.latest_checkpoint(path) or path
    sharded = (path / ckpt.SHARDED_STATE_FILE).is_file()
    state = _load(path / ckpt.SHARDED_STATE_FILE) if sharded else load_checkpoint(path)
    try:
        config, ema = state["config"], state.get("ema")
        use_ema = ema is not None and config.get("eval_with_ema", True)
        if sharded:
            weights = _sharded_weights(path, state, "ema" if use_ema else "model")
        else:
            weights = ema["module"] if use_ema else state["model"]
        history = state.get("history") or []
        return {
            "format": FORMAT, "format_version": FORMAT_VERSION,
            "task": state["task"], "options": dict(state["options"]),
            "config": {**config, "checkpoint_dir": None},
            "weights": weights, "weights_kind": "ema" if use_ema else "model",
            "step": int(state["trainer"]["step"]),
            "metrics": dict(history[-1]) if history else {},
            "origin": dict(origin or {}),
        }
    except (KeyError, TypeError) as e:
        raise CheckpointError(f"checkpoint at {path} lacks {e} (not a trainers checkpoint?)"
                              ) from None


def _load(path: Path) -> dict[str, Any]:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same here
        raise CheckpointError(f"cannot read checkpoint {path.parent}: {type(e).__name__}: {e}"
                              ) from None


def _sharded_weights(path: Path, state: dict[str, Any], key: str) -> dict[str, Any]:
    """The full ``key`` ("model" or "ema") weights of a sharded checkpoint, gathered into a
    freshly built model of its task in this process (DCP reshards on load)."""
    import torch.distributed.checkpoint as dcp

    params = {**state["config"], **state["options"], "checkpoint_dir": None, "device": "cpu",
              "parallelism": "ddp"}
    task, config = create(state["task"], params)
    wanted = {key: task.build_model(config).state_dict()}
    try:
        with warnings.catch_warnings():  # "torch.distributed is disabled": one process, meant
            warnings.simplefilter("ignore", UserWarning)
            dcp.load(wanted, storage_reader=dcp.FileSystemReader(path), no_dist=True)
    except Exception as e:  # noqa: BLE001 - DCP raises its own CheckpointException and more
        raise CheckpointError(f"cannot read the {key} weights of checkpoint {path.name}: "
                              f"{type(e).__name__}: {e}") from None
    return wanted[key]


def save_model_file(model: Mapping[str, Any], path: str | Path) -> Path:
    """Write ``model`` to ``path`` atomically (a temporary file, then a rename)."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{uuid.uuid4().hex[:8]}.tmp")
    try:
        torch.save(dict(model), tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def load_model_file(path: str | Path) -> dict[str, Any]:
    """Read a model file (tensors and plain values only: ``weights_only=True``).

    Raises:
        CheckpointError: unreadable, not a model file, of a newer format version, or
            missing or malformed ``task``, ``options``, ``config`` or ``weights``.
    """
    try:
        model = torch.load(Path(path), map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise CheckpointError(f"no such model file: {path}") from None
    except Exception as e:  # noqa: BLE001 - any unpickling failure means the same here
        # torch's own text suggests weights_only=False, which would run the file's code
        raise CheckpointError(f"cannot read {path} as a model file (a torch file of tensors "
                              f"and plain values): {type(e).__name__}") from None
    if not isinstance(model, dict) or model.get("format") != FORMAT:
        raise CheckpointError(f"{path} is not a model file (no format {FORMAT!r})")
    version = model.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise CheckpointError(f"{path} has model file format version {version!r}; this "
                              f"trainers reads versions up to {FORMAT_VERSION}")
    _check_fields(path, model)
    return model


_FIELD_TYPES = {"task": str, "options": dict, "config": dict, "weights": dict}
"""What :func:`evaluate_model` reads of a model file, and the type each must have."""


def _check_fields(path: str | Path, model: Mapping[str, Any]) -> None:
    """Refuse a model file whose fields :func:`evaluate_model` reads are missing or malformed.

    Raises:
        CheckpointError: naming the first such field.
    """
    for name, kind in _FIELD_TYPES.items():
        if name not in model:
            raise CheckpointError(f"{path} is not a valid model file: it lacks {name!r}")
        if not isinstance(model[name], kind):
            raise CheckpointError(f"{path} is not a valid model file: {name!r} must be a "
                                  f"{kind.__name__}, got {type(model[name]).__name__}")
    for name in ("options", "config"):
        if not all(isinstance(key, str) for key in model[name]):
            raise CheckpointError(f"{path} is not a valid model file: the keys of {name!r} "
                                  "must be strings")
    bad = [k for k, v in model["weights"].items()
           if not (isinstance(k, str) and isinstance(v, torch.Tensor))]
    if bad:
        raise CheckpointError(f"{path} is not a valid model file: 'weights' must map names "
                              f"to tensors, got {bad[0]!r}")


def path_fields(task_name: str) -> set[str]:
    """The task's options and ``TrainConfig`` fields that name a file or directory (``path``)."""
    fields = [*describe(TrainConfig), *get_task(task_name).fields()]
    return {f.name for f in fields if f.path}


def ignored_paths(model: Mapping[str, Any]) -> dict[str, Any]:
    """The path values a model file holds that :func:`evaluate_model` does not use (those
    other than null), by field name."""
    stored = {**model["config"], **model["options"]}
    return {k: stored[k] for k in sorted(path_fields(model["task"]))
            if stored.get(k) is not None}


def evaluate_model(model: Mapping[str, Any], overrides: Mapping[str, Any] | None = None
                   ) -> dict[str, float]:
    """The task's evaluation metrics of a model file's weights on its validation set.

    Args:
        model: a model file's content (:func:`load_model_file`).
        overrides: task options or ``TrainConfig`` fields replacing the file's own
            (e.g. ``device``, ``eval_batch_size``). Path fields (``path=True``:
            ``charlm``'s ``corpus`` and ``cache_dir``) are never taken from the file,
            whoever made it: they take their defaults, or the value given here.

    Returns:
        The task's metrics (``task.eval_metrics``), e.g. ``val_accuracy`` and
        ``val_loss`` for ``digits``.

    Raises:
        ConfigError: an override is not an option of the task nor a config field, or
            has a bad value (the error names it).
        UnknownTaskError: the file's task is not installed here.
        CheckpointError: the weights do not fit the rebuilt model; among them, before
            any model is built, weights that hold fewer values than the model has
            parameters (:func:`check_weights_size`).
        TrainersError: out of memory while the model is built or evaluated (one line,
            the bytes asked for where the allocator said them).
    """
    # the file names no path of this machine: it could make the evaluation read any
    # file (a corpus) or write where it says (a cache); the defaults apply, or overrides
    paths = path_fields(model["task"])
    stored = {k: v for k, v in {**model["config"], **model["options"]}.items()
              if k not in paths}
    params = {**stored, **dict(overrides or {})}
    params["checkpoint_dir"] = None  # evaluation writes nothing
    if "parallelism" in params:  # one process holds the whole model (FSDP's were gathered)
        params["parallelism"] = "ddp"
    task, config = create(model["task"], params)
    try:
        check_weights_size(task, config, model["weights"])
        run = build_run(task, config)
        try:
            run.model.load_state_dict(model["weights"])
        except (RuntimeError, KeyError, TypeError, ValueError) as e:
            raise CheckpointError(f"the model file's weights do not fit task {task.name!r} "
                                  f"with these options: {e}") from None
        return evaluate(run.task, run.model, run.val_set, run.dist, run.autocast,
                        config.eval_batch_size or config.micro_batch_size)
    except (MemoryError, RuntimeError) as e:  # torch's CPU allocator raises RuntimeError
        message = _out_of_memory(e)
        if message is None:
            raise
        raise TrainersError(message) from None


def check_weights_size(task: Task, config: TrainConfig, weights: Mapping[str, Any]) -> None:
    """Refuse a model larger than ``weights`` before it is built.

    The rule: the model's parameters (``task.parameter_count``, nothing allocated; counted
    once the task has read its data, so that ``charlm`` counts its corpus's vocabulary)
    must not outnumber the values ``weights`` holds (:func:`stored_values`). A file made
    from a trained model always passes, whatever the model's size (its ``state_dict``
    holds every parameter, and buffers besides); a file with fewer values cannot be loaded
    into the model anyway, so it is refused before the model is allocated. No fixed limit:
    the memory a model takes is bounded by the file's own weights, already in memory.

    Raises:
        CheckpointError: naming ``weights``, with both counts.
    """
    task.datasets(config.seed)
    n_parameters = task.parameter_count(config)
    n_held = stored_values(weights)
    if n_parameters > n_held:
        values = "value" if n_held == 1 else "values"
        raise CheckpointError(f"the model file's weights do not fit task {task.name!r} with "
                              f"these options: 'weights' holds {n_held:,} {values}, the "
                              f"model has {n_parameters:,} parameters")


def stored_values(weights: Mapping[str, Any]) -> int:
    """The values (tensor elements) ``weights`` holds in memory: each storage counted once
    (tied weights share one), in the elements of the tensor's dtype; a view counts no
    more than its storage (an expanded tensor of stride 0 holds one value however large
    its shape), a tensor without memory here (``meta``, sparse) none."""
    held: dict[int, int] = {}
    for tensor in weights.values():
        if not isinstance(tensor, torch.Tensor) or tensor.is_meta or (
                tensor.layout != torch.strided):
            continue
        storage = tensor.untyped_storage()
        n = storage.nbytes() // tensor.element_size()
        held[storage.data_ptr()] = max(n, held.get(storage.data_ptr(), 0))
    return sum(held.values())


_ALLOCATION = re.compile(r"tried to allocate (\d+) bytes|Tried to allocate ([\d.]+ [KMGT]?i?B)")


def _out_of_memory(e: BaseException) -> str | None:
    """The one-line message of ``e`` when it is an allocation failure (``MemoryError``,
    ``torch.OutOfMemoryError``, or the ``RuntimeError`` of torch's CPU allocator), else
    None."""
    text = str(e)
    if not (isinstance(e, MemoryError | torch.OutOfMemoryError)
            or (isinstance(e, RuntimeError) and "DefaultCPUAllocator" in text)):
        return None
    found = _ALLOCATION.search(text)
    if found is None:
        return "out of memory"
    amount = f"{int(found[1]):,} bytes" if found[1] else found[2]
    return f"out of memory: tried to allocate {amount}"
