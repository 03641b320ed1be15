"""The example task package, installed where only the service runs, tuned through the service.

``examples/tasks/tabular_mlp`` is installed with ``pip --target`` into a directory on
the server's ``PYTHONPATH`` only: the shared Ray head's workers cannot import it, so
its trials run on code that the study's driver (the warm driver, which joined Ray
before it knew its study) ships through Ray's runtime environment (issue 12, points 3
and 4).
"""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest
import yaml

from hpo.spec import load_spec
from tests.example_task import EXAMPLE, REPO, TASK_NAME, install_example_task
from tests.service.conftest import bearer, wait_for
from tests.service.test_e2e import _admin_token, _ended, _warm_driver

UPDATES_PER_TRIAL = 4


def _small_study(name: str) -> dict:
    """The example's own study, shrunk to 2 trials of 4 updates."""
    spec = yaml.safe_load((EXAMPLE / "study.yaml").read_text())
    spec["name"] = name
    spec["config"].update(max_epochs=None, max_updates=UPDATES_PER_TRIAL, eval_interval=2)
    spec["scheduler"] = {"name": "fifo"}
    spec["budget"] = {"n_trials": 2, "max_concurrent_trials": 2}
    return spec


def test_the_example_task_installed_beside_the_service_is_tuned_end_to_end(
        server_process, sqlite_url, tmp_path):
    site = install_example_task(tmp_path)
    pythonpath = os.pathsep.join(p for p in [str(site), os.environ.get("PYTHONPATH")] if p)
    server = server_process(sqlite_url, PYTHONPATH=pythonpath)
    token = _admin_token(sqlite_url)
    server.start()
    h = bearer(token)
    tasks = httpx.get(f"{server.url}/v1/tasks", headers=h, timeout=30).json()["tasks"]
    listed = {t["name"]: t for t in tasks}
    assert TASK_NAME in listed, tasks
    assert set(listed[TASK_NAME]["metrics"]) == {"val_loss", "val_accuracy", "val_macro_f1"}
    wait_for(lambda: _warm_driver(server) == "ready", what="the warm driver to be ready")

    r = httpx.post(f"{server.url}/v1/studies", json=_small_study("example-e2e"), headers=h,
                   timeout=60)
    assert r.status_code == 201, r.text
    study = wait_for(lambda: _ended(server, token, "example-e2e"), what="the study to end")
    assert study["status"] == "COMPLETED", study["error"]
    assert study["counts"]["complete"] == 2 and study["counts"]["failed"] == 0
    trials = httpx.get(f"{server.url}/v1/studies/example-e2e/trials?intermediate=true",
                       headers=h, timeout=30).json()["items"]
    assert [t["state"] for t in trials] == ["COMPLETE", "COMPLETE"]
    for trial in trials:
        assert set(trial["params"]) == set(_small_study("x")["search_space"])
        assert sorted(int(s) for s in trial["intermediate_values"]) == [2, 4]
    # the finished study in the dashboard: its page's data, every trial with its curve
    study_id = study["dashboard_url"].rstrip("/").rsplit("/", 1)[-1]
    detail = httpx.get(f"{server.url}/api/studies/{study_id}/", headers=h, timeout=30).json()
    assert detail["name"] == "example-e2e" and len(detail["trials"]) == 2
    assert all(len(t["intermediate_values"]) == 2 for t in detail["trials"])


def test_the_example_study_spec_is_valid_for_the_example_task(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(install_example_task(tmp_path)))
    spec = load_spec(EXAMPLE / "study.yaml")
    assert spec.task == TASK_NAME and spec.objectives[0].metric == "val_loss"


@pytest.mark.slow  # 9 s here (2 idle cores)
def test_the_example_package_passes_its_own_tests_and_the_task_contract(tmp_path):
    site = install_example_task(tmp_path)  # its tests import the installed package
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(EXAMPLE / "tests")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert "4 passed" in proc.stdout
