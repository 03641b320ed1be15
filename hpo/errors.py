"""Domain errors of the hpo package, all in one place.

Library errors (Optuna, Ray, SQLAlchemy) are wrapped once, where the library is
called, into one of these; the service maps them to HTTP in one place.
"""

from __future__ import annotations

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
