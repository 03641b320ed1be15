"""The task contract, checked: ``hpo task check TARGET`` (issue 12, point 2).

The loop's exactness rests on promises a :class:`~trainers.tasks.Task` makes
that its type cannot express: ``loss_sum`` returns a *sum*, the declared
metrics are the ones ``eval_metrics`` returns, a run is a function of its
seed, all state lives in ``state_dict``... :func:`check_task` runs each rule
on the CPU, in fp32, with the loop itself (``trainers.fit``), and yields one
:class:`RuleResult` per rule, in this order:

===================  ==============================================================
``import``           the target names an importable, concrete ``Task`` subclass
``pickle``           a task and its options survive ``pickle`` (Ray ships them)
``build``            datasets (both non-empty) and model build from the defaults
``bounds``           ...and from each option's documented closed bounds (the
                     model on PyTorch's ``meta`` device: no memory, any size)
``metrics``          ``eval_metrics`` returns exactly the declared metrics, finite
``loss-sum``         ``loss_sum`` of a batch is reproducible (the same batch twice
                     gives the same loss), and the sum of its halves' (not a mean)
``mutable-options``  changing a mutable option changes no parameter shape
``determinism``      two runs, same seed: the same loss for every micro-batch
``resume``           resuming from a checkpoint after 2 updates is bit-identical
``accumulation``     micro-batch m x K accumulation steps gives the gradient of
                     micro-batch m*K x 1 within 1e-6 (dropout and BatchNorm in
                     eval mode, SGD with lr 1, so an update is the gradient)
===================  ==============================================================

A rule whose premise failed is reported ``SKIP`` naming that rule. The training rules
(determinism, resume, accumulation) evaluate the task with the loop, which reads the
objective: they need ``metrics`` when it failed on that (the objective is not returned
or not declared, or evaluating raised), not when only another metric is missing. Documented
bounds are read from the help text of each option: ``(1..512)``, ``in [0, 1)``,
``(>= 1)``, ``<= 8``; only closed ends are tried.
"""

from __future__ import annotations

import functools
import importlib
import inspect
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from trainers.contract._base import (
    _METHODS,
    ACCUMULATION_TOLERANCE,
    RULES,
    WHY_SUM,
    RuleResult,
    _exc,
    process_state_kept,
)
from trainers.contract._runs import _check_accumulation, _check_determinism, _check_resume
from trainers.contract._static import (
    CREATION_CHECK_MAX_PARAMS,
    _check_bounds,
    _check_build,
    _check_loss_sum,
    _check_metrics,
    _check_mutable,
    _check_pickle,
    creation_violations,
    documented_bounds,
)
from trainers.errors import USER_CODE_ERRORS
from trainers.tasks import get_task
from trainers.tasks.base import Task

__all__ = ["ACCUMULATION_TOLERANCE", "CREATION_CHECK_MAX_PARAMS", "RULES", "WHY_SUM",
           "RuleResult", "TaskLoadError", "check_target", "check_task", "creation_violations",
           "documented_bounds", "load_task", "process_state_kept"]


INSTALL_FIX = ("Fix: install the task's package (pip install DIR) or give module:Class "
               "importable from the current directory")


class TaskLoadError(Exception):
    """A check target that names no importable, concrete ``Task`` subclass; ``fix`` says
    what to do (empty when the message says it)."""

    def __init__(self, message: str, fix: str = INSTALL_FIX) -> None:
        super().__init__(message)
        self.fix = fix


