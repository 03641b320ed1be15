"""How a process ends (``trainers.distributed.exit_rank``): a rank of a launch leaves without
the interpreter's finalization, where PyTorch's native threads can abort it after its work
is done (pytorch/pytorch#117762); a single process exits as usual."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# Output left in the buffers (a pipe is block-buffered), a log record, and an atexit
# handler that stands for the finalization: it runs for a single process only.
PROBE = """
import atexit, logging, sys
from trainers.distributed import exit_rank
logging.basicConfig(filename=sys.argv[1], level=logging.INFO)
atexit.register(lambda: print("finalized", flush=True))
print("done", end="")
sys.stderr and sys.stderr.write("warned")  # None where >&- closed it
logging.getLogger("probe").info("logged")
exit_rank(int(sys.argv[2]))
"""


def _env(world_size: str | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WORLD_SIZE"}
    if world_size is not None:
        env["WORLD_SIZE"] = world_size
    return env


@pytest.mark.parametrize(("world_size", "finalized"), [
    ("2", False), ("1", True), (None, True), ("abc", True), ("", True)])
@pytest.mark.parametrize("status", [0, 1, 3])
def test_a_rank_leaves_without_finalization_and_keeps_its_output(tmp_path, world_size,
                                                                 finalized, status):
    log = tmp_path / "run.log"
    proc = subprocess.run([sys.executable, "-c", PROBE, str(log), str(status)], cwd=REPO,
                          env=_env(world_size), capture_output=True, text=True, timeout=60)
    assert proc.returncode == status
    assert proc.stdout == "done" + ("finalized\n" if finalized else "")
    assert proc.stderr == "warned"
    assert log.read_text() == "INFO:probe:logged\n"


@pytest.mark.parametrize("closed", ["stdout", "stderr"])
def test_a_rank_whose_output_was_closed_at_start_keeps_its_status(tmp_path, closed):
    """``>&-``: Python starts with ``sys.stdout`` (or ``sys.stderr``) None."""
    fd = {"stdout": 1, "stderr": 2}[closed]
    cmd = f'exec {fd}>&- ; exec "$0" -c "$1" "$2" 3'
    proc = subprocess.run(["bash", "-c", cmd, sys.executable, PROBE, str(tmp_path / "run.log")],
                          cwd=REPO, env=_env("2"), capture_output=True, text=True, timeout=60)
    assert proc.returncode == 3
    assert (tmp_path / "run.log").read_text() == "INFO:probe:logged\n"


@pytest.mark.parametrize(("args", "status", "says"), [
    (["--help"], 0, "usage: trainers"),
    (["digits", "--lr", "fast"], 2, "--lr: invalid float value"),
    (["no-such-task"], 2, "no-such-task"),
])
def test_the_cli_of_a_rank_keeps_its_exit_status_and_message(args, status, says):
    """argparse ends by SystemExit (help, a bad flag) before any process group exists; the
    rank's status and message are those of a single process."""
    proc = subprocess.run([sys.executable, "-m", "trainers", *args], cwd=REPO,
                          env=_env("2"), capture_output=True, text=True, timeout=120)
    assert proc.returncode == status
    assert says in proc.stdout + proc.stderr


@pytest.mark.slow  # a torchrun of two ranks: about 8 s on 2 idle cores
def test_a_torchrun_of_the_cli_ends_every_rank_with_0_and_keeps_rank_0s_output(tmp_path):
    summary = tmp_path / "summary.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           "-m", "trainers", "digits", "--max-updates", "4", "--eval-interval", "2",
           "--summary-json", str(summary)]
    env = {**_env(None), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # stdout is a pipe (block-buffered): what rank 0 printed last is there, once
    assert proc.stdout.count("digits: 4 updates in ") == 1
    assert json.loads(summary.read_text())["n_updates"] == 4
