"""How a task's code reaches the trials: shipped by Ray, not installed on every worker.

A built-in task (``trainers.tasks``) is part of ``trainers``, which every
worker node has. Any other task is installed only where the service (or
``hpo run``) runs: the driver ships the task's top-level module -- its package
directory, or its single ``.py`` file -- to every trial through Ray's runtime
environment (``py_modules``, uploaded once and cached per node by content
hash). A trial then loads the class by its ``module:Class`` target from what was
shipped (``trainers.load_task``), never from the worker's own entry points
(issue 12, point 3).

Limits (the README's "Your own task" says what to do then):

* only the top-level module travels: the task's other dependencies must be
  installed on the workers (or baked into their image);
* compiled extensions inside the package travel as files and load only where
  the worker's platform and Python match the service's; a top-level module that
  is itself compiled (``.so``) is not shipped at all;
* data files inside the package travel with it; files elsewhere do not;
* Ray refuses a package of 512 MiB or more (its gRPC message limit,
  ``RAY_max_grpc_message_size``); ``__pycache__`` is left out.

This module does not import Ray: it only says what to ship.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib.util
import logging
import tempfile
from pathlib import Path
from typing import Any

import trainers

log = logging.getLogger(__name__)

BUILTIN_PACKAGE = "trainers"
# gitignore-style patterns Ray leaves out of a shipped package
SHIP_EXCLUDES = ("__pycache__/", "*.pyc")


@dataclasses.dataclass(frozen=True)
class TaskCode:
    """Where a task's class is and what must travel to the trials for it.

    Attributes:
        name: the task's registered name.
        target: its ``"module:Class"``, from which a trial imports it.
        paths: what Ray ships: the top-level package's directories (several for
            a namespace package) or its single ``.py`` file; empty for a
            built-in task, or one whose top-level module cannot be shipped.
    """

    name: str
    target: str
    paths: tuple[str, ...] = ()

    def runtime_env(self) -> dict[str, Any] | None:
        """Ray's runtime environment that ships ``paths`` (``None``: nothing to ship)."""
        if not self.paths:
            return None
        return {"py_modules": list(self.paths), "excludes": list(SHIP_EXCLUDES)}


def task_code(name: str) -> TaskCode:
    """What the trials of task ``name`` need: its target, and the code to ship.

    Raises:
        UnknownTaskError: no task is registered under ``name``.
        ModuleNotFoundError: the task's top-level module is not importable here.
    """
    target = trainers.task_target(name)
    top = target.partition(":")[0].split(".")[0]
    if top == BUILTIN_PACKAGE:
        return TaskCode(name, target)
    return TaskCode(name, target, module_paths(top))


def module_paths(top: str) -> tuple[str, ...]:
    """The files that make up the top-level module ``top`` here: its package
    directories, or its ``.py`` file; empty (with a warning) for a compiled or
    built-in module, which Ray cannot ship.

    Raises:
        ModuleNotFoundError: ``top`` is not importable here.
    """
    spec = importlib.util.find_spec(top)
    if spec is None:
        raise ModuleNotFoundError(f"No module named {top!r}", name=top)
    if spec.submodule_search_locations:
        return tuple(_named(Path(p), top) for p in spec.submodule_search_locations)
    if spec.origin and spec.origin.endswith(".py"):
        return (_named(Path(spec.origin), f"{top}.py"),)
    log.warning("module %s (%s) cannot be shipped to the workers: install it on every worker",
                top, spec.origin)
    return ()


_links: Path | None = None  # this process's folder of links named after shipped modules


def _named(path: Path, name: str) -> str:
    """``path`` as Ray ships it under ``name``: Ray names a shipped directory or file after
    the path's last component (``packaging._zip_files``), so the path stays absolute with
    its links kept (a package reached through a symlink ``alias -> src_v2`` is ``alias``),
    and a module whose folder or file has another name (an editable install mapping the
    package to ``src/``) is shipped through a link named ``name`` in a folder of this
    process's own (helper-41: trials failed with ``No module named 'alias'``)."""
    global _links
    path = path.absolute()
    if path.name == name:
        return str(path)
    if _links is None:
        _links = Path(tempfile.mkdtemp(prefix="hpo-shipped-"))
    link = _links / hashlib.sha256(str(path.resolve()).encode()).hexdigest()[:16] / name
    if not link.is_symlink():
        # parents too: a temp cleaner may have removed the folder of a long-lived service
        link.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileExistsError):  # another thread made it meanwhile
            link.symlink_to(path.resolve())
    return str(link)
