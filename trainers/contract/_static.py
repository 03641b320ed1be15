"""The rules that need no training run, and the cheap subset checked at study creation."""

from __future__ import annotations

import math
import pickle
import re
from contextlib import nullcontext
from typing import Any

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.contract._base import (
    WHY_SUM,
    RuleResult,
    _batch,
    _config,
    _exc,
    _fail,
    _meta_model,
    _pass,
)
from trainers.distributed import dist_info
from trainers.errors import USER_CODE_ERRORS, ConfigError
from trainers.evaluation import evaluate
from trainers.fields import FieldInfo, build
from trainers.loop import LOOP_METRICS
from trainers.reporting import RESERVED_RESULT_KEYS
from trainers.tasks import shadowed_options
from trainers.tasks.base import Task


def _check_pickle(task_cls: type[Task]) -> RuleResult:
    task = task_cls()
    for what, obj in (("the task", task), ("its options", task.options)):
        try:
            copy = pickle.loads(pickle.dumps(obj))
        except USER_CODE_ERRORS as e:
            return _fail("pickle", f"{what} cannot be pickled ({_exc(e)}). Fix: keep only "
                         "plain values in __init__ and Options (no locks, open files, "
                         "generators, lambdas); create such things in datasets/build_model")
        if type(copy) is not type(obj):
            return _fail("pickle", f"{what} unpickles as {type(copy).__name__}")
    if pickle.loads(pickle.dumps(task.options)) != task.options:
        return _fail("pickle", "the options differ after pickling: make Options a dataclass")
    return _pass("pickle")


def _check_build(task: Task) -> RuleResult:
    train_set, val_set = task.datasets(0)
    for which, dataset in (("training", train_set), ("validation", val_set)):
        if len(dataset) == 0:
            return _fail("build", f"the {which} dataset of the default options is empty")
    if len(train_set) < 2:
        return _fail("build", "the training dataset needs at least 2 items for the checks")
    config = _config(task, max_updates=1)
    model = task.build_model(config)
    if not isinstance(model, nn.Module) or not list(model.parameters()):
        return _fail("build", "build_model must return an nn.Module with parameters")
    try:  # what a service bounds the model's size by (and study creation counts with)
        counted = task.parameter_count(config)
    except USER_CODE_ERRORS as e:  # the task's own code
        return _fail("build", f"parameter_count raised {_exc(e)}")
    built = sum(p.numel() for p in model.parameters())
    if counted != built:
        return _fail("build", f"parameter_count says {counted}, build_model's model has "
                     f"{built} parameters")
    return _pass("build")


_NUM = r"(-?\d+(?:\.\d+)?(?:e-?\d+)?)"
_DOTS = re.compile(rf"{_NUM}\s*\.\.\s*{_NUM}")
_INTERVAL = re.compile(rf"([\[(])\s*{_NUM}\s*,\s*{_NUM}\s*([\])])")
_GE = re.compile(rf">=\s*{_NUM}")
_LE = re.compile(rf"<=\s*{_NUM}")


def documented_bounds(info: FieldInfo) -> list[Any]:
    """The closed bounds an option's help text documents (``(1..512)`` gives ``[1, 512]``)."""
    if info.kind not in ("int", "float"):
        return []
    values: list[str] = []
    if m := _DOTS.search(info.help):
        values += [m.group(1), m.group(2)]
    elif m := _INTERVAL.search(info.help):
        values += [m.group(2)] if m.group(1) == "[" else []
        values += [m.group(3)] if m.group(4) == "]" else []
    else:
        values += [m.group(1) for m in (_GE.search(info.help), _LE.search(info.help)) if m]
    cast = int if info.kind == "int" else float
    return [cast(float(v)) for v in values]


def _check_bounds(task_cls: type[Task]) -> RuleResult:
    shadowed = shadowed_options(task_cls)
    if shadowed:  # trainers.create refuses it: one value would set both
        return _fail("bounds", f"option {shadowed[0]} is named like the TrainConfig field: "
                     f"one value would set both. Fix: rename the option")
    tried = 0
    for info in task_cls.fields():
        for value in documented_bounds(info):
            try:
                task = task_cls(build(task_cls.Options, {info.name: value}))
            except ConfigError as e:
                return _fail("bounds", f"option {info.name} documents {value!r} as valid "
                             f"({info.help!r}) but Options refuses it: {e}. Fix the help text "
                             "or the check in __post_init__")
            try:
                task.datasets(0)
                _meta_model(task)
            except USER_CODE_ERRORS as e:
                return _fail("bounds", f"with {info.name}={value!r} (a documented bound): "
                             f"{_exc(e)}")
            tried += 1
    return _pass("bounds", f"{tried} bound(s)" if tried else "no option documents a bound")


