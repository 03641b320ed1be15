"""Limits that keep a spec's validation fast whatever its size (issue 15.4).

A body of up to ``HPO_MAX_BODY_BYTES`` (1 MiB) can hold a million numbers or tens of
thousands of parameters; :func:`hpo.spec.parse_spec` stays linear and cheap per item on
it: the scan for unprintable text runs at C speed and builds a path only for a bad
string, a search space over :data:`MAX_PARAMETERS` is refused before its parameters are
validated, and each check lists at most :data:`MAX_ERRORS` problems.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from hpo.errors import unprintable

__all__ = ["MAX_ERRORS", "MAX_KEYS", "MAX_PARAMETERS", "NAME_PATTERN", "NAME_RULE",
           "key_errors", "more_errors", "text_errors"]

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
NAME_RULE = ("must be 1 to 64 characters: letters, digits, '_', '.' and '-', starting with "
             "a letter or a digit")
"""Study names: 1-64 characters, letters, digits, ``_ . -``, not starting with a symbol.
Here, not in :mod:`hpo.spec`, so that the client checks a name without importing the spec
model."""

MAX_PARAMETERS = 1000  # parameters of a search space, checked before any is validated
MAX_KEYS = 2 * MAX_PARAMETERS
"""Keys of any one mapping of a spec (no field has more: a search space or a warm-start
point names at most MAX_PARAMETERS parameters), checked before the structure is validated:
pydantic builds an error per unknown key (60,000 of them took 0.1 s)."""
MAX_ERRORS = 100
"""Problems listed per check of a spec: one is enough to refuse it, and each may cost a
"did you mean" (difflib, about 40 us); past them, one entry counts the rest."""


def more_errors(n: int) -> dict[str, str]:
    """The entry that stands for ``n`` problems found past :data:`MAX_ERRORS`."""
    return {"loc": "", "msg": f"and {n:,} more problems (the first {MAX_ERRORS} are listed)"}


# what hpo.errors.unprintable finds (Unicode categories Cc and Cs), as one C-speed search
_UNPRINTABLE = re.compile("[\x00-\x1f\x7f-\x9f\ud800-\udfff]")
_SCALARS = (int, float, bool, type(None))


def _all_printable(value: Any) -> bool:
    """Whether no key or string of ``value`` holds a control character or a lone surrogate:
    the common answer of :func:`text_errors`, found without building a path per item
    (about 0.1 us per number of a 1 MiB body; the paths cost ten times that)."""
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            if _UNPRINTABLE.search(v):
                return False
        elif isinstance(v, Mapping):
            if any(isinstance(k, str) and _UNPRINTABLE.search(k) for k in v):
                return False
            stack.extend(x for x in v.values() if type(x) not in _SCALARS)
        elif isinstance(v, list | tuple):
            stack.extend(x for x in v if type(x) not in _SCALARS)
    return True


def key_errors(value: Any, loc: str = "") -> list[dict[str, str]]:
    """The mappings of the spec with more than :data:`MAX_KEYS` keys, by path (at most
    :data:`MAX_ERRORS`); a path is built for mappings and lists only, never per number."""
    found: list[dict[str, str]] = []
    stack = [(value, loc)]
    while stack and len(found) < MAX_ERRORS:
        v, where = stack.pop()
        if isinstance(v, Mapping):
            if len(v) > MAX_KEYS:
                found.append({"loc": where, "msg": f"has {len(v):,} keys; at most {MAX_KEYS:,}"})
                continue
            stack.extend((x, f"{where}.{k}" if where else str(k)) for k, x in v.items()
                         if isinstance(x, Mapping | list | tuple))
        elif isinstance(v, list | tuple):
            stack.extend((x, f"{where}.{i}") for i, x in enumerate(v)
                         if isinstance(x, Mapping | list | tuple))
    return found


def text_errors(value: Any, loc: str) -> list[dict[str, str]]:
    """Every key or string of the spec holding a control character or a lone surrogate:
    no database keeps them all (PostgreSQL refuses NUL, UTF-8 has no surrogates)."""
    if not loc and _all_printable(value):
        return []

    def bad(text: str, where: str) -> list[dict[str, str]]:
        c = unprintable(text)
        return [] if c is None else [{"loc": where, "msg": f"holds U+{ord(c):04X} "
                                      f"(a control character or lone surrogate); "
                                      f"only printable text is accepted"}]

    if isinstance(value, str):
        return bad(value, loc)
    errors: list[dict[str, str]] = []
    items = (value.items() if isinstance(value, Mapping)
             else enumerate(value) if isinstance(value, list | tuple) else ())
    for key, item in items:
        where = f"{loc}.{key}" if loc else str(key)
        errors += bad(key, where) if isinstance(key, str) else []
        errors += text_errors(item, where)
    return errors
