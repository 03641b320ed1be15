"""Domain errors of the training engine, all in one place.

Every error derives from :class:`TrainersError`; callers that only need to know
"the training engine refused or failed" catch that one class. :func:`printable` is how the
command lines show a message that may quote a file or an argument.
"""

from __future__ import annotations

import functools
import unicodedata

# What a task's own code may raise that a check reports instead of ending the process: any
# Exception, and SystemExit (a module or method that calls sys.exit), which is none
# (helper-41: `hpo task check` ended "passing", `hpo run` exited 0 storing nothing, and
# GET /v1/tasks answered 500 to everyone). KeyboardInterrupt stays the user's Ctrl-C.
USER_CODE_ERRORS = (Exception, SystemExit)


class TrainersError(Exception):
    """Base class of every error raised by :mod:`trainers`."""


class ConfigError(TrainersError, ValueError):
    """A configuration value is invalid.

    Attributes:
        field: the name of the offending field (a ``TrainConfig`` field, a task
            option or a parameter name), so that callers can point at it.
    """

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.reason = message

    def __reduce__(self):  # picklable (Ray ships errors between processes)
        return type(self), (self.field, self.reason)


class UnknownTaskError(TrainersError, LookupError):
    """No built-in or installed task has this name."""

    def __init__(self, name: str, known: list[str]) -> None:
        super().__init__(f"unknown task {name!r}; known tasks: {', '.join(sorted(known))}")
        self.name = name
        self.known = list(known)

    def __reduce__(self):
        return type(self), (self.name, self.known)


class NonFiniteError(TrainersError, FloatingPointError):
    """The loss or the gradient norm of an optimizer update is NaN or infinite.

    Raised before the update is applied, so the parameters are those of the
    previous update. Under fp16 with loss scaling the update is skipped instead
    (see ``trainers.precision``).

    Attributes:
        step: the 1-based number of the optimizer update that was refused.
        quantity: ``"loss"`` or ``"grad_norm"``.
        value: the offending value.
        skipped_in_a_row: under fp16, the updates skipped in a row before giving up
            (``trainers.precision.MAX_SKIPPED_IN_A_ROW``), else ``None``.
        loss_scale: the fp16 loss scale then, else ``None``.
    """

    def __init__(self, step: int, quantity: str, value: float, *,
                 skipped_in_a_row: int | None = None, loss_scale: float | None = None) -> None:
        where = (f"; fp16 skipped it for overflow {skipped_in_a_row} times in a row (the "
                 f"loss scale fell to {loss_scale:g}): lower init_loss_scale or lr"
                 if skipped_in_a_row is not None else "; the update was not applied")
        super().__init__(f"non-finite {quantity} ({value}) at optimizer update {step}{where}")
        self.step = step
        self.quantity = quantity
        self.value = value
        self.skipped_in_a_row = skipped_in_a_row
        self.loss_scale = loss_scale

    def __reduce__(self):
        return functools.partial(type(self), skipped_in_a_row=self.skipped_in_a_row,
                                 loss_scale=self.loss_scale), (
            self.step, self.quantity, self.value)


class CheckpointError(TrainersError):
    """A checkpoint is missing, unreadable, or does not match the run resuming it."""


class CheckpointWriteError(CheckpointError):
    """A checkpoint could not be written (disk full, no permission, ...); the earlier
    checkpoints are untouched, so the run can be resumed from the newest of them."""


def misfit(where: str, e: BaseException) -> str:
    """The message of a checkpoint that does not fit the run it is loaded into, on one line
    (torch's "Error(s) in loading state_dict" lists the keys on lines of their own, which
    an answer's one-line ``fail_reason`` cut off: helper-41), saying the likely cause."""
    return (f"{where} does not fit this run (its model or optimizer changed since the "
            f"checkpoint was written: the task's code, or an option that shapes the model?): "
            f"{type(e).__name__}: {' '.join(str(e).split())}")


def printable(text: str) -> str:
    """``text`` with its control characters (ESC, newline, CR, NUL, ... : Unicode category
    ``Cc``) and lone surrogates (``Cs``) escaped as Python writes them (``\\x1b``,
    ``\\n``, ``\\ud800``), every other character kept.

    The command lines print each error message through it: a message quotes field names
    and values of a model file, a checkpoint or the command line, and a file could
    otherwise recolour, move or rewrite the user's terminal, or forge a line of output.
    The same rule as ``hpo.errors.printable`` (``trainers`` imports nothing of ``hpo``).
    """
    if not any(unicodedata.category(c) in ("Cc", "Cs") for c in text):
        return text
    return "".join(c.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(c) in ("Cc", "Cs") else c for c in text)
