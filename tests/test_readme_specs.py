"""Every study spec the README shows as YAML is a valid spec (a newcomer copies them)."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from hpo.spec import parse_spec

README = Path(__file__).resolve().parents[1] / "README.md"


def _specs() -> list[dict]:
    blocks = re.findall(r"```yaml\n(.*?)```", README.read_text(), flags=re.S)
    docs = [d for block in blocks for d in yaml.safe_load_all(block)]
    return [d for d in docs if isinstance(d, dict) and {"name", "task"} <= set(d)]


def test_the_readme_s_yaml_specs_parse():
    specs = _specs()
    # the built-in tasks' specs are checked against their task too; a user's own task
    # (my-task) is not installed here
    names = [parse_spec(d, check_task=d["task"] in ("digits", "charlm")).name for d in specs]
    assert {"digits-bounded", "digits-front"} <= set(names), names
