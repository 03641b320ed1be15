"""Spec text: JSON, or YAML without duplicate keys or aliases (``hpo.spec.parse_text``)."""

from __future__ import annotations

import json
import sys
from typing import Any

import yaml

from hpo.errors import SpecError


def parse_text(text: str, *, json_only: bool = False) -> Any:
    """Parse spec text: JSON, or YAML (a superset of JSON) unless ``json_only``.

    Raises:
        SpecError: the text is not valid JSON/YAML.
    """
    kind = "JSON" if json_only else "YAML"
    try:
        if json_only:
            return json.loads(text, object_pairs_hook=_unique_keys)
        return yaml.load(text, Loader=_UniqueKeyLoader)
    except RecursionError:
        raise SpecError.at("", f"not valid {kind}: nested too deeply") from None
    except (ValueError, yaml.YAMLError) as e:  # JSONDecodeError, integers over 4300 digits
        why = " ".join(str(e).split())  # one line: PyYAML's marks span several
        if "integer string conversion" in why:  # Python's hint would name sys.set_int_max_...
            why = f"a number has more than {sys.get_int_max_str_digits()} digits"
        raise SpecError.at("", f"not valid {kind}: {why}") from None


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping key given twice (it keeps the last silently)
    and aliases (``*name``: a few hundred bytes of nested aliases expand to gigabytes)."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.events.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None, None, f"aliases (*{event.anchor}) are not supported in a spec",
                event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            try:
                hash(key)
            except TypeError:  # a list or mapping as a key (``? [a, b]``): PyYAML's own
                raise yaml.constructor.ConstructorError(  # check comes after ours
                    "while constructing a mapping", node.start_mark,
                    "found an unhashable key", key_node.start_mark) from None
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
        return super().construct_mapping(node, deep=deep)

    def construct_sexagesimal_as_text(self, node):
        """YAML 1.1's base-60 numbers (``1:30``, ``1:2:3.5``) are text, as in YAML 1.2:
        PyYAML turns ``1:1:...:1`` into an integer in time quadratic in its length (a
        400 KB one took 16 s of CPU); no spec field is written that way."""
        value = self.construct_scalar(node)
        if ":" in value:
            return value
        return _NUMBERS[node.tag](self, node)


_NUMBERS = {"tag:yaml.org,2002:int": yaml.SafeLoader.construct_yaml_int,
            "tag:yaml.org,2002:float": yaml.SafeLoader.construct_yaml_float}
for _tag in _NUMBERS:
    _UniqueKeyLoader.add_constructor(_tag, _UniqueKeyLoader.construct_sexagesimal_as_text)
