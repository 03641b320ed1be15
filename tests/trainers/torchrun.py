"""Launch a test worker module under ``torchrun`` (2 ranks, gloo on CPU) and read what each
rank wrote: the one way the distributed tests start their ranks."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[2]
RANKS = 2


def torchrun(module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """``torchrun --standalone --nproc_per_node 2 -m MODULE ARGS`` from the repository root,
    one thread a rank; stdout and stderr captured. ``timeout`` in seconds: a hang fails."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
           str(RANKS), "-m", module, *args]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, timeout=timeout, capture_output=True,
                          text=True)


def rank_results(module: str, out: Path, *args: str, timeout: float = 240) -> list:
    """Run ``module OUT ARGS`` under :func:`torchrun`, which must succeed, and load each
    rank's ``OUT/rankR.pt``, by rank."""
    proc = torchrun(module, str(out), *args, timeout=timeout)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(RANKS)]
