"""``hpo task new NAME DIR``: an installable task package to start from (issue 12, point 1).

The package holds a ``pyproject.toml`` registering the task in the entry-point
group ``hpo.trainers``, a task module (a small MLP on synthetic data drawn from
a seed, ``loss_sum`` as a sum, evaluation sums and metrics, documented options,
every part to replace marked ``# REPLACE:``), a pytest test that trains it for
a few updates and holds it to the task contract, and a short README. It passes
``hpo task check NAME`` unchanged once installed (``pip install DIR``).
"""

from __future__ import annotations

import importlib.util
import keyword
import re
import shutil
from pathlib import Path

# a letter, then letters, digits and single separators each followed by a letter or digit:
# a PEP 508 distribution name pip accepts as written (no trailing or doubled - or _, which
# pip refuses or normalizes away), an entry-point name, and with - -> _ a Python identifier
NAME_PATTERN = re.compile(r"^[a-z](?:[a-z0-9]|[-_](?=[a-z0-9])){0,39}$")
NAME_RULE = ("1-40 characters of a-z, 0-9, _ and -, starting with a letter and ending with a "
             "letter or digit, with no two of _ and - in a row")


class ScaffoldError(ValueError):
    """A name or directory ``hpo task new`` refuses; ``argument`` is ``NAME`` or ``DIR``."""

    def __init__(self, argument: str, message: str) -> None:
        super().__init__(f"{argument}: {message}")
        self.argument = argument


def module_name(name: str) -> str:
    """The Python package of task ``name`` (hyphens become underscores)."""
    return name.replace("-", "_")


# top-level directories of the scaffolded project besides its package: a package of that
# name would hold them (the scaffold's tests shipped inside the package) or be overwritten
PROJECT_DIRS = {"tests": "tests", "build": "build output (setuptools)",
                "dist": "built distributions"}


def class_name(name: str) -> str:
    """The task class of ``name``: ``my-task`` -> ``MyTaskTask``."""
    return "".join(part.capitalize() for part in re.split(r"[-_]", name) if part) + "Task"


# modules Python's site module imports at start-up if found (helper-41): a task package of
# that name would run in every interpreter of the environment it is installed in
SITE_HOOKS = frozenset({"sitecustomize", "usercustomize"})


def check_name(name: str, installed: list[str]) -> None:
    """Refuse a task name that cannot name a task, a package and an entry point.

    Raises:
        ScaffoldError: not 1-40 characters of ``a-z 0-9 _ -`` starting with a
            letter, ending with a letter or digit, without two separators in a row
            (:data:`NAME_RULE`; what pip accepts as a distribution name, PEP 508),
            a Python keyword, a directory of the project itself
            (:data:`PROJECT_DIRS`), a task already registered (``installed``),
            a module already importable here (it would be shadowed or shadow), or a
            module Python's ``site`` imports at start-up (:data:`SITE_HOOKS`).
    """
    if not NAME_PATTERN.match(name):
        raise ScaffoldError("NAME", f"{name!r} must be {NAME_RULE} (it names the task, its "
                                    "entry point, its pip distribution and, with - as _, its "
                                    "Python package)")
    module = module_name(name)
    if keyword.iskeyword(module):
        raise ScaffoldError("NAME", f"{name!r} is a Python keyword: it cannot name a package")
    if module in PROJECT_DIRS:
        raise ScaffoldError("NAME", f"{name!r} would name the package directory {module}/, "
                                    f"which the project keeps for its "
                                    f"{PROJECT_DIRS[module]}; choose another name")
    if name in installed:
        raise ScaffoldError("NAME", f"a task named {name!r} is already registered; choose "
                                    "another name")
    if module in SITE_HOOKS:
        raise ScaffoldError("NAME", f"{name!r} would name the package {module}, which Python "
                                    f"imports at every start of an interpreter that has it "
                                    f"on its path (the site module); choose another name")
    if importlib.util.find_spec(module) is not None:
        raise ScaffoldError("NAME", f"a module named {module!r} is already importable here; "
                                    "choose another name")


def render(name: str) -> dict[str, str]:
    """The package's files, relative path -> text."""
    module, cls = module_name(name), class_name(name)
    values = {"name": name, "module": module, "cls": cls}
    return {
        "pyproject.toml": _PYPROJECT.format(**values),
        "README.md": _README.format(**values),
        f"{module}/__init__.py": f'"""The {name} task (see task.py)."""\n',
        f"{module}/task.py": _TASK.replace("{name}", name).replace("{cls}", cls),
        "tests/test_task.py": _TEST.replace("{module}", module).replace("{cls}", cls),
    }


