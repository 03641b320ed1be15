"""What every rule shares: its result, the fix texts, configs and small builders."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import re
import threading
from collections.abc import Iterator
from typing import Any, Literal

import torch
from torch import nn

from trainers.config import TrainConfig
from trainers.tasks.base import Task

RULES = ("import", "pickle", "build", "bounds", "metrics", "loss-sum", "mutable-options",
         "determinism", "resume", "accumulation")
ACCUMULATION_TOLERANCE = 1e-6  # on the gradient, relative to max(1, its largest entry)
Status = Literal["PASS", "FAIL", "SKIP"]

WHY_SUM = (
    "the loop divides each micro-batch's loss_sum by the number of items (samples, or real "
    "tokens) of the whole accumulation group, so that K micro-batches give exactly the "
    "gradient of one batch K times larger; a mean is divided twice and weights each "
    "micro-batch by 1/its size instead of by its share of the items. Return a sum: "
    'F.cross_entropy(logits, y, reduction="sum"); for token losses, per-token losses '
    '(reduction="none") times the mask of real tokens, summed, with n_items counting '
    "the real tokens")


@dataclasses.dataclass(frozen=True)
class RuleResult:
    """The outcome of one rule.

    Attributes:
        rule: one of :data:`RULES`.
        status: ``PASS``, ``FAIL`` or ``SKIP`` (a rule it needs failed).
        method: the ``Task`` member concerned (``Task.loss_sum``), empty on PASS.
        detail: what was found and how to fix it; empty on PASS.
    """

    rule: str
    status: Status
    method: str = ""
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "PASS"

    def line(self) -> str:
        """One line: ``PASS loss-sum`` or ``FAIL loss-sum [Task.loss_sum]: ...``."""
        head = f"{self.status} {self.rule}"
        if self.status == "PASS":
            return head + (f" ({self.detail})" if self.detail else "")
        where = f" [{self.method}]" if self.method else ""
        return f"{head}{where}: {self.detail}"


_METHODS = {"pickle": "Task.__init__ / Options", "build": "Task.datasets / Task.build_model",
            "bounds": "Options", "metrics": "Task.eval_sums / Task.eval_metrics",
            "loss-sum": "Task.loss_sum", "mutable-options": "Task.mutable_options",
            "determinism": "Task.datasets / Task.build_model / Task.loss_sum",
            "resume": "Task.build_model", "accumulation": "Task.loss_sum / Task.n_items"}


# torch's errors of code that needs a tensor's data on the meta device ("cannot be called on
# meta tensors", "Cannot copy out of meta tensor", "... for the 'meta' device"); not
# "metadata" or "metaclass" (helper-43)
_META_ERROR = re.compile(r"\bmeta tensors?\b|'meta'|\bmeta device\b", re.IGNORECASE)


def _exc(e: BaseException) -> str:
    """``Type: message``; for an error of a model built on the ``meta`` device, with why
    it was built there and what to do (helper-41: a build_model calling ``.item()`` was
    refused as breaking the documented bounds, with no word of the meta device)."""
    try:
        message = str(e)
    except Exception:  # noqa: BLE001 - a task's exception whose __str__ fails (helper-41)
        message = f"<{type(e).__name__} whose message cannot be shown>"
    text = f"{type(e).__name__}: {message}"
    if _META_ERROR.search(message):
        text += (" (the checks build the model on PyTorch's meta device, without memory, "
                 "to check and count it: code in build_model that reads a tensor's value, "
                 "such as .item(), fails there. Fix: compute such values in Python, or "
                 "override Task.parameter_count)")
    return text


def _pass(rule: str, detail: str = "") -> RuleResult:
    return RuleResult(rule, "PASS", detail=detail)


def _fail(rule: str, detail: str) -> RuleResult:
    return RuleResult(rule, "FAIL", _METHODS[rule], detail)


def _config(task: Task | type[Task], **changes: Any) -> TrainConfig:
    """The task's default config on the CPU in fp32, without EMA, early stopping or
    checkpoints, with ``changes`` on top."""
    values = {**task.default_config, "device": "cpu", "precision": "fp32", "compile": False,
              "activation_checkpointing": False, "num_workers": 0, "max_epochs": None,
              "ema_decay": None, "early_stopping_patience": None,
              "early_stopping_metric": None, "checkpoint_dir": None, "seed": 0}
    values["micro_batch_size"] = min(values.get("micro_batch_size", 32), 16)
    return TrainConfig(**{**values, **changes})


def _batch(task: Task, dataset, start: int, n: int) -> Any:
    return task.collate([dataset[i] for i in range(start, start + n)])


def _meta_model(task: Task) -> nn.Module:
    with torch.device("meta"):
        return task.build_model(_config(task, max_updates=1))


_log = logging.getLogger("trainers.contract")


_TASK_CODE = threading.RLock()


@contextlib.contextmanager
def process_state_kept(what: str) -> Iterator[None]:
    """Run a task's own code (``what`` names it in the warning) in this process, then put
    back the process-wide state it may have changed: the working directory (helper-41: a
    task's ``os.chdir`` moved the service's relative database and results paths), torch's
    default dtype and its number of threads. Changes to anything else stay; a task that
    changes these is named in a warning. Task code run under it runs one at a time in the
    process (a re-entrant lock), so that the state put back is the process's own
    (helper-43: two request threads each restored what the other's task had set)."""
    with _TASK_CODE:
        cwd, dtype, threads = os.getcwd(), torch.get_default_dtype(), torch.get_num_threads()
        try:
            yield
        finally:
            changed = []
            try:
                now: str | None = os.getcwd()
            except OSError:  # the task chdir'ed into a folder it then removed (helper-43)
                now = None
            if now != cwd:
                changed.append(f"the working directory ({now or 'a removed folder'})")
                with contextlib.suppress(OSError):  # our own folder gone meanwhile
                    os.chdir(cwd)
            if torch.get_default_dtype() != dtype:
                changed.append(f"torch's default dtype ({torch.get_default_dtype()})")
                torch.set_default_dtype(dtype)
            if torch.get_num_threads() != threads:
                changed.append(f"torch's threads ({torch.get_num_threads()})")
                torch.set_num_threads(threads)
            if changed:
                _log.warning("%s changed %s: put back", what, ", ".join(changed))
