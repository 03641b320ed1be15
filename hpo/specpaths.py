"""Field paths of pydantic errors, from the model's core schema (``hpo.spec`` names every
problem by the user's dotted path, not pydantic's ``loc``, which holds union tags)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

_WRAPPERS = {"model", "default", "nullable", "function-before", "function-after",
             "function-wrap"}


def _unwrap(node: dict, defs: dict[str, dict]) -> dict:
    """The core schema under ``node``'s wrappers (defaults, validators, references)."""
    while True:
        if node["type"] == "definitions":
            defs.update({d["ref"]: d for d in node["definitions"]})
            node = node["schema"]
        elif node["type"] == "definition-ref":
            node = defs[node["schema_ref"]]
        elif node["type"] in _WRAPPERS:
            node = node["schema"]
        else:
            return node


def field_path(schema: dict, loc: tuple, data: Any) -> str:
    """The user's dotted field path of a pydantic error ``loc`` in ``data`` validated by the
    core ``schema`` (see :func:`walk`)."""
    out, _ = walk(schema, loc)
    if out[:1] == ["objective"] and len(out) > 1 and isinstance(data.get("objective"), Mapping):
        del out[1]  # the index of the list it was normalized to
    return ".".join(map(str, out))


def walk(schema: dict, loc: tuple) -> tuple[list[str | int], list[str]]:
    """Follow a pydantic error ``loc`` down the core ``schema`` (a model's
    ``__pydantic_core_schema__``): the user's path, and the
    fields of the model where its last part was looked up (``[]`` elsewhere). Where the
    schema is a union, pydantic's loc holds one element that is not the user's (the
    member's tag for a discriminated union, the member's name for a plain one of scalars)
    and it is dropped."""
    defs: dict[str, dict] = {}
    node: dict | None = schema
    out: list[str | int] = []
    fields: dict = {}
    for part in loc:
        node = _unwrap(node, defs) if node is not None else None
        kind = node["type"] if node is not None else None
        if kind == "tagged-union":
            node = node["choices"].get(part)
            continue
        if kind == "union":  # scalars only (every union of models is discriminated)
            node = None
            continue
        out.append(part)
        fields = {}
        if kind == "model-fields":
            fields = {f.get("validation_alias") or name: f
                      for name, f in node["fields"].items()}
            node = fields[part]["schema"] if part in fields else None
        elif kind == "list":
            node = node["items_schema"]
        elif kind == "dict":
            node = node["values_schema"]
        else:
            node = None
    return out, sorted(fields)