def scaffold(name: str, directory: Path, installed: list[str]) -> list[Path]:
    """Write the package of task ``name`` into ``directory`` (created if missing).

    Returns:
        The files written.

    Raises:
        ScaffoldError: a bad name (see :func:`check_name`), ``directory`` is a
            file or a non-empty directory (nothing is overwritten), or it cannot
            be created or written (any ``OSError``: what was written is removed).
    """
    check_name(name, installed)
    try:
        if directory.exists() and not directory.is_dir():
            raise ScaffoldError("DIR", f"{directory} is a file, not a directory")
        if directory.is_dir() and any(directory.iterdir()):
            raise ScaffoldError("DIR", f"{directory} is not empty; give a new or empty "
                                       "directory")
    except OSError as e:
        raise ScaffoldError("DIR", f"cannot read {directory}: {e.strerror or e}") from None
    # the highest directory this call creates, removed if a write fails
    created = next((p for p in reversed((directory, *directory.parents)) if not p.exists()),
                   None)
    written: list[Path] = []
    try:
        for relative, text in render(name).items():
            path = directory / relative
            _make_dir(path.parent)
            path.write_text(text)
            written.append(path)
    except OSError as e:
        _remove(created, directory)
        verb = "create" if isinstance(e, _MakeDirError) else "write"
        where = e.filename if e.filename is not None else directory
        raise ScaffoldError("DIR", f"cannot {verb} {where}: {e.strerror or e}") from None
    return written


class _MakeDirError(OSError):
    """An ``OSError`` of ``mkdir`` (said 'cannot create', not 'cannot write')."""


def _make_dir(path: Path) -> None:
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise _MakeDirError(e.errno, e.strerror, e.filename) from e


def _remove(created: Path | None, directory: Path) -> None:
    """Remove what a failed :func:`scaffold` wrote: the directories it created, or the
    contents of ``directory`` if it was there (and empty) before."""
    if created is not None:
        shutil.rmtree(created, ignore_errors=True)
        return
    for child in directory.iterdir() if directory.is_dir() else ():
        if child.is_dir() and not child.is_symlink():
            shutil.rmtree(child, ignore_errors=True)
        else:
            child.unlink(missing_ok=True)


_PYPROJECT = """\
[build-system]
requires = ["setuptools>=68"]
build-backend = "setuptools.build_meta"

[project]
name = "{name}"
version = "0.1.0"
description = "The {name} training task for the hpo service"  # REPLACE: say what it learns
requires-python = ">=3.11"
# torch and trainers come from the hpo service's environment; add your own dependencies
dependencies = []

# `hpo` finds the task through this entry point: GET /v1/tasks lists it, a study names it
[project.entry-points."hpo.trainers"]
{name} = "{module}.task:{cls}"

[tool.setuptools]
packages = ["{module}"]
"""

_README = """\
# {name}

A training task for the hpo service, made by `hpo task new`. It trains a small
MLP on synthetic data; replace every part marked `# REPLACE:` in
`{module}/task.py` with your own model, data and metrics.

    pip install .              # into the environment of the hpo service
    hpo task check {name}      # the task contract: losses are sums, resume is exact, ...
    python -m pytest tests     # a few updates of real training, and the contract

A study then names the task (`task: {name}`) and searches its options (see
`GET /v1/tasks`). Keep `loss_sum` a *sum* over the items of a micro-batch: the
loop averages over the whole accumulation group itself.
"""

