"""The example task package (``examples/tasks/tabular_mlp``), installed for one test only.

``pip install --target`` into a directory of the test (never into the shared
virtual environment), from a copy of the sources, so that pip's build files stay
out of the repository. Only a process that puts that directory on its path (or on
``PYTHONPATH``) can import the task.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "tasks" / "tabular_mlp"
TASK_NAME = "tabular-mlp"


def install_example_task(workdir: Path) -> Path:
    """Install the example package into ``workdir/site``; that directory."""
    source, site = workdir / "example-src", workdir / "site"
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns(
        "build", "*.egg-info", "__pycache__"))
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps",
                    "--no-build-isolation", "--no-index", "--target", str(site), str(source)],
                   check=True, timeout=300)
    return site
