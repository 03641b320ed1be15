"""Several nodes: trials run where their resources are, and survive losing a node."""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from hpo.workers import WorkerOptionError, ray_start_command

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.slow
def test_trials_run_on_the_node_with_their_resource_and_survive_its_loss(tmp_path):
    # token auth, as `ray start` clusters use by default (DESIGN.md)
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}
    proc = subprocess.run([sys.executable, "-m", "tests.hpo.two_node_study", str(tmp_path)],
                          cwd=REPO, env=env, capture_output=True, text=True, timeout=420)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    report = json.loads(lines[-1][len("REPORT "):])
    trials = {t["number"]: t for t in report["trials"]}
    assert report["complete"] == 3 and all(t["state"] == "COMPLETE" for t in trials.values())
    assert trials[0]["node_id"] == report["first_node"]  # ran on the node with `special`
    hit = trials[report["interrupted_trial"]]
    assert hit["restarts"] >= 1
    assert hit["node_id"] == report["second_node"]  # retried on the replacement node
    assert hit["steps"] == list(range(3, 31, 3))  # its curve went on, nothing duplicated


def test_worker_command_wraps_ray_start():
    command = ray_start_command("10.0.0.5:6379", num_gpus=2, resources='{"a100": 1}')
    assert command[0].endswith("/ray") and command[1:] == [
        "start", "--address=10.0.0.5:6379", "--num-gpus=2", '--resources={"a100": 1}']
    assert ray_start_command("10.0.0.5")[2] == "--address=10.0.0.5:6379"
    for address in ["host:99999", "a b:1", "h:"]:
        with pytest.raises(WorkerOptionError) as info:
            ray_start_command(address)
        assert info.value.flag == "--address"
    with pytest.raises(WorkerOptionError) as info:
        ray_start_command("h:1", resources='{"x": -1}')
    assert info.value.flag == "--resources"


def test_hpo_worker_cli_dry_run_and_bad_flags():
    ok = subprocess.run([sys.executable, "-m", "hpo", "worker", "--address", "h:6379",
                         "--num-cpus", "4", "--dry-run"], cwd=REPO, capture_output=True,
                        text=True, timeout=60)
    assert ok.returncode == 0 and "start --address=h:6379 --num-cpus=4" in ok.stdout
    bad = subprocess.run([sys.executable, "-m", "hpo", "worker", "--address", "h:x", "--dry-run"],
                         cwd=REPO, capture_output=True, text=True, timeout=60)
    assert bad.returncode == 2 and "--address" in bad.stderr
