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
from tests.example_task import install_example_task

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.ray
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


def _cluster_env() -> dict[str, str]:
    # token auth, as `ray start` clusters use by default (DESIGN.md)
    return {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(16)}


@pytest.mark.ray
@pytest.mark.slow
def test_a_task_only_the_driver_has_is_shipped_to_a_node_without_it(tmp_path):
    site = install_example_task(tmp_path)  # on the driver's sys.path only (issue 12, point 3)
    proc = subprocess.run([sys.executable, "-m", "tests.hpo.shipped_task_study", str(tmp_path),
                           str(site)], cwd=REPO, env=_cluster_env(), capture_output=True,
                          text=True, timeout=600)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("REPORT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    report = json.loads(lines[-1][len("REPORT "):])
    # the package is nowhere a worker would find it by itself
    assert not report["site_on_pythonpath"] and not report["site_is_cwd"]
    assert {"tabular-mlp", "broken-import"} <= set(report["tasks"])
    assert report["unshipped_import"] == "ModuleNotFoundError: No module named 'tabular_mlp'"
    # shipped: every trial ran on the second node, and its record is the run's own
    shipped = report["shipped"]
    assert shipped["complete"] == 3 and shipped["failed"] == 0
    for trial in shipped["trials"]:
        assert trial["state"] == "COMPLETE" and trial["node_id"] == report["second_node"]
        assert set(trial["params"]) == {"lr", "dropout", "activation"}
        # every evaluation, bit for bit what the same trial trains to in the driver
        assert trial["curve"] == report["reference"][str(trial["number"])]
        assert [step for step, _ in trial["curve"]] == [4, 8, 12]
    # a module that imports on the driver but not on the worker: each trial FAILs with the
    # exception's line (no traceback), and the study still runs its whole budget
    broken = report["shipped-broken"]
    assert broken["complete"] == 0 and broken["failed"] == 2
    assert [t["fail_reason"] for t in broken["trials"]] == [
        "ModuleNotFoundError: No module named 'driver_only_helper'"] * 2


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
