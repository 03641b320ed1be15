"""Domain errors of the hpo package, all in one place.

Library errors (Optuna, Ray, SQLAlchemy) are wrapped once, where the library is
called, into one of these; the service maps them to HTTP in one place.
"""

from __future__ import annotations

import re
import unicodedata
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
        # and escaped: a key may hold a NUL or a lone surrogate, which no answer can encode
        self.errors = [{**e, "loc": printable(e["loc"]), "msg": printable(_bounded(e["msg"]))}
                       for e in errors]
        super().__init__("; ".join(f"{e['loc']}: {e['msg']}" if e["loc"] else e["msg"]
                                   for e in self.errors))

    def __reduce__(self):  # picklable, like every error that may cross a process boundary
        return type(self), (self.errors,)

    @classmethod
    def at(cls, loc: str, msg: str) -> SpecError:
        return cls([{"loc": loc, "msg": msg}])


def unprintable(text: str) -> str | None:
    """The first control character (NUL, newline, ...) or lone surrogate of ``text``, if any:
    characters that JSON answers cannot encode as UTF-8 (surrogates) or that storages
    refuse (PostgreSQL: NUL) or that forge log lines."""
    return next((c for c in text if unicodedata.category(c) in ("Cc", "Cs")), None)


def printable(text: str) -> str:
    """``text`` with control characters and lone surrogates escaped (``\\x00``,
    ``\\ud800``), so that it can be encoded as UTF-8 and shown on one line."""
    if unprintable(text) is None:
        return text
    return "".join(c.encode("unicode_escape").decode("ascii")
                   if unicodedata.category(c) in ("Cc", "Cs") else c for c in text)


def _bounded(text: str, limit: int = 1000) -> str:
    return text if len(text) <= limit else text[:limit] + f"... ({len(text)} characters)"


_TRACEBACK_HEAD = "Traceback (most recent call last):"
_RAY_HEAD = "ray::"  # Ray writes its worker's header (pid, node IP) in place of _TRACEBACK_HEAD
# Tune's header of a trial's error.txt: what follows says what failed
_TUNE_HEAD = re.compile(r"Failure # \d+ \(occurred at [^)]*\)")
_CHAINED = ("The above exception was the direct cause of the following exception:",
            "During handling of the above exception, another exception occurred:")
# OverflowError: ..., RayTaskError(OverflowError): ...; never "ray::Impl.train() (pid=...)"
_EXCEPTION_LINE = re.compile(r"^(?![\w.]*::)[A-Za-z_][\w.]*(\([\w.]+\))?(:|$)")
_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")  # Ray colours its trial errors
_URL = re.compile(r"\b([A-Za-z][\w+.-]*)://\S*")
# an absolute path, also after a label ("file:/srv/x"), or one that climbs ("../../etc/x")
_PATH = re.compile(r"(?<![\w./~-])~?/[\w.@%+=-][^\s'\"`,;:()\[\]{}<>]*"
                   r"|(?<![\w./~-])(?:\.\./)+[^\s'\"`,;:()\[\]{}<>]*")
# user:password@host of an address without a scheme (the host a name with a dot, or
# localhost; the password may hold ':' and '@'): not "12:30@UTC" nor "layer:conv1@block2"
_USERINFO = re.compile(r"(?<![\w/@])[\w.%+-]+:[^\s/]+@(?=(?:[\w-]+\.)+[A-Za-z]|localhost\b)")
# SECRET: a bearer or basic credential (also Bearer%20...); the value of a name that holds
# a secret, given as name=value (name = value, name%3Dvalue) or as a quoted key
# ('password': 'x'), or of a compound name (api_key, HF_TOKEN, db_password) as name:
# value, never "password: too short" in prose; a service token anywhere (after an escape
# like %22 or _, or with its _ escaped as %5F)
_SECRET_NAME = (r"(?:\w*password|passwd|pwd|\w*secret(?:[_-]?key)?|private[_-]?key"
                r"|api[_-]?key|access[_-]?key|\w*token)")
_COMPOUND_NAME = (r"(?:\w*(?:api|access|secret|private)[_-]key|\w*_token|\w*_password"
                  r"|\w*_secret)")
_SECRET_VALUE = r"(?:'[^']*'|\"[^\"]*\"|[^&\s\"',;)}\]]+)"
SECRET = re.compile(rf"(?P<keep>(?:Bearer|Basic)(?:\s|%20|\+)+"
                    rf"|{_SECRET_NAME}\s*(?:=|%3D)\s*|['\"]{_SECRET_NAME}['\"]\s*:\s*"
                    rf"|\b{_COMPOUND_NAME}:\s*)"
                    rf"{_SECRET_VALUE}|hpo(?:_|%5F)[A-Za-z0-9_\-]{{20,}}", re.IGNORECASE)


def hide_secrets(text: str) -> str:
    """``text`` with the secrets :data:`SECRET` matches replaced by ``<hidden>`` (the name
    before a value is kept: ``password=<hidden>``), and the ``user:password`` of an
    address without a scheme (``<hidden>@db.example.org``)."""
    text = _USERINFO.sub("<hidden>@", text)
    return SECRET.sub(lambda m: (m.group("keep") or "") + "<hidden>", text)


def public_message(text: str, *, from_end: bool = False, limit: int = 1000) -> str:
    """One line about an error, fit for an API answer: no traceback, no file path, no URL.

    Takes the exception line of a Python traceback (of the last exception of a
    chain: the first ``Type: message`` line after its frames, so the first line
    of a multi-line message, never Ray's ``ray::...`` header line with its pid
    and node IP), otherwise the first non-empty line (the last with
    ``from_end``, for the tail of a log). Terminal colour codes are dropped,
    file paths become ``<path>``, URLs (which may carry a password)
    ``scheme://...``, and secrets ``<hidden>`` (:func:`hide_secrets`); at most
    ``limit`` characters. The full text belongs in a log (issue 11: a study's ``error``
    carried a server traceback).
    """
    lines = [line.rstrip() for line in _ANSI.sub("", text).splitlines() if line.strip()]
    if any(line.strip() == _TRACEBACK_HEAD or line.lstrip().startswith('File "')
           for line in lines):
        line = _exception_line(lines)
    else:
        plain = [line for line in lines if not line.startswith(_RAY_HEAD)
                 and not _TUNE_HEAD.fullmatch(line.strip())] or lines
        line = (plain[-1] if from_end else plain[0]).strip() if plain else ""
    line = _PATH.sub("<path>", _URL.sub(lambda m: f"{m.group(1)}://...", line))
    line = hide_secrets(line)
    if len(line) > limit:
        line = line[:limit - 3] + "..."
    return line or "no message"


def _exception_line(lines: list[str]) -> str:
    """The exception line of a traceback: in the last part of a chain, the first
    unindented exception line after the first frame (a message may itself hold lines
    that look like a traceback)."""
    last = max((i for i, line in enumerate(lines) if line.strip() in _CHAINED), default=-1)
    block = lines[last + 1:]
    first_frame = next((i for i, line in enumerate(block)
                        if line[0].isspace() and line.lstrip().startswith('File "')), 0)
    after = [line for line in block[first_frame:] if not line[0].isspace()]
    exception = [line for line in after if _EXCEPTION_LINE.match(line)]
    if exception:
        return exception[0]
    unindented = [line for line in lines if not line[0].isspace()
                  and not line.startswith(_RAY_HEAD) and line.strip() != _TRACEBACK_HEAD]
    return (unindented or [""])[-1]


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
