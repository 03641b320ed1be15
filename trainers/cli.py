"""``python -m trainers TASK [options]``: train one run with progress output.

Every ``TrainConfig`` field and every option of the task is a flag
(``micro_batch_size`` -> ``--micro-batch-size``; booleans take ``--x/--no-x``;
nullable fields accept ``none``). ``--resume DIR`` continues from the newest
checkpoint under DIR (task, options and config come from the checkpoint; flags
given beside it override them). ``python -m trainers evaluate FILE`` evaluates a
model file instead (``trainers.evaluate``). Exit status: 0 done, 2 bad option or value
(the message names it), 1 training failed, 130 interrupted. Error messages quote names and
values of the command line and of checkpoints with their control characters escaped
(``trainers.errors.printable``): printed raw, a checkpoint could drive the terminal.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

from trainers import checkpoint as ckpt
from trainers.config import TrainConfig
from trainers.data import strict_json
from trainers.distributed import close_distributed, init_distributed_from_env
from trainers.errors import (
    CheckpointWriteError,
    ConfigError,
    TrainersError,
    UnknownTaskError,
    printable,
)
from trainers.fields import FieldInfo, describe
from trainers.loop import TrainResult, fit
from trainers.reporting import Decision, Metrics, SaveCheckpoint
from trainers.tasks import create, get_task, list_tasks


class ArgumentParser(argparse.ArgumentParser):
    """argparse's parser, its error messages passed through :func:`~trainers.errors.printable`
    (they quote arguments and files' contents; argparse's own quote arguments raw:
    ``unrecognized arguments: ...``)."""

    def error(self, message: str) -> NoReturn:
        super().error(printable(message))


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def shown_name(field: str) -> str:
    """A field as the command lines' messages name it: a name as is (``lr``, ``--resume``,
    ``TASK``), any other text quoted (an unknown key of a file's options: ``'a: b'``,
    ``'\\x1b[31mX'``)."""
    return field if field.lstrip("-").replace("-", "_").isidentifier() else repr(field)


def _option_name(field: str) -> str:
    """How the CLI spells a field in messages: ``lr`` -> ``--lr``; ``--resume``, ``TASK`` as
    is; any other text quoted (:func:`shown_name`)."""
    is_field = field.isidentifier() and field.islower()
    return _flag(field) if is_field else shown_name(field)


def _value_type(info: FieldInfo):
    base = {"int": int, "float": float, "str": str}.get(info.kind)

    def convert(text: str) -> Any:
        if info.nullable and text.lower() in ("none", "null"):
            return None
        if info.kind == "choice":
            if text not in info.choices:
                raise argparse.ArgumentTypeError(f"must be one of {', '.join(info.choices)}")
            return text
        return base(text)

    convert.__name__ = info.kind  # argparse names the type in "invalid <type> value"
    return convert


def _add_fields(group: argparse._ArgumentGroup, infos: list[FieldInfo]) -> None:
    for info in infos:
        default = "none" if info.default is None else info.default
        help_text = f"{info.help} (default: {default})"
        if info.kind == "bool":
            group.add_argument(_flag(info.name), dest=info.name, default=argparse.SUPPRESS,
                               action=argparse.BooleanOptionalAction, help=help_text)
        else:
            group.add_argument(_flag(info.name), dest=info.name, default=argparse.SUPPRESS,
                               type=_value_type(info), metavar=info.kind.upper(), help=help_text)


def build_parser(task_name: str | None) -> argparse.ArgumentParser:
    """The CLI's parser; with a task name it includes the task's own options."""
    parser = ArgumentParser(
        prog="trainers",
        usage="%(prog)s TASK [options]  |  %(prog)s --resume DIR  |  %(prog)s evaluate FILE",
        description="Train one run of a task. Tasks: " + ", ".join(list_tasks()),
        epilog="Task defaults override the config defaults shown; "
               "`python -m trainers TASK --help` lists the task's own options.")
    parser.add_argument("task", nargs="?", help="task name: " + ", ".join(list_tasks()))
    parser.add_argument("--resume", metavar="DIR", type=Path,
                        help="continue from the newest checkpoint under DIR")
    parser.add_argument("--summary-json", metavar="PATH", type=Path,
                        help="also write the final summary as JSON to PATH")
    parser.add_argument("--quiet", action="store_true", help="no per-evaluation progress lines")
    _add_fields(parser.add_argument_group("training (TrainConfig)"), describe(TrainConfig))
    if task_name is not None:
        try:
            task_cls = get_task(task_name)
        except UnknownTaskError:
            raise
        except Exception as e:  # noqa: BLE001 - an installed task's module runs any code
            parser.error(f"task {task_name!r} cannot be loaded: {type(e).__name__}: {e}")
        _add_fields(parser.add_argument_group(f"task {task_name!r} options"), task_cls.fields())
    return parser


class ProgressReporter:
    """Prints one line per evaluation (rank 0 only under DDP)."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled

    def report(self, metrics: Metrics, save_checkpoint: SaveCheckpoint) -> Decision:
        if self.enabled:
            keys = [k for k in metrics if k.startswith("val_")]
            parts = [f"step {metrics['step']:>6}", f"epoch {metrics['epoch']:6.2f}",
                     f"train_loss {metrics['train_loss']:.4f}"]
            parts += [f"{k} {metrics[k]:.4f}" for k in keys]
            parts += [f"lr {metrics['lr']:.2e}", f"grad_norm {metrics['grad_norm']:.3f}"]
            rate = metrics.get("tokens_per_s", metrics["samples_per_s"])
            unit = "tok/s" if "tokens_per_s" in metrics else "samples/s"
            parts.append(f"{rate:,.0f} {unit}" if math.isfinite(rate) else f"- {unit}")
            print(" | ".join(parts), flush=True)
        return Decision.CONTINUE


