"""``python -m trainers evaluate FILE [--task-option KEY=VALUE ...]``: evaluate a model file.

The task is rebuilt from the file's own metadata (task name, task options,
``TrainConfig``; ``trainers.model_file``), each ``--task-option`` replacing one
of them (a task option or a ``TrainConfig`` field, e.g. ``--task-option
device=cpu``; ``none`` is null for nullable fields). The weights are loaded and
the task's evaluation runs on its validation set exactly as the training loop
runs it. Path options (``charlm``'s ``corpus`` and ``cache_dir``) are never taken from
the file, which could otherwise make the evaluation read or write any path: they take
their defaults, or a ``--task-option`` (a note on stderr names each one the file set).
Output: one JSON object on one line of stdout, the metrics
(``{"val_accuracy": 0.96, "val_loss": 0.12}``), full float precision. Exit
status: 0 done, 2 a bad option or file (the message names it; also a file whose
``weights`` hold fewer values than the model its options give has parameters, refused
before the model is built: ``trainers.model_file.evaluate_model``), 1 the evaluation
failed (``evaluation failed: ...``, one line; also out of memory). Messages quote the
file's keys and values with control characters escaped (``trainers.errors.printable``),
a key that is not a name in quotes.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from trainers.cli import ArgumentParser, shown_name
from trainers.config import TrainConfig
from trainers.data import strict_json
from trainers.errors import (
    CheckpointError,
    ConfigError,
    TrainersError,
    UnknownTaskError,
    printable,
)
from trainers.fields import FieldInfo, describe
from trainers.model_file import evaluate_model, ignored_paths, load_model_file
from trainers.tasks import get_task


def build_parser() -> ArgumentParser:
    parser = ArgumentParser(
        prog="trainers evaluate",
        description="Evaluate a model file (e.g. from `hpo model`) on its task's validation "
                    "set; prints the metrics as one JSON object.")
    parser.add_argument("file", type=Path, metavar="FILE", help="a model file (.pt)")
    parser.add_argument("--task-option", action="append", default=[], metavar="KEY=VALUE",
                        help="replace one of the file's task options or TrainConfig fields "
                             "(repeatable)")
    return parser


def parse_value(info: FieldInfo, text: str) -> Any:
    """``text`` as a value of the field ``info`` (``none``/``null``: None where nullable).

    Raises:
        ConfigError: naming the field, when ``text`` is not of its kind.
    """
    if info.nullable and text.lower() in ("none", "null"):
        return None
    try:
        if info.kind == "int":
            return int(text)
        if info.kind == "float":
            return float(text)
    except ValueError:
        raise ConfigError(info.name, f"expected {info.kind}, got {text!r}") from None
    if info.kind == "bool":
        if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
            raise ConfigError(info.name, f"expected true or false, got {text!r}")
        return text.lower() in ("true", "1", "yes")
    return text


def overrides(task_name: str, pairs: list[str]) -> dict[str, Any]:
    """``--task-option`` pairs as typed values of the task's options and config fields.

    Raises:
        ConfigError: a pair without ``=``, an unknown key or a bad value (named).
    """
    fields = {f.name: f for f in [*describe(TrainConfig), *get_task(task_name).fields()]}
    out: dict[str, Any] = {}
    for pair in pairs:
        key, sep, text = pair.partition("=")
        if not sep:
            raise ConfigError("--task-option", f"expected KEY=VALUE, got {pair!r}")
        if key not in fields:
            raise ConfigError("--task-option", f"{key!r} is not an option of task "
                                               f"{task_name!r} nor a training option")
        out[key] = parse_value(fields[key], text)
    return out


def main(argv: Sequence[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(list(argv))
    try:
        model = load_model_file(args.file)
        given = overrides(model["task"], args.task_option)
        for key, value in ignored_paths(model).items():
            if key not in given:
                print(printable(f"note: the file's {key}={value!r} is not used (a path "
                                f"option is taken only from --task-option {key}=...)"),
                      file=sys.stderr)
        metrics = evaluate_model(model, given)
    except (CheckpointError, UnknownTaskError) as e:
        parser.error(str(e))
    except ConfigError as e:
        parser.error(f"{shown_name(e.field)}: {e.reason}")
    except TrainersError as e:
        print(printable(f"evaluation failed: {e}"), file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 - the task's own code (its import, its metrics)
        print(printable(f"evaluation failed: {type(e).__name__}: {e}"), file=sys.stderr)
        return 1
    print(strict_json(metrics), flush=True)
    return 0
