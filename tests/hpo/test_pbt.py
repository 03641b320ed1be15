"""PBT: Ray's PBT with the study's search space, mirrored into the Optuna study."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import numpy as np
import optuna
import pytest
from optuna.trial import TrialState

from hpo.errors import SpecError
from hpo.spec import load_spec, parse_spec
from hpo.tune.driver import pins_dir, run_study
from hpo.tune.pbt import build_pbt, clip_to_space, param_space

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
    # an epoch (23 updates) per perturbation: 5 points before the last report, where no
    # trial exploits any more (PinnedExploits), so that one happens whatever the order
    data.update(name="digits-pb2", scheduler={"name": "pb2", "perturbation_interval": 23,
                                              "quantile_fraction": 0.5})
    data["config"]["max_epochs"] = 6
    # a float step whose low is not a multiple of it (Ray's quniform refused it)
    data["search_space"]["dropout"] = {"type": "float", "low": 0.05, "high": 0.35, "step": 0.15}
    spec = parse_spec(data)
    run_study(spec, sqlite_url, results_dir=tmp_path)
    trials = optuna.load_study(study_name=spec.name, storage=sqlite_url).trials
    summary = [(t.number, t.state.name, t.params, t.user_attrs) for t in trials]
    assert all(t.state == TrialState.COMPLETE for t in trials) and len(trials) == 4, summary
    exploits = [e for t in trials for e in t.user_attrs.get("exploits", [])]
    assert exploits, summary
    lr = spec.search_space["lr"]
    assert all(lr.low <= e["new"]["lr"] <= lr.high for e in exploits)
    grid = {0.05, 0.2, 0.35}
    assert {t.params["dropout"] for t in trials} <= grid, summary
    assert {e["new"]["dropout"] for e in exploits} <= grid, summary


def test_pb2_refuses_categorical_parameters():
    data = load_spec(EXAMPLES / "digits-pbt.yaml").to_dict()
    data["scheduler"] = {"name": "pb2", "perturbation_interval": 46}
    data["search_space"]["precision"] = {"type": "categorical", "choices": ["fp32", "bf16"]}
    with pytest.raises(SpecError) as info:
        parse_spec(data)
    assert info.value.errors[0]["loc"] == "search_space.precision.type"


# -- search domains on the spec's grid (issue 11, point 5) --------------------------------

GRID_SPACE = {  # parameter -> its exact grid (None: continuous)
    "int_step": ({"type": "int", "low": 1, "high": 5, "step": 2}, {1, 3, 5}),
    "int_offset": ({"type": "int", "low": -7, "high": 14, "step": 3},
                   {-7, -4, -1, 2, 5, 8, 11, 14}),
    "int_plain": ({"type": "int", "low": -3, "high": 4}, set(range(-3, 5))),
    "int_log": ({"type": "int", "low": 1, "high": 20, "log": True}, set(range(1, 21))),
    "float_step": ({"type": "float", "low": 0.05, "high": 0.95, "step": 0.3},
                   {0.05, 0.35, 0.65, 0.95}),
    "float_fine": ({"type": "float", "low": -0.25, "high": 0.5, "step": 0.05},
                   {round(-0.25 + k * 0.05, 2) for k in range(16)}),
    "float_plain": ({"type": "float", "low": -2.0, "high": 3.0}, None),
    "float_log": ({"type": "float", "low": 1e-4, "high": 1.0, "log": True}, None),
    "choice": ({"type": "categorical", "choices": ["a", 2, 0.5, None]}, {"a", 2, 0.5, None}),
}


def _grid_spec(scheduler: str):
    space = {k: p for k, (p, _) in GRID_SPACE.items()
             if scheduler == "pbt" or p["type"] != "categorical"}
    return parse_spec({"name": "grid", "task": "digits", "objective": {"metric": "val_loss"},
                       "budget": {"n_trials": 4}, "search_space": space,
                       "scheduler": {"name": scheduler, "perturbation_interval": 5}},
                      check_task=False)


def _initial_samples(spec, n: int) -> list[dict]:
    from ray.tune.search.variant_generator import generate_variants

    space, rng = param_space(spec), np.random.default_rng(0)
    return [next(generate_variants(space, random_state=rng))[1] for _ in range(n)]


def _assert_on_grid(name: str, values: list) -> None:
    p, grid = GRID_SPACE[name]
    if grid is not None:  # every grid value reached, nothing else
        assert set(values) == grid, (name, sorted(set(values) - grid, key=str))
        if p["type"] != "categorical":
            assert all(type(v) is type(p["low"]) for v in values), name
        return
    assert all(type(v) is float and p["low"] <= v <= p["high"] for v in values), name


@pytest.mark.parametrize("scheduler", ["pbt", "pb2"])
def test_initial_population_is_drawn_from_every_point_of_the_grid_and_nothing_else(scheduler):
    spec = _grid_spec(scheduler)
    samples = _initial_samples(spec, 3000)
    for name in spec.search_space:
        _assert_on_grid(name, [s[name] for s in samples])
    # continuous parameters: uniform, or uniform in log space
    plain = np.array([s["float_plain"] for s in samples])
    assert 0.45 < np.mean(plain < 0.5) < 0.55 and plain.min() < -1.9 and plain.max() > 2.9
    log = np.array([s["float_log"] for s in samples])
    assert 0.45 < np.mean(log < 1e-2) < 0.55 and log.min() < 2e-4 and log.max() > 0.5


def test_pbt_mutations_stay_on_the_grid_and_reach_every_grid_point():
    import random

    spec = _grid_spec("pbt")
    pbt = build_pbt(spec, None, Path("unused"))
    random.seed(0)
    np.random.seed(0)
    mutated: dict[str, list] = {name: [] for name in spec.search_space}
    for config in _initial_samples(spec, 300):
        for _ in range(10):  # chains of perturbations and resamples
            config, _ = pbt._get_new_config(None, SimpleNamespace(config=config))
            for name, values in mutated.items():
                values.append(config[name])
    for name, values in mutated.items():
        _assert_on_grid(name, values)


def test_pb2_choices_are_mapped_to_the_nearest_grid_point():
    """PB2's GP picks any value in [low, high] (its bounded optimizer often stops on a
    bound), cast to the type of the trial's value, int() for ints
    (ray.tune.schedulers.pb2._explore); the explore function then puts it on the grid."""
    spec = _grid_spec("pb2")
    explore = build_pbt(spec, None, Path("unused"))._custom_explore_fn
    rng = np.random.default_rng(1)
    start = _initial_samples(spec, 1)[0]
    picked: dict[str, list] = {name: [] for name in spec.search_space}
    for _ in range(3000):
        gp = {name: type(start[name])(rng.choice([p.low, p.high, rng.uniform(p.low, p.high)],
                                                 p=[0.05, 0.05, 0.9]))
              for name, p in spec.search_space.items()}
        for name, value in explore(gp).items():
            picked[name].append(value)
    for name, values in picked.items():
        _assert_on_grid(name, values)
    assert explore({"int_step": 4, "float_step": 0.5, "int_offset": 100})["int_step"] in (3, 5)
    assert explore({"float_step": 0.5})["float_step"] == 0.65
    assert explore({"float_step": 0.49})["float_step"] == 0.35
    assert explore({"int_offset": 100, "int_log": -3})["int_offset"] == 14


class _Trial:  # hashable by identity, as Ray's Trial
    def __init__(self, trial_id):
        self.trial_id, self.config = trial_id, {}


def _exploiting(tmp_path):
    """A ``PinnedExploits`` over the part of Ray's PBT the seam uses, and the list of its
    exploits as ``(receiver, donor, the donor checkpoint's path)`` (a pin's path is
    ``pin-ID-N``, N counting the pins)."""
    from hpo.ray_private import PinnedExploits

    exploits, pins = [], []

    class Base:
        def __init__(self, time_attr, **kwargs):
            self._trial_state = {}

        def _exploit(self, tune_controller, trial, trial_to_clone):
            exploits.append((trial.trial_id, trial_to_clone.trial_id,
                             self._trial_state[trial_to_clone].last_checkpoint.path))

    class Scheduler(PinnedExploits, Base):
        def _pin(self, trial, state):
            pins.append(trial.trial_id)
            return SimpleNamespace(path=f"pin-{trial.trial_id}-{len(pins)}")

    return Scheduler(tmp_path, None, "step"), exploits


def test_a_trial_never_clones_the_same_donor_checkpoint_twice_in_a_row(tmp_path):
    """The breaker: while the donor restarted after a failure (``max_failures``), Ray's
    asynchronous PBT sent the receiver back to the donor's one remembered checkpoint at
    each of its perturbation points: 134 exploits, 123 of them of step 36."""
    pbt, exploits = _exploiting(tmp_path)
    donor, receiver = _Trial("d"), _Trial("r")
    for t in (donor, receiver):
        pbt._trial_state[t] = SimpleNamespace(last_checkpoint=None, last_result={"step": 36})

    pbt._checkpoint_or_exploit(donor, None, [donor], [receiver])  # the donor's checkpoint
    for _ in range(5):  # the donor stands still; the receiver reaches 5 perturbation points
        pbt._checkpoint_or_exploit(receiver, None, [donor], [receiver])
    assert exploits == [("r", "d", "pin-d-1")]
    pbt._checkpoint_or_exploit(donor, None, [donor], [receiver])  # the donor moved on
    pbt._checkpoint_or_exploit(receiver, None, [donor], [receiver])
    pbt._checkpoint_or_exploit(receiver, None, [donor], [receiver])
    assert exploits == [("r", "d", "pin-d-1"), ("r", "d", "pin-d-2")]


@pytest.mark.parametrize("last", [
    {"step": 12, "planned_updates": 12}, {"step": 13, "planned_updates": 12},
    {"step": 8, "planned_updates": 12, "stop_reason": "stopped itself (early stopping)"}],
    ids=["planned-updates", "past-them", "stopped-itself"])
def test_a_trial_does_not_exploit_at_its_last_report(tmp_path, last):
    """The breaker: exploited at its final report (step 12 of 12), a trial restarted from
    the donor's checkpoint with nothing left to train, reported the donor's evaluation
    again and ended COMPLETE with the donor's value. Before its last report it exploits."""
    pbt, exploits = _exploiting(tmp_path)
    donor, receiver = _Trial("d"), _Trial("r")
    pbt._trial_state[donor] = SimpleNamespace(last_checkpoint=None,
                                              last_result={"step": 9, "planned_updates": 12})
    pbt._trial_state[receiver] = SimpleNamespace(last_checkpoint=None, last_result=last)
    pbt._checkpoint_or_exploit(donor, None, [donor], [receiver])
    pbt._checkpoint_or_exploit(receiver, None, [donor], [receiver])
    assert [r for r, _, _ in exploits] == []
    pbt._trial_state[receiver].last_result = {"step": 8, "planned_updates": 12}
    pbt._checkpoint_or_exploit(receiver, None, [donor], [receiver])
    assert [r for r, _, _ in exploits] == ["r"]


