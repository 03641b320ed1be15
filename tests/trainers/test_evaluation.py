"""Evaluation sharded over DDP ranks: a validation set smaller than the world size."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow  # torchrun with 2 ranks: about 8 s on 2 idle cores
def test_ddp_validation_set_smaller_than_world_size_is_evaluated_once(tmp_path):
    # 2 ranks, 1 validation sample: rank 1 has none of its own. Before, it summed no
    # statistics ({}) and the ranks' reductions disagreed (KeyError 'loss' on rank 1)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "tests.trainers.tinyval_worker", str(tmp_path)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, timeout=240, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    r0, r1 = (torch.load(tmp_path / f"rank{r}.pt", weights_only=False) for r in (0, 1))
    # the one sample counts once: its own squared error, exactly, on both ranks
    assert r0["val_loss"] == r1["val_loss"] == r0["expected"] == r1["expected"]
    # an empty validation set is refused on every rank alike
    assert r0["empty"] == r1["empty"] == "the validation set of task 'toy-regression' is empty"
