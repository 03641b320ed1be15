"""trainers stands alone: importing and using it loads neither Ray, Optuna nor FastAPI."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_importing_trainers_loads_no_ray_optuna_or_fastapi():
    code = (
        "import sys, trainers\n"
        "task, config = trainers.create('digits', {'max_updates': 1, 'max_epochs': None})\n"
        "trainers.fit(task, config)\n"
        "loaded = [m for m in ('ray', 'optuna', 'fastapi', 'starlette', 'sqlalchemy')"
        " if m in sys.modules]\n"
        "assert not loaded, loaded\n"
        "print('ok')\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_import_linter_contracts_hold():
    lint = Path(sys.executable).parent / "lint-imports"
    proc = subprocess.run([str(lint)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-2000:]
    assert "0 broken" in proc.stdout