def _resume_arg(argv: list[str]) -> Path | None:
    """The value of ``--resume`` (needed before the full parser can be built)."""
    for i, arg in enumerate(argv):
        if arg == "--resume" and i + 1 < len(argv):
            return Path(argv[i + 1])
        if arg.startswith("--resume="):
            return Path(arg.split("=", 1)[1])
    return None


def _params_from_checkpoint(root: Path) -> tuple[str, dict[str, Any]]:
    """Task and parameters of the checkpoint to resume; new checkpoints go beside it.

    The checkpoint's own ``checkpoint_dir`` is replaced by the root being resumed,
    so that resuming a copy never writes into (and prunes) the original run.
    """
    is_checkpoint = (root / ckpt.META_FILE).is_file()
    found = [root] if is_checkpoint else [p for _, p in reversed(ckpt.list_checkpoints(root))]
    if not found:
        raise ConfigError("--resume", f"no checkpoint under {root}")
    first_error = None
    for checkpoint in found:  # the newest whose meta.json reads (a power loss tears it too)
        try:
            meta = json.loads((checkpoint / ckpt.META_FILE).read_text())
            task, params = meta["task"], {**meta["config"], **meta["options"]}
            break
        except (OSError, ValueError, KeyError, TypeError) as e:
            first_error = first_error or ConfigError(
                "--resume", f"unreadable checkpoint metadata in {checkpoint}: "
                            f"{type(e).__name__}: {e}")
    else:
        raise first_error
    params["checkpoint_dir"] = str(root.parent if is_checkpoint else root)
    return task, params


def _check_summary_path(path: Path) -> None:
    """Refuse a ``--summary-json`` path that cannot be written, before the training.

    Raises:
        ConfigError: its directory does not exist, or the path is a directory.
    """
    if not path.parent.is_dir():
        raise ConfigError("--summary-json", f"no such directory: {path.parent}")
    if path.is_dir():
        raise ConfigError("--summary-json", f"{path} is a directory; give a file path")


