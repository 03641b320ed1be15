"""PBT: Ray's PBT with the study's search space, mirrored into the Optuna study."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from hpo.errors import SpecError
from hpo.spec import load_spec, parse_spec
from hpo.tune.driver import pins_dir, run_study
from hpo.tune.pbt import clip_to_space

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.mark.usefixtures("ray_session")
def test_pbt_on_digits_exploits_records_lineage_and_reaches_97_percent(sqlite_url, tmp_path):
    spec = load_spec(EXAMPLES / "digits-pbt.yaml")
    out = run_study(spec, sqlite_url, results_dir=tmp_path)
    study = optuna.load_study(study_name=spec.name, storage=sqlite_url)
    trials = study.trials
    # every trial finished, none failed (with checkpoint retention num_to_keep=2: ray#9036)
    summary = [(t.number, t.state.name, t.value, t.user_attrs) for t in trials]
    assert len(trials) == 4 and all(t.state == TrialState.COMPLETE for t in trials), summary
    assert out.best_value >= 0.97, summary
    exploits = [e for t in trials for e in t.user_attrs.get("exploits", [])]
    assert exploits, summary
    numbers = {t.number for t in trials}
    lr, wd = spec.search_space["lr"], spec.search_space["weight_decay"]
    for e in exploits:
        assert e["donor_trial"] in numbers
        assert e["step"] % 23 == 0 and e["step"] > 0
        assert set(e["old"]) == set(e["new"]) == {"lr", "weight_decay"}
        assert lr.low <= e["new"]["lr"] <= lr.high
        assert wd.low <= e["new"]["weight_decay"] <= wd.high
    for t in trials:
        assert sorted(t.intermediate_values)[-1] == 230
        assert "fixed_params" in t.system_attrs  # PBT's own draws, never a sampler's
    assert not pins_dir(spec, tmp_path).exists()  # pinned donor checkpoints cleaned up


def test_perturbed_values_are_clipped_into_the_search_space():
    spec = parse_spec({"name": "clip", "task": "digits", "objective": {"metric": "val_loss"},
                       "budget": {"n_trials": 4},
                       "search_space": {
                           "lr": {"type": "float", "low": 1e-4, "high": 0.1, "log": True},
                           "width": {"type": "int", "low": 8, "high": 64, "step": 8},
                           "dropout": {"type": "float", "low": 0.0, "high": 0.5, "step": 0.1},
                           "optimizer": {"type": "categorical", "choices": ["adamw", "sgd"]}}})
    clip = clip_to_space(spec)
    assert clip({"lr": 0.12, "width": 70.4, "dropout": 0.23, "optimizer": "sgd"}) == {
        "lr": 0.1, "width": 64, "dropout": pytest.approx(0.2), "optimizer": "sgd"}
    assert clip({"lr": 1e-5, "width": 13, "dropout": -0.1})["width"] == 16


@pytest.mark.usefixtures("ray_session")
def test_pb2_runs_a_population_and_records_its_exploits(sqlite_url, tmp_path):
    data = load_spec(EXAMPLES / "digits-pbt.yaml").to_dict()
    data.update(name="digits-pb2", scheduler={"name": "pb2", "perturbation_interval": 46,
                                              "quantile_fraction": 0.5})
    data["config"]["max_epochs"] = 6
    spec = parse_spec(data)
    run_study(spec, sqlite_url, results_dir=tmp_path)
    trials = optuna.load_study(study_name=spec.name, storage=sqlite_url).trials
    summary = [(t.number, t.state.name, t.user_attrs) for t in trials]
    assert all(t.state == TrialState.COMPLETE for t in trials) and len(trials) == 4, summary
    exploits = [e for t in trials for e in t.user_attrs.get("exploits", [])]
    assert exploits, summary
    lr = spec.search_space["lr"]
    assert all(lr.low <= e["new"]["lr"] <= lr.high for e in exploits)


def test_pb2_refuses_categorical_parameters():
    data = load_spec(EXAMPLES / "digits-pbt.yaml").to_dict()
    data["scheduler"] = {"name": "pb2", "perturbation_interval": 46}
    data["search_space"]["precision"] = {"type": "categorical", "choices": ["fp32", "bf16"]}
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert info.value.errors[0]["loc"] == "search_space.precision.type"
