"""``hpo task new NAME DIR`` and ``hpo task check TARGET`` (issue 12, points 1-2).

    hpo task new NAME DIR     scaffold an installable task package (hpo.scaffold)
    hpo task check TARGET     hold a task to the task contract (trainers.contract)

Exit status: 0 done (every rule passed); 1 a rule failed or was skipped; 2 a
bad argument (the message names it).
"""

from __future__ import annotations

import contextlib
import os
import shlex
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.markup import escape

from hpo.scaffold import NAME_RULE

task_app = typer.Typer(help="Bring your own task: scaffold a task package, check a task.",
                       no_args_is_help=True)
# one line, however long DIR is; no markup or emoji codes read in it (hpo.cli)
err = Console(stderr=True, soft_wrap=True, markup=False, emoji=False)
out = Console(soft_wrap=True, highlight=False, markup=False, emoji=False)


@task_app.command("new")
def new(
    name: Annotated[str, typer.Argument(
        metavar="NAME", help=f"task name: {NAME_RULE}")],
    directory: Annotated[Path, typer.Argument(
        metavar="DIR", help="where to write the package (new or empty)")],
) -> None:
    """Scaffold an installable task package in a new or empty DIR.

    It writes pyproject.toml (the entry point), a task with '# REPLACE:' parts, a test, a README.

    Exit 2: a bad NAME or DIR.
    """
    import trainers
    from hpo.scaffold import ScaffoldError, scaffold

    try:
        written = scaffold(name, directory, trainers.list_tasks())
    except ScaffoldError as e:
        err.print(f"[bold red]error:[/] {escape(str(e))}", highlight=False, markup=True)
        raise typer.Exit(2) from None
    for path in written:
        out.print(f"wrote {path}", markup=False)
    # a bare relative name would be looked up on PyPI by pip: give it as a path
    target = str(directory) if directory.is_absolute() else os.path.join(".", directory)
    out.print(f"next: {_tool('pip')} install {shlex.quote(target)} && {_tool('hpo')} task "
              f"check {name}", markup=False)


def _tool(name: str) -> str:
    """``name`` as this environment has it (``.venv/bin/pip``, relative to the working
    directory where it lies below it), or the bare name where it has none: a bare ``pip``
    may be another Python's (the new-user walkthrough's finding)."""
    path = Path(sys.executable).parent / name
    if not path.exists():
        return name
    with contextlib.suppress(ValueError):
        path = path.relative_to(Path.cwd())
    return shlex.quote(str(path))


@task_app.command("check")
def check(
    target: Annotated[str, typer.Argument(
        metavar="TARGET", help="an installed task's name, or module:Class importable from "
                               "the current directory")],
) -> None:
    """Hold a task to the task contract (losses are sums, resume is exact, ...) on the CPU.

    One line per rule: PASS, FAIL naming the method and the fix, or SKIP when a rule it
    needs failed. Exit 1 on any failure.
    """
    from trainers.contract import check_target

    results = []
    for result in check_target(target):
        results.append(result)
        out.print(result.line(), markup=False)
    n_failed = sum(not r.ok for r in results)
    if n_failed:
        out.print(f"{n_failed} of {len(results)} rules did not pass", markup=False)
        raise typer.Exit(1)
    out.print(f"all {len(results)} rules passed", markup=False)