_TASK = '''\
"""``{name}``: a small MLP classifying synthetic points (a template to replace).

# REPLACE: say what the task learns, from which data, and what its metrics mean.
Data: ``n_classes`` Gaussian clusters in ``n_features`` dimensions, drawn from
``data_seed`` (no download). Metrics: ``val_loss`` (mean cross entropy, nats)
and ``val_accuracy`` (fraction correct).

Shapes: B batch, F features, K classes; x_BF float32, y_B int64 in [0, K).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset
from trainers import Task, TrainConfig
from trainers.fields import option, require


@dataclasses.dataclass(frozen=True, kw_only=True)
class Options:
    """The task's own hyperparameters: a study may fix or search each of them.

    Every help text gives the unit and the valid range; ``hpo task check``
    builds the task at each closed bound it documents (``(1..256)``, ``>= 0``).
    """

    # REPLACE: your own options (keep one documented field each, and __post_init__'s checks)
    n_samples: int = option(512, "training samples of the synthetic data (16..4096)")
    n_features: int = option(16, "input features (1..256)")
    n_classes: int = option(4, "classes (2..32)")
    hidden: int = option(64, "hidden units of the MLP (1..1024)")
    dropout: float = option(0.1, "dropout before the output layer, in [0, 1)")
    data_seed: int = option(0, "seed of the synthetic data, the same for every "
                                  "trial (0..4294967295)")

    def __post_init__(self) -> None:
        require(16 <= self.n_samples <= 4096, "n_samples",
                f"must be in 16..4096, got {self.n_samples}")
        require(1 <= self.n_features <= 256, "n_features",
                f"must be in 1..256, got {self.n_features}")
        require(2 <= self.n_classes <= 32, "n_classes",
                f"must be in 2..32, got {self.n_classes}")
        require(1 <= self.hidden <= 1024, "hidden", f"must be in 1..1024, got {self.hidden}")
        require(0 <= self.dropout < 1, "dropout", f"must be in [0, 1), got {self.dropout}")
        require(0 <= self.data_seed <= 2**32 - 1, "data_seed",
                f"must be in 0..4294967295, got {self.data_seed}")


class PointsDataset(Dataset):
    """A map-style dataset: item ``i`` is ``(x_F, y)``.

    # REPLACE: your data. Keep it map-style (``len`` and ``__getitem__``); read
    # files in ``__init__`` or lazily in ``__getitem__``, never at import time.
    """

    def __init__(self, x_NF: torch.Tensor, y_N: torch.Tensor) -> None:
        self.x_NF, self.y_N = x_NF, y_N

    def __len__(self) -> int:
        return len(self.y_N)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.x_NF[i], self.y_N[i]


def synthetic_points(o: Options, n: int, generator: torch.Generator) -> PointsDataset:
    """``n`` points around ``o.n_classes`` centers drawn from ``generator``, close enough
    that the classes overlap: no model reaches a loss of 0, so trials rank apart."""
    centers_KF = 0.6 * torch.randn(o.n_classes, o.n_features, generator=torch.Generator()
                                   .manual_seed(o.data_seed))
    y_N = torch.randint(0, o.n_classes, (n,), generator=generator)
    x_NF = centers_KF[y_N] + torch.randn(n, o.n_features, generator=generator)
    return PointsDataset(x_NF, y_N)


class MLP(nn.Module):
    """# REPLACE: your model. Logits (B, K) of inputs (B, F)."""

    def __init__(self, o: Options) -> None:
        super().__init__()
        self.hidden = nn.Sequential(nn.Linear(o.n_features, o.hidden), nn.ReLU())
        self.dropout = nn.Dropout(o.dropout)
        self.out = nn.Linear(o.hidden, o.n_classes)

    def forward(self, x_BF: torch.Tensor) -> torch.Tensor:
        return self.out(self.dropout(self.hidden(x_BF)))


class {cls}(Task):
    """# REPLACE: one line on the task."""

    name = "{name}"
    Options = Options
    # every metric eval_metrics returns, with its direction; objective: the default one
    metrics: Mapping[str, str] = {"val_loss": "minimize", "val_accuracy": "maximize"}
    objective = "val_accuracy"
    # options PBT may change while a trial trains: they must change no parameter shape
    mutable_options = frozenset({"dropout"})
    # REPLACE: TrainConfig values with which your task trains well
    default_config: Mapping[str, object] = {
        "micro_batch_size": 32, "lr": 3e-3, "max_epochs": 10, "warmup_steps": 10,
        "schedule": "cosine"}

    def datasets(self, seed: int) -> tuple[Dataset, Dataset]:
        # the data comes from data_seed, not from the run's seed: trials with different
        # training seeds are compared on the same validation set
        generator = torch.Generator().manual_seed(self.options.data_seed)
        n_val = max(16, self.options.n_samples // 4)
        return (synthetic_points(self.options, self.options.n_samples, generator),
                synthetic_points(self.options, n_val, generator))

    def build_model(self, config: TrainConfig) -> nn.Module:
        return MLP(self.options)  # the loop seeds torch's RNG before calling

    def loss_sum(self, model: nn.Module, batch) -> torch.Tensor:
        # REPLACE: your loss, a SUM over the micro-batch: the loop divides by the items
        # of the whole accumulation group. For token losses: reduction="none", times the mask of
        # real tokens, summed (and n_items counting those tokens).
        x_BF, y_B = batch
        return F.cross_entropy(model(x_BF).float(), y_B, reduction="sum")

    def eval_sums(self, model: nn.Module, batch) -> dict[str, torch.Tensor]:
        # REPLACE: additive statistics of one validation batch (summed over batches)
        x_BF, y_B = batch
        logits_BK = model(x_BF).float()
        return {"loss": F.cross_entropy(logits_BK, y_B, reduction="sum"),
                "correct": (logits_BK.argmax(1) == y_B).sum(),
                "n": torch.tensor(y_B.numel())}

    def eval_metrics(self, sums: Mapping[str, float]) -> dict[str, float]:
        # REPLACE: the metrics from the statistics of the whole validation set
        return {"val_loss": sums["loss"] / sums["n"], "val_accuracy": sums["correct"] / sums["n"]}
'''

_TEST = '''\
"""A few updates of real training, and the task contract (`hpo task check`)."""

from trainers import ListReporter, TrainConfig, fit
from trainers.contract import check_task

from {module}.task import {cls}


def test_a_few_updates_train_and_report_every_metric():
    config = TrainConfig(**{**{cls}.default_config, "max_updates": 20, "max_epochs": None,
                            "eval_interval": 10, "device": "cpu"})
    reporter = ListReporter()
    result = fit({cls}(), config, reporter)
    assert result.n_updates == 20
    assert [r["step"] for r in reporter.reports] == [10, 20]
    assert set({cls}.metrics) <= set(result.metrics)
    assert reporter.reports[-1]["train_loss"] < reporter.reports[0]["train_loss"]


def test_the_task_keeps_the_contract():
    failed = [r.line() for r in check_task({cls}) if not r.ok]
    assert failed == []
'''
