"""``hpo status`` of a study as the service answers it (the client's answer stubbed)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

import hpo.cli
from service.client import Client


def _study(constraints: list, complete: int, best: list) -> dict:
    return {"name": "s", "status": "COMPLETED", "progress": {"finished": complete},
            "n_trials": 2, "counts": {"complete": complete, "pruned": 0, "failed": 0,
                                      "running": 0},
            "device_seconds": 1.0, "stop_requested": False, "error": None,
            "spec": {"objective": {"metric": "val_accuracy"}, "constraints": constraints},
            "best_trials": best}


@pytest.mark.parametrize(("constraints", "complete", "best", "says"), [
    # the breaker: an all-infeasible study's status showed no best line and no reason
    ([{"metric": "peak_memory_bytes", "max": 1}], 2, [], True),
    ([{"metric": "peak_memory_bytes", "max": 1}], 0, [], False),  # none complete yet
    ([], 2, [{"number": 1, "values": [0.9], "params": {"lr": 0.1}}], False),
])
def test_status_says_why_a_study_with_constraints_has_no_best_trial(
        monkeypatch, constraints, complete, best, says):
    monkeypatch.setattr(Client, "study", lambda self, name: _study(constraints, complete, best))
    result = CliRunner().invoke(hpo.cli.app, ["status", "s"], env={"HPO_TOKEN": "hpo_x"})
    assert result.exit_code == 0, result.output
    output = " ".join(result.output.split())  # whatever the terminal's width wrapped
    assert ("best none: every complete trial breaks a constraint" in output) is says
    assert ("best trial #1: val_accuracy = 0.9" in output) is bool(best)
