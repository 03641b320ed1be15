"""Domain errors of the hpo package, all in one place.

Library errors (Optuna, Ray, SQLAlchemy) are wrapped once, where the library is
called, into one of these; the service maps them to HTTP in one place.
"""

from __future__ import annotations

import re
from collections.abc import Sequence


class HpoError(Exception):
    """Base class of every error raised by :mod:`hpo`."""


class SpecError(HpoError, ValueError):
    """A study spec is invalid.

    Attributes:
        errors: one ``{"loc": "search_space.lr.low", "msg": "..."}`` per problem;
            ``loc`` is the dotted path of the offending field in the spec.
    """

    def __init__(self, errors: Sequence[dict[str, str]]) -> None:
        # messages quote the offending values: bounded, whatever the input's size
        self.errors = [{**e, "msg": _bounded(e["msg"])} for e in errors]
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"]
                                   for e in self.errors))

    def __reduce__(self):  # picklable, like every error that may cross a process boundary
        return type(self), (self.errors,)

    @classmethod
    def at(cls, loc: str, msg: str) -> SpecError:
        return cls([{"loc": loc, "msg": msg}])


def _bounded(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


_TRACEBACK_HEAD = "Traceback (most recent call last):"
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(\([\w.]+\))?(:|$)")  # OverflowError: ...
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours its trial errors
_URL = re.compile(r"\b([A-Za-z][\w+.-]*)://\S*")
_PATH = re.compile(r"(?<![\w.:/~-])~?/[\w.@%+=-][^\s'\"`,;:()\[\]{}<>]*")


def public_message(text: str, *, from_end: bool = False, limit: int = 1000) -> str:
    """One line about an error, fit for an API answer: no traceback, no file path, no URL.

    Takes the exception line of a Python traceback (its last ``Type: message``
    line), otherwise the first non-empty line (the last with ``from_end``, for
    the tail of a log). Terminal colour codes are dropped, file paths become
    ``<path>``, URLs (which may carry a password) ``scheme://...``; at most
    ``limit`` characters. The full text
    belongs in a log (issue 11: a study's ``error`` carried a server traceback).
    """
    lines = [line.rstrip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    if any(line.strip() == _TRACEBACK_HEAD or line.lstrip().startswith('File "')
           for line in lines):
        unindented = [line for line in lines if not line[0].isspace()]
        exception = [line for line in unindented if _EXCEPTION_LINE.match(line)]
        line = (exception or unindented or [""])[-1]
    else:
        line = (lines[-1] if from_end else lines[0]).strip() if lines else ""
    line = _PATH.sub("<path>", _URL.sub(lambda m: f"{m.group(1)}://...", line))
    if len(line) > limit:
        line = line[:limit - 3] + "..."
    return line or "no message"


class StorageError(HpoError):
    """The study storage cannot be reached or refused an operation."""


class StudyExistsError(HpoError):
    """A study of this name already exists (and the caller asked for a new one)."""


class StudyBusyError(HpoError):
    """Another live driver is running this study (see ``hpo.lease``)."""


class StudyNotFoundError(HpoError, LookupError):
    """No study of this name in the storage."""


class ClusterError(HpoError):
    """The Ray cluster cannot be reached or cannot run the study's trials."""