def load_task(target: str) -> type[Task]:
    """The task class named by ``target``.

    Args:
        target: an installed task's name (entry-point group ``hpo.trainers``,
            or a built-in), or ``module:Class`` importable from the current
            Python path; the current directory is added to it.

    Raises:
        TaskLoadError: not found, not importable, not a ``Task`` subclass, or
            abstract (``Task`` itself, or a class with abstract methods left);
            the message says which.
    """
    if ":" not in target:
        try:
            cls = get_task(target)
        except USER_CODE_ERRORS as e:  # a user's package may raise anything
            raise TaskLoadError(_exc(e)) from e
    else:
        module_name, _, attr = target.partition(":")
        if os.getcwd() not in sys.path and "" not in sys.path:
            sys.path.insert(0, os.getcwd())
        try:
            cls = functools.reduce(getattr, attr.split("."), importlib.import_module(
                module_name))  # Outer.Inner, as trainers.load_task takes it
        except USER_CODE_ERRORS as e:
            raise TaskLoadError(f"cannot import {target!r}: {_exc(e)}") from e
    if not (isinstance(cls, type) and issubclass(cls, Task)):
        raise TaskLoadError(f"{target!r} is not a trainers.Task subclass")
    if cls is Task:
        raise TaskLoadError(f"{target!r} names the abstract base Task; give your subclass",
                            fix="")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(cls.__abstractmethods__))
        raise TaskLoadError(f"{target!r} names an abstract class (abstract: {missing}); give "
                            "a subclass that defines them", fix="")
    return cls


def check_target(target: str) -> Iterator[RuleResult]:
    """:func:`check_task` on ``target`` (see :func:`load_task`), the ``import`` rule first."""
    try:
        task_cls = load_task(target)
    except TaskLoadError as e:
        yield RuleResult("import", "FAIL", "entry point / module",
                         f"{e}. {e.fix}" if e.fix else str(e))
        yield from (RuleResult(rule, "SKIP", "", "needs import") for rule in RULES[1:])
        return
    yield RuleResult("import", "PASS", detail=f"{task_cls.__module__}:{task_cls.__qualname__}")
    yield from check_task(task_cls)


def check_task(task_cls: type[Task]) -> Iterator[RuleResult]:
    """Run every rule but ``import`` on ``task_cls`` (see module doc), one result each.

    Trains a few optimizer updates of the task on the CPU (fp32) several times;
    checkpoints go to a temporary directory that is removed afterwards. The
    task's own code may raise anything: it becomes the rule's FAIL detail.
    """
    failed: set[str] = set()  # the rules whose dependents SKIP

    def run(rule: str, needs: tuple[str, ...], body: Callable[[], RuleResult]) -> RuleResult:
        missing = [n for n in needs if n in failed]
        if missing:
            result = RuleResult(rule, "SKIP", "", f"needs {', '.join(missing)}")
        else:
            try:
                result = body()
            except USER_CODE_ERRORS as e:  # the task's own code
                result = RuleResult(rule, "FAIL", _METHODS[rule], f"raised {_exc(e)}")
        if not result.ok and not (rule == "metrics" and _loop_can_evaluate(task, evaluated)):
            failed.add(rule)
        return result

    task = None
    evaluated: dict[str, float] = {}  # the metrics rule's evaluation, if it got that far

    def build_defaults() -> RuleResult:
        nonlocal task
        task = task_cls()
        return _check_build(task)

    yield run("pickle", (), lambda: _check_pickle(task_cls))
    yield run("build", (), build_defaults)
    yield run("bounds", ("build",), lambda: _check_bounds(task_cls))
    yield run("metrics", ("build",), lambda: _check_metrics(task, evaluated))
    yield run("loss-sum", ("build",), lambda: _check_loss_sum(task))
    yield run("mutable-options", ("build",), lambda: _check_mutable(task_cls))
    with tempfile.TemporaryDirectory(prefix="hpo-task-check-") as tmp:
        runs: dict[str, Any] = {}
        yield run("determinism", ("build", "metrics"),
                  lambda: _check_determinism(task_cls, Path(tmp), runs))
        yield run("resume", ("build", "metrics", "determinism"),
                  lambda: _check_resume(task_cls, Path(tmp), runs))
    yield run("accumulation", ("build", "metrics", "loss-sum", "determinism"),
              lambda: _check_accumulation(task_cls))


def _loop_can_evaluate(task: Task | None, evaluated: dict[str, float]) -> bool:
    """Whether ``trainers.fit`` can evaluate ``task`` though the metrics rule failed: the
    evaluation ran and returned the objective, which is declared (the loop reads both)."""
    objective = getattr(task, "objective", None)
    return task is not None and objective in evaluated and objective in task.metrics
