"""Field paths of pydantic errors, from the model's core schema (``hpo.spec`` names every
problem by the user's dotted path, not pydantic's ``loc``, which holds union tags), and the
list of problems they make (:func:`problems`: a union's members once, at most
:data:`hpo.speclimits.MAX_ERRORS`; :func:`tag_problem`: a discriminated union's tag at its
own field)."""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from itertools import pairwise
from typing import Any

from hpo.speclimits import MAX_ERRORS, more_errors
from hpo.suggest import did_you_mean

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
    out, fields, _ = _walk(schema, loc)
    return out, fields


def _union_tags(schema: dict, loc: tuple) -> list[str]:
    """The tags of the discriminated union whose value is at ``loc`` (``sampler``: the
    samplers' names), in the schema's order; ``[]`` where the value is no such union."""
    _, _, node = _walk(schema, loc)
    return list(node["choices"]) if node and node["type"] == "tagged-union" else []


def _walk(schema: dict, loc: tuple) -> tuple[list[str | int], list[str], dict | None]:
    """:func:`walk`, and the (unwrapped) schema of the value at ``loc``."""
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
    return out, sorted(fields), _unwrap(node, defs) if node is not None else None


def tag_problem(schema: dict, err: dict, data: Any) -> dict[str, str]:
    """A discriminated union's unknown or missing tag (pydantic's ``union_tag_invalid`` or
    ``union_tag_not_found`` error ``err`` in ``data`` validated by ``schema``) as a problem
    at the tag's own field (``sampler.name: unknown name 'tpee' ...``), with the names it
    may take, instead of pydantic's words at the union's field."""
    key = err["ctx"]["discriminator"].strip("'")
    tags = _union_tags(schema, err["loc"])
    loc = ".".join(filter(None, [field_path(schema, err["loc"], data), key]))
    if err["type"] == "union_tag_not_found":
        return {"loc": loc, "msg": f"required: one of {', '.join(tags)}"}
    union = _value_at(data, err["loc"])
    given = union.get(key) if isinstance(union, Mapping) else err["ctx"]["tag"]
    if not isinstance(given, str):  # null, a number, a list: as the document has it
        return {"loc": loc, "msg": f"must be a string, one of {', '.join(tags)}; got "
                                   f"{json.dumps(given, default=str)}"}
    return {"loc": loc, "msg": f"unknown {key} {given!r}{did_you_mean(given, tags)}; one of "
                               f"{', '.join(tags)}"}


def _value_at(data: Any, loc: tuple) -> Any:
    """The value of ``data`` at a pydantic ``loc``, past the parts that are no key of it
    (a union member's tag)."""
    for part in loc:
        in_list = isinstance(data, list) and isinstance(part, int) and 0 <= part < len(data)
        if in_list or (isinstance(data, Mapping) and part in data):
            data = data[part]
    return data


def problems(found: list[dict], problem_of: Callable[[dict], dict[str, str]]
             ) -> list[dict[str, str]]:
    """Pydantic's errors (``ValidationError.errors()``) as a spec's problems, each made by
    ``problem_of`` (``{"loc": field path, "msg"}``), at most :data:`MAX_ERRORS` listed,
    then how many more. One problem per field where a value fit none of a union's members:
    pydantic reports each member's failure at its own loc (``..., 'bool'``, ``..., 'int'``),
    the same field path once the member is dropped; those read as one message ("Input
    should be a valid boolean, a valid integer or a valid string")."""
    out: list[dict[str, str]] = []
    parts: list[str] = []
    for i, err in enumerate(found):
        if out and _member_of_last(err, found[i - 1]):
            problem = problem_of(err)
            if problem["loc"] == out[-1]["loc"]:
                parts.append(problem["msg"])
                out[-1] = {"loc": problem["loc"], "msg": _either(parts)}
                continue
        if len(out) == MAX_ERRORS:  # the rest counted by their raw locs: no schema walk
            rest = found[i:]
            more = 1 + sum(not _member_of_last(e, prev) for prev, e in pairwise(rest))
            return [*out, more_errors(more)]
        problem = problem_of(err)
        out.append(problem)
        parts = [problem["msg"]]
    return out


def _member_of_last(err: dict, last: dict) -> bool:
    """Whether ``err`` may be another union member's failure of ``last``'s value: its loc
    differs in the last part alone (the member's tag) and it is no unknown field."""
    loc, before = err["loc"], last["loc"]
    return (err["type"] not in _NO_MEMBER and last["type"] not in _NO_MEMBER
            and len(loc) == len(before) and loc != before and loc[:-1] == before[:-1])


# errors at a field itself, never one member's failure of a union (a discriminated union's
# tag errors stand at the union's loc: two parameters' are siblings, not members)
_NO_MEMBER = {"extra_forbidden", "union_tag_invalid", "union_tag_not_found"}


def _either(msgs: list[str]) -> str:
    """``["Input should be a", "Input should be b"]`` -> ``"Input should be a or b"``."""
    head = "Input should be "
    if all(m.startswith(head) for m in msgs):
        rest = [m.removeprefix(head) for m in msgs]
        return head + ", ".join(rest[:-1]) + " or " + rest[-1]
    return "; or ".join(msgs)