@pytest.mark.parametrize("donor_last", [
    {"step": 12, "planned_updates": 12}, {"step": 10, "planned_updates": 16},
    {"step": 6, "planned_updates": 12, "stop_reason": "stopped itself (early stopping)"}],
    ids=["its-last-report", "past-the-receivers-plan", "stopped-itself"])
def test_a_trial_does_not_clone_a_checkpoint_that_leaves_it_nothing_to_train(tmp_path,
                                                                            donor_last):
    """The review: a donor's final checkpoint (or one at or past the receiver's planned
    updates) sent the receiver there with nothing left to train, the same end as an
    exploit at the receiver's own last report. Another top trial is cloned instead."""
    pbt, exploits = _exploiting(tmp_path)
    done, going, receiver = _Trial("done"), _Trial("going"), _Trial("r")
    for t, last in ((done, donor_last), (going, {"step": 6, "planned_updates": 12}),
                    (receiver, {"step": 8, "planned_updates": 10})):
        pbt._trial_state[t] = SimpleNamespace(last_checkpoint=None, last_result=last)
        pbt._checkpoint_or_exploit(t, None, [done, going], [])  # pinned
    for _ in range(8):  # whichever the random pick
        pbt._cloned.clear()
        pbt._checkpoint_or_exploit(receiver, None, [done], [receiver])
        pbt._checkpoint_or_exploit(receiver, None, [done, going], [receiver])
    assert [d for _, d, _ in exploits] == ["going"] * 8
