"""The shipped examples, run for real on the local Ray (2 CPUs)."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo.spec import load_spec
from hpo.tune.driver import run_study

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
pytestmark = pytest.mark.usefixtures("ray_session")


def _run(name: str, url: str, tmp_path: Path):
    spec = load_spec(EXAMPLES / name)
    out = run_study(spec, url, results_dir=tmp_path / "ray")
    return spec, out, optuna.load_study(study_name=spec.name, storage=url).trials


def test_digits_tpe_asha_acceptance(sqlite_url, tmp_path):
    spec, out, trials = _run("digits-tpe-asha.yaml", sqlite_url, tmp_path)
    assert len(trials) == 24 and out.counts.finished == 24 and out.counts.failed == 0
    assert out.best_value >= 0.97
    assert out.counts.pruned >= 8  # at least a third
    for t in trials:  # every trial readable with its curve
        assert t.intermediate_values, t.number
        steps = sorted(t.intermediate_values)
        assert steps == list(range(23, steps[-1] + 1, 23))  # one value per epoch evaluation
        if t.state == TrialState.COMPLETE:
            assert steps[-1] == 276


def test_charlm_small_budget(sqlite_url, tmp_path):
    _, out, trials = _run("charlm-small.yaml", sqlite_url, tmp_path)
    assert out.counts.finished == 4 and out.counts.failed == 0
    assert out.best_value < 4.25  # bits per character; the stdlib's unigram entropy is 4.54
    assert all(t.user_attrs["samples"] > 0 for t in trials)


@pytest.mark.slow
def test_two_ddp_workers_per_trial(sqlite_url, tmp_path):
    _, out, trials = _run("digits-ddp.yaml", sqlite_url, tmp_path)
    assert out.counts.complete == 2, [t.user_attrs for t in trials]
    for t in trials:
        assert sorted(t.intermediate_values) == [23, 46]  # 1437 samples / 2 ranks / 32
        assert t.value > 0.8