def _check_metrics(task: Task, evaluated: dict[str, float]) -> RuleResult:
    """The metrics rule; the metrics it found are put in ``evaluated``."""
    config = _config(task, max_updates=1)
    _, val_set = task.datasets(config.seed)
    torch.manual_seed(0)
    model = task.build_model(config)
    metrics = evaluate(task, model, val_set, dist_info("cpu"), nullcontext, 8)
    evaluated.update(metrics)
    declared, returned = set(task.metrics), set(metrics)
    clash = reserved_names(declared)
    if clash:
        return _fail("metrics", clash)
    if declared != returned:
        return _fail("metrics", f"the task declares {sorted(declared)} but eval_metrics "
                     f"returns {sorted(returned)}. Fix: return exactly the keys of metrics")
    bad = sorted(k for k, v in metrics.items() if not math.isfinite(float(v)))
    if bad:
        return _fail("metrics", f"not finite on the untrained model: {bad}")
    if task.objective not in declared:
        return _fail("metrics", f"objective {task.objective!r} is not one of {sorted(declared)}")
    directions = {d for d in task.metrics.values()} - {"minimize", "maximize"}
    if directions:
        return _fail("metrics", f"directions must be minimize or maximize, got {directions}")
    return _pass("metrics", ", ".join(sorted(declared)))


# -- loss-sum, mutable options ----------------------------------------------------------------


LOSS_SUM_RTOL, LOSS_SUM_ATOL = 1e-5, 1e-6  # fp32 sums in another order: a few ulps


