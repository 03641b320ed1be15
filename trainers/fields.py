"""Typed, documented configuration fields shared by ``TrainConfig`` and task options.

A configuration class is a keyword-only dataclass whose fields are declared with
:func:`option`, which records a help text. From it this module derives

* :func:`describe`: a list of :class:`FieldInfo` (name, kind, default, choices,
  help) used by the CLI to build its options and by services to publish the
  schema of a task;
* :func:`build`: an instance from a plain mapping (JSON, a CLI, a search space),
  type-checked field by field; every error is a :class:`ConfigError` naming the
  field.

Supported annotations: ``int``, ``float``, ``bool``, ``str``, ``Literal[...]``
and any of those ``| None``.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import reprlib
import types
import typing
from collections.abc import Mapping
from typing import Any, Literal

from trainers.errors import ConfigError

_KINDS = {int: "int", float: "float", bool: "bool", str: "str"}


def option(default: Any, help: str, path: bool = False) -> Any:  # noqa: A002 - argparse's
    """Declare a dataclass field with a default value and a help text.

    ``path``: the value names a file or directory on the machine that runs the
    training (the service lets only admin tokens set such fields).
    """
    return dataclasses.field(default=default, metadata={"help": help, "path": path})


@dataclasses.dataclass(frozen=True)
class FieldInfo:
    """The public description of one configuration field.

    Attributes:
        name: the field's name.
        kind: one of ``"int"``, ``"float"``, ``"bool"``, ``"str"``, ``"choice"``.
        default: the default value (JSON-compatible).
        help: what the field means, its unit and valid range.
        nullable: whether ``None`` is accepted.
        choices: the accepted values of a ``"choice"`` field, else ``None``.
        path: the value is a file-system path on the machine that trains.
    """

    name: str
    kind: str
    default: Any
    help: str
    nullable: bool
    choices: tuple[Any, ...] | None = None
    path: bool = False

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _unwrap_optional(annotation: Any) -> tuple[Any, bool]:
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(annotation) if a is not type(None)]
        nullable = len(args) < len(typing.get_args(annotation))
        if len(args) != 1:
            raise TypeError(f"unsupported annotation {annotation!r}")
        return args[0], nullable
    return annotation, False


def describe(cls: type) -> list[FieldInfo]:
    """Describe every field of the configuration dataclass ``cls`` (a new list each call)."""
    return list(_describe(cls))


@functools.lru_cache(maxsize=256)
def _describe(cls: type) -> tuple[FieldInfo, ...]:
    """:func:`describe`, once per class: ``typing.get_type_hints`` costs about 0.3 ms, and
    validating a spec builds the configuration once per value of its search space."""
    hints = typing.get_type_hints(cls)
    infos = []
    for f in dataclasses.fields(cls):
        base, nullable = _unwrap_optional(hints[f.name])
        if typing.get_origin(base) is Literal:
            kind, choices = "choice", typing.get_args(base)
        else:
            kind, choices = _KINDS[base], None
        infos.append(
            FieldInfo(f.name, kind, f.default, f.metadata.get("help", ""), nullable, choices,
                      f.metadata.get("path", False))
        )
    return tuple(infos)


def coerce(info: FieldInfo, value: Any) -> Any:
    """Check ``value`` against ``info`` and return it in the field's type.

    ``int`` fields take integers only: a float is refused even when integral
    (``3.0``), as the spec's own integers are (a JSON client that sends ``3.0``
    means a float); ``float`` fields take integers too; booleans are never taken
    for numbers.

    Raises:
        ConfigError: the value has the wrong type, is not a valid choice, or is
            a non-finite float.
    """
    if value is None:
        if info.nullable:
            return None
        raise ConfigError(info.name, "must not be null")
    if info.kind == "choice":
        if value in info.choices and type(value) in {type(c) for c in info.choices}:
            return value
        raise ConfigError(info.name, f"must be one of {list(info.choices)}, got {_short(value)}")
    if info.kind == "bool":
        if isinstance(value, bool):
            return value
    elif info.kind == "int":
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    elif info.kind == "float":
        if isinstance(value, int | float) and not isinstance(value, bool):
            if not math.isfinite(value):
                raise ConfigError(info.name, f"must be a finite number, got {value!r}")
            return float(value)
    elif info.kind == "str" and isinstance(value, str):
        return value
    raise ConfigError(info.name,
                      f"expected {info.kind}, got {type(value).__name__} {_short(value)}")


_REPR = reprlib.Repr()  # keyword arguments arrive only with Python 3.12
_REPR.maxlevel, _REPR.maxlist, _REPR.maxdict, _REPR.maxstring, _REPR.maxother = 3, 6, 6, 80, 80


def _short(value: Any) -> str:
    """``repr(value)``, bounded in size and work however large ``value`` is."""
    return _REPR.repr(value)


def build(cls: type, values: Mapping[str, Any]) -> Any:
    """Build the configuration dataclass ``cls`` from a mapping of field values.

    Fields absent from ``values`` keep their defaults.

    Raises:
        ConfigError: a key is not a field of ``cls``, or a value is invalid
            (the dataclass's own ``__post_init__`` checks ranges).
    """
    infos = {info.name: info for info in describe(cls)}
    unknown = sorted(set(values) - set(infos))
    if unknown:
        raise ConfigError(unknown[0], f"unknown field; valid fields are {sorted(infos)}")
    return cls(**{name: coerce(infos[name], v) for name, v in values.items()})


def check_fields(instance: Any) -> None:
    """Hold every field of a configuration dataclass to its annotation, as :func:`build`
    does (:func:`coerce`: types, ``Literal`` choices, finite floats, null only where
    nullable), so that one built directly is refused alike; an ``int`` given to a
    ``float`` field becomes a float. Call it first in ``__post_init__``.

    Raises:
        ConfigError: naming the first invalid field.
    """
    for info in describe(type(instance)):
        value = getattr(instance, info.name)
        coerced = coerce(info, value)
        if type(coerced) is not type(value):
            object.__setattr__(instance, info.name, coerced)  # frozen dataclasses too


def to_dict(instance: Any) -> dict[str, Any]:
    """The fields of a configuration dataclass as a JSON-compatible dict."""
    return dataclasses.asdict(instance)


def require(condition: bool, field: str, message: str) -> None:
    """Raise :class:`ConfigError` for ``field`` unless ``condition`` holds."""
    if not condition:
        raise ConfigError(field, message)