def _resume_hint(config: TrainConfig) -> str:
    """``; continue with --resume DIR`` where DIR holds a checkpoint to continue from, else
    nothing (interrupted before the first checkpoint: there is nothing to resume)."""
    root = config.checkpoint_dir
    return f"; continue with --resume {root}" if root and ckpt.latest_checkpoint(Path(root)) \
        else ""


def _summary(result: TrainResult, task: str, seconds: float) -> dict[str, Any]:
    return {"task": task, "stop_reason": result.stop_reason, "n_updates": result.n_updates,
            "best_metric": result.best_metric, "best_value": result.best_value,
            "best_step": result.best_step, "metrics": result.metrics,
            "checkpoint_dir": str(result.checkpoint_dir) if result.checkpoint_dir else None,
            "wall_time_s": seconds}


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["evaluate"]:  # a subcommand, not a task
        from trainers.evaluate import main as evaluate_main

        return evaluate_main(argv[1:])
    parser = build_parser(None)
    try:
        task_name = argv[0] if argv and not argv[0].startswith("-") else None
        resume, params = _resume_arg(argv), {}
        if resume is not None:
            saved_task, params = _params_from_checkpoint(resume)
            if task_name not in (None, saved_task):
                raise ConfigError("TASK",
                                  f"checkpoint is of task {saved_task!r}, not {task_name!r}")
            task_name = saved_task
        if task_name is None:
            parser.parse_args(argv)  # answers --help
            parser.error("the task is required (or --resume DIR)")
        parser = build_parser(task_name)
        args = parser.parse_args(argv)
        if args.task not in (None, task_name):  # a word after --resume DIR's flags
            raise ConfigError("TASK", f"unexpected argument {args.task!r}: the task comes "
                                      f"from the checkpoint ({task_name!r}); booleans are "
                                      f"--x or --no-x")
        if args.summary_json is not None:
            _check_summary_path(args.summary_json)
        reserved = {"task", "resume", "summary_json", "quiet"}
        params.update({k: v for k, v in vars(args).items() if k not in reserved})
        task, config = create(task_name, params)
    except UnknownTaskError as e:
        parser.error(str(e))
    except ConfigError as e:
        parser.error(f"{_option_name(e.field)}: {e.reason}")
    main_rank = init_distributed_from_env() == 0
    started = time.perf_counter()
    try:
        result = fit(task, config, ProgressReporter(main_rank and not args.quiet), args.resume)
    except KeyboardInterrupt:
        print(printable("interrupted" + _resume_hint(config)), file=sys.stderr)
        return 130
    except ConfigError as e:
        parser.error(f"{_option_name(e.field)}: {e.reason}")
    except CheckpointWriteError as e:
        print(printable(f"training failed: {e}" + _resume_hint(config)), file=sys.stderr)
        return 1
    except TrainersError as e:
        print(printable(f"training failed: {e}"), file=sys.stderr)
        return 1
    summary = _summary(result, task_name, time.perf_counter() - started)
    if main_rank:
        _print_summary(summary)
        if args.summary_json:
            try:
                args.summary_json.write_text(strict_json(summary, indent=1))
            except OSError as e:  # checked before training, but the disk may have changed
                print(printable(f"cannot write --summary-json {args.summary_json}: {e}"),
                      file=sys.stderr)
                return 1
    close_distributed()
    return 0


def _print_summary(s: dict[str, Any]) -> None:
    print(f"\n{s['task']}: {s['n_updates']} updates in {s['wall_time_s']:.1f} s, "
          f"stopped by {s['stop_reason']}")
    best = "n/a" if s["best_value"] is None else f"{s['best_value']:.4f}"
    print(f"best {s['best_metric']}: {best} (step {s['best_step']})")
    finals = {k: v for k, v in s["metrics"].items() if k.startswith(("val_", "train_loss"))}
    print("final: " + ", ".join(f"{k} {v:.4f}" for k, v in finals.items()))
    if s["checkpoint_dir"]:
        print(f"checkpoints: {s['checkpoint_dir']}")