@torch.no_grad()
def _check_loss_sum(task: Task) -> RuleResult:
    config = _config(task, max_updates=1)
    train_set, _ = task.datasets(config.seed)
    m = max(1, min(4, len(train_set) // 2))
    torch.manual_seed(0)
    model = task.build_model(config).eval()
    whole = task.loss_sum(model, _batch(task, train_set, 0, 2 * m))
    if not (isinstance(whole, torch.Tensor) and whole.dim() == 0):
        return _fail("loss-sum", "must return a 0-dim tensor (the sum over the batch's items)")
    # comparing a batch with its halves needs the loss to be a function of the batch
    again = float(task.loss_sum(model, _batch(task, train_set, 0, 2 * m)))
    whole_f = float(whole)
    if not math.isclose(whole_f, again, rel_tol=LOSS_SUM_RTOL, abs_tol=LOSS_SUM_ATOL):
        return _fail("loss-sum", f"loss_sum is not deterministic: the same batch of {2 * m} "
                     f"items gave {whole_f:.6g}, then {again:.6g}, with the model in eval "
                     "mode (no dropout) and no gradients. Fix: compute the loss from the model "
                     "and the batch only: draw no random numbers in loss_sum (or only while "
                     "model.training), and keep no state between calls")
    halves = [float(task.loss_sum(model, _batch(task, train_set, i * m, m))) for i in (0, 1)]
    total = sum(halves)
    if math.isclose(whole_f, total, rel_tol=LOSS_SUM_RTOL, abs_tol=LOSS_SUM_ATOL):
        return _pass("loss-sum")
    if math.isclose(whole_f, total / 2, rel_tol=LOSS_SUM_RTOL, abs_tol=LOSS_SUM_ATOL):
        return _fail("loss-sum", f"loss_sum returns a mean (batch of {2 * m}: {whole_f:.6g}; "
                     f"its halves: {halves[0]:.6g} + {halves[1]:.6g}). Why a sum: {WHY_SUM}")
    return _fail("loss-sum", f"the loss of a batch of {2 * m} ({whole_f:.6g}) is not the sum "
                 f"of its halves' ({total:.6g}) with the model in eval mode: items must not "
                 f"interact in the loss. {WHY_SUM}")


def _candidates(info: FieldInfo) -> list[Any]:
    d = info.default
    if info.kind == "bool":
        return [not d]
    if info.kind == "choice":
        return [c for c in info.choices if c != d]
    if info.kind == "int":
        return [*documented_bounds(info), d + 1, d - 1]
    if info.kind == "float":
        return [*documented_bounds(info), d / 2, d + 0.1, d * 2]
    return []


def _shapes(model: nn.Module) -> dict[str, tuple[int, ...]]:
    return {k: tuple(v.shape) for k, v in model.state_dict().items()}


def _check_mutable(task_cls: type[Task]) -> RuleResult:
    if not task_cls.mutable_options:  # nothing to compare: no model built
        return _pass("mutable-options", "none")
    fields = {info.name: info for info in task_cls.fields()}
    base = _shapes(_meta_model(task_cls()))
    for name in sorted(task_cls.mutable_options):
        if name not in fields:
            return _fail("mutable-options", f"{name!r} is not an option of the task")
        for value in _candidates(fields[name]):
            if value == fields[name].default:
                continue
            try:
                task = task_cls(build(task_cls.Options, {name: value}))
            except ConfigError:
                continue
            changed = _shapes(_meta_model(task))
            if changed != base:
                diff = sorted(k for k in base.keys() | changed.keys()
                              if base.get(k) != changed.get(k))
                return _fail("mutable-options", f"{name}={value!r} changes the shapes of "
                             f"{diff[:5]}: PBT resumes a checkpoint with a mutated value, "
                             f"which must load. Fix: remove {name!r} from mutable_options")
            break
    return _pass("mutable-options", ", ".join(sorted(task_cls.mutable_options)) or "none")

# -- at study creation ----------------------------------------------------------------------

CREATION_CHECK_MAX_PARAMS = 10_000_000  # larger models are not built on the CPU to check


def creation_violations(task: Task, config: TrainConfig) -> list[RuleResult]:
    """The cheap subset of the contract, for a service about to create a study.

    Builds the datasets and counts the model (``Task.parameter_count``: on the ``meta``
    device, no memory, unless the task counts otherwise),
    then, for a model of at most :data:`CREATION_CHECK_MAX_PARAMS` parameters,
    evaluates it on the CPU on two validation items and compares the metric
    names with the declared ones. Values are not judged (two items may give NaN).

    Returns:
        The FAIL results of the rules ``build`` and ``metrics``; empty if none.
    """
    try:
        _, val_set = task.datasets(config.seed)
        size = task.parameter_count(config.replace(device="cpu"))  # the meta device's count
    except USER_CODE_ERRORS as e:  # the task's own code
        return [_fail("build", f"raised {_exc(e)}")]
    if len(val_set) == 0:
        return [_fail("build", "the validation dataset is empty")]
    clash = reserved_names(set(task.metrics))  # needs no model: before the size cut-off
    if clash:
        return [_fail("metrics", clash)]
    if size > CREATION_CHECK_MAX_PARAMS:
        return []
    try:
        torch.manual_seed(config.seed)
        model = task.build_model(config.replace(device="cpu")).eval()
        with torch.no_grad():
            batch = _batch(task, val_set, 0, min(2, len(val_set)))
            sums = {k: float(v) for k, v in task.eval_sums(model, batch).items()}
        returned = set(task.eval_metrics(sums))
    except USER_CODE_ERRORS as e:
        return [_fail("metrics", f"evaluating raised {_exc(e)}")]
    if returned != set(task.metrics):
        return [_fail("metrics", f"the task declares {sorted(task.metrics)} but eval_metrics "
                      f"returns {sorted(returned)}")]
    return []


def reserved_names(declared: set[str]) -> str:
    """Why some of the task's metric names cannot be, or empty: each report holds the
    loop's own keys and the reporter's (:data:`trainers.reporting.RESERVED_RESULT_KEYS`)."""
    clash = sorted(declared & (LOOP_METRICS | RESERVED_RESULT_KEYS))
    if not clash:
        return ""
    return (f"metric names {clash} are keys every report holds already (the loop's: "
            f"{', '.join(sorted(LOOP_METRICS))}; the reporter's: done, training_iteration, "
            f"node_id, ...). Fix: name them otherwise, e.g. val_{clash[0]}")
