"""Issue 15.4: bounds on costly options for non-admin tokens (service.bounds).

Each bound refuses a member's study with 422 naming the field, the limit and its variable,
and stores nothing; an admin's same study is created. The issue's own examples are
refused under the default settings. Timings are bench/spec_bounds.py's, never asserted
here: the 25 x 1000 categorical spec is shown to be refused before any per-value work.
"""

from __future__ import annotations

import pytest
import sqlalchemy as sa
import torch

import trainers
from service.app import create_app
from service.auth import create_token
from service.db import StudyRow
from service.errors import SettingsError
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec

MEMBER = "for a non-admin token"


@pytest.fixture
def settings(sqlite_url, tmp_path) -> Settings:
    """Tight bounds, so that an admin's study over them is still cheap to create."""
    return Settings(database_url=sqlite_url, results_dir=tmp_path / "results",
                    run_dispatcher=False, max_trials=5, max_concurrent_trials=2,
                    max_trial_workers=1, max_data_workers=1, max_micro_batch_size=128,
                    max_model_parameters=50_000, max_search_parameters=2,
                    max_search_choices=4)


def _spec(name: str, config: dict | None = None, space: dict | None = None, **changes) -> dict:
    """tiny_spec (digits, width 16: 5,082 parameters) with its config and space replaced."""
    spec = tiny_spec(name, **changes)
    spec["config"] = {"max_epochs": 1, "width": 16, **(config or {})}
    if space is not None:
        spec["search_space"] = space
        if "width" in space:
            del spec["config"]["width"]
    return spec


def _lr(n: int) -> dict:
    return {"type": "categorical", "choices": [0.001 * (i + 1) for i in range(n)]}


LR = {"type": "float", "low": 1e-3, "high": 0.1, "log": True}
CASES = {
    "n_trials": (_spec("b", n_trials=6),
                 "budget.n_trials", f"must be at most 5 {MEMBER} (HPO_MAX_TRIALS), got 6"),
    "max_concurrent_trials": (
        _spec("b", budget={"n_trials": 3, "max_concurrent_trials": 3}),
        "budget.max_concurrent_trials",
        f"must be at most 2 {MEMBER} (HPO_MAX_CONCURRENT_TRIALS), got 3"),
    "resources.workers": (
        _spec("b", resources={"workers": 2}), "resources.workers",
        f"must be at most 1 {MEMBER} (HPO_MAX_TRIAL_WORKERS), got 2"),
    "config.num_workers": (
        _spec("b", {"num_workers": 2}), "config.num_workers",
        f"must be at most 1 {MEMBER} (HPO_MAX_DATA_WORKERS), got 2"),
    "search_space.num_workers": (
        _spec("b", space={"num_workers": {"type": "categorical", "choices": [2, 0]}}),
        "search_space.num_workers.choices.0",
        f"must be at most 1 {MEMBER} (HPO_MAX_DATA_WORKERS), got 2"),
    "config.micro_batch_size": (
        _spec("b", {"micro_batch_size": 256}), "config.micro_batch_size",
        f"must be at most 128 {MEMBER} (HPO_MAX_MICRO_BATCH_SIZE), got 256"),
    "search_space.micro_batch_size": (
        _spec("b", space={"micro_batch_size": {"type": "int", "low": 32, "high": 256,
                                               "step": 32}}),
        "search_space.micro_batch_size.high",
        f"must be at most 128 {MEMBER} (HPO_MAX_MICRO_BATCH_SIZE), got 256"),
    "config.eval_batch_size": (
        _spec("b", {"eval_batch_size": 129}), "config.eval_batch_size",
        f"must be at most 128 {MEMBER} (HPO_MAX_MICRO_BATCH_SIZE), got 129"),
    "search parameters": (
        _spec("b", space={"lr": LR, "momentum": {"type": "float", "low": 0.5, "high": 0.9},
                          "weight_decay": {"type": "float", "low": 0.0, "high": 0.1}}),
        "search_space", f"3 parameters; at most 2 {MEMBER} (HPO_MAX_SEARCH_PARAMETERS)"),
    "search choices": (
        _spec("b", space={"lr": _lr(3), "optimizer": {"type": "categorical",
                                                      "choices": ["adamw", "sgd"]}}),
        "search_space", f"5 categorical choices in all; at most 4 {MEMBER} "
                        "(HPO_MAX_SEARCH_CHOICES)"),
    "model, config": (
        _spec("b", {"width": 128}), "config",
        f"the model has 169,610 parameters; at most 50,000 {MEMBER} "
        "(HPO_MAX_MODEL_PARAMETERS)"),
    "model, one parameter's range": (
        _spec("b", space={"width": {"type": "int", "low": 16, "high": 128, "step": 16}}),
        "search_space.width",
        f"the model has 169,610 parameters; at most 50,000 {MEMBER} "
        "(HPO_MAX_MODEL_PARAMETERS)"),
    # width 64 (47,946) and depth 3 (7,418) pass alone; together: 84,938
    "model, the largest point": (
        _spec("b", space={"width": {"type": "categorical", "choices": [16, 64]},
                          "depth": {"type": "int", "low": 2, "high": 3}}),
        "search_space",
        f"the model has 84,938 parameters; at most 50,000 {MEMBER} "
        "(HPO_MAX_MODEL_PARAMETERS)"),
}


def _names(app) -> list[str]:
    with app.state.components.sessions() as session:
        return list(session.execute(sa.select(StudyRow.name)).scalars())


@pytest.mark.parametrize("case", CASES)
def test_each_bound_refuses_a_member_names_field_and_limit_and_admits_an_admin(
        client, tokens, app, case):
    spec, loc, msg = CASES[case]
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["code"] == "invalid_spec"
    assert r.json()["error"]["details"] == [{"loc": loc, "msg": msg}]
    assert _names(app) == []
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["admin"]))
    assert r.status_code == 201, r.text
    assert _names(app) == ["b"]


def test_a_study_within_every_bound_is_created_for_a_member(client, tokens):
    spec = _spec("within", {"num_workers": 1, "micro_batch_size": 128},
                 space={"lr": _lr(2), "width": {"type": "categorical", "choices": [16, 32]}},
                 budget={"n_trials": 5, "max_concurrent_trials": 2}, resources={"workers": 1})
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["alice"]))
    assert r.status_code == 201, r.text


def test_every_bound_over_is_named_at_once(client, tokens):
    spec = _spec("many", {"num_workers": 2, "micro_batch_size": 129}, n_trials=6)
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["bob"]))
    assert r.status_code == 422
    assert [d["loc"] for d in r.json()["error"]["details"]] == [
        "budget.n_trials", "config.num_workers", "config.micro_batch_size"]


def test_the_25x1000_categorical_spec_is_refused_before_any_value_is_checked(
        client, tokens, monkeypatch):
    creates = []
    real = trainers.create
    monkeypatch.setattr(trainers, "create", lambda *a: creates.append(a) or real(*a))
    names = ["micro_batch_size", "grad_accum_steps", "max_epochs", "warmup_steps", "seed",
             "width", "split_seed", "keep_last_checkpoints", "eval_interval", "depth", "lr",
             "weight_decay", "momentum", "adam_beta1", "adam_beta2", "min_lr_ratio",
             "wsd_decay_fraction", "init_loss_scale", "max_grad_norm", "dropout",
             "val_fraction", "early_stopping_min_delta", "checkpoint_interval",
             "early_stopping_patience", "eval_batch_size"]
    space = {n: {"type": "categorical", "choices": list(range(1, 1001))} for n in names}
    spec = {**_spec("big"), "config": {}, "search_space": space}
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["alice"]))
    assert r.status_code == 422
    details = r.json()["error"]["details"]
    assert {"loc": "search_space", "msg": f"25 parameters; at most 2 {MEMBER} "
                                          "(HPO_MAX_SEARCH_PARAMETERS)"} in details
    assert {"loc": "search_space", "msg": f"25,000 categorical choices in all; at most 4 "
                                          f"{MEMBER} (HPO_MAX_SEARCH_CHOICES)"} in details
    assert creates == []  # refused on its structure: not one of 25,000 values was built
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["admin"]))
    assert r.status_code == 422  # answered: width and depth refuse most of their choices
    assert r.json()["error"]["details"][0]["loc"] == "search_space.width.choices.512"


# -- the issue's examples, under the default bounds ----------------------------------------


@pytest.fixture
def default_client(sqlite_url, tmp_path):
    app = create_app(Settings(database_url=sqlite_url, results_dir=tmp_path / "results",
                              run_dispatcher=False))
    with TestClient(app) as client:
        sessions = app.state.components.sessions
        yield client, {"member": create_token(sessions, "member"),
                       "admin": create_token(sessions, "admin", admin=True)}


CHARLM_48 = {"n_layer": 48, "d_model": 8192, "block_size": 4096, "n_head": 64}


@pytest.mark.parametrize(("config", "loc", "msg"), [
    ({"num_workers": 1_000_000}, "config.num_workers",
     f"must be at most 8 {MEMBER} (HPO_MAX_DATA_WORKERS), got 1000000"),
    ({"micro_batch_size": 1e12}, "config.micro_batch_size",
     f"must be at most 4,096 {MEMBER} (HPO_MAX_MICRO_BATCH_SIZE), got 1000000000000.0"),
    ({"micro_batch_size": 10**12}, "config.micro_batch_size",
     f"must be at most 4,096 {MEMBER} (HPO_MAX_MICRO_BATCH_SIZE), got 1000000000000"),
])
def test_the_issues_costly_options_are_refused_for_a_member(default_client, config, loc, msg):
    client, tokens = default_client
    r = client.post("/v1/studies", json=_spec("issue", config),
                    headers=bearer(tokens["member"]))
    assert r.status_code == 422
    assert r.json()["error"]["details"] == [{"loc": loc, "msg": msg}]


def test_the_48_layer_charlm_is_refused_for_a_member_without_building_it(
        default_client, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("the model was built")

    monkeypatch.setattr("trainers.tasks.charlm.CharGPT.__init__", no_model)
    client, tokens = default_client
    spec = {**tiny_spec("charlm-48"), "task": "charlm", "config": CHARLM_48,
            "objective": {"metric": "val_loss"}}
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["member"]))
    assert r.status_code == 422
    assert r.json()["error"]["details"] == [{"loc": "config", "msg": (
        f"the model has 38,695,485,440 parameters; at most 100,000,000 {MEMBER} "
        "(HPO_MAX_MODEL_PARAMETERS)")}]
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["admin"]))
    assert r.status_code == 201, r.text


def test_a_corner_the_task_refuses_does_not_hide_a_valid_large_model(default_client):
    """The largest d_model, n_layer and n_head together are no model (32 does not divide
    2000), but d_model 2000, n_layer 40, n_head 2 is one the sampler may draw: counted."""
    client, tokens = default_client
    space = {"d_model": {"type": "categorical", "choices": [64, 2000]},
             "n_layer": {"type": "int", "low": 1, "high": 40},
             "n_head": {"type": "categorical", "choices": [2, 32]}}
    spec = {**tiny_spec("corner"), "task": "charlm", "objective": {"metric": "val_loss"},
            "config": {"max_updates": 10, "micro_batch_size": 8, "block_size": 64},
            "search_space": space}
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["member"]))
    assert r.status_code == 422
    assert r.json()["error"]["details"] == [{"loc": "search_space", "msg": (
        f"the model has 1,921,684,000 parameters; at most 100,000,000 {MEMBER} "
        "(HPO_MAX_MODEL_PARAMETERS)")}]
    small = {**space, "d_model": {"type": "categorical", "choices": [64, 96]}}
    r = client.post("/v1/studies", json={**spec, "name": "corner-small", "search_space": small},
                    headers=bearer(tokens["member"]))
    assert r.status_code == 201, r.text


def test_an_admin_exceeds_the_default_bounds_up_to_hpos_own_limits(default_client):
    client, tokens = default_client
    spec = _spec("admin-big", {"num_workers": 16, "micro_batch_size": 8192},
                 budget={"n_trials": 2000, "max_concurrent_trials": 64})
    assert client.post("/v1/studies", json=spec,
                       headers=bearer(tokens["admin"])).status_code == 201
    r = client.post("/v1/studies", json=_spec("admin-huge", {"num_workers": 1_000_000}),
                    headers=bearer(tokens["admin"]))
    assert r.status_code == 422  # hpo's own limit on DataLoader processes holds for all
    assert r.json()["error"]["details"] == [{
        "loc": "config.num_workers",
        "msg": "must be at most 256 in absolute value, got 1000000"}]


# -- the counts and the settings -------------------------------------------------------------


@pytest.mark.parametrize("options", [{}, {"n_layer": 3, "d_model": 48, "n_head": 4,
                                          "block_size": 64}])
def test_charlms_formula_counts_what_its_model_holds(options):
    from trainers.tasks.charlm import COUNTED_VOCAB, CharGPT

    task, config = trainers.create("charlm", options)
    with torch.device("meta"):
        model = CharGPT(COUNTED_VOCAB, task.options, False)
    assert task.parameter_count(config) == sum(p.numel() for p in model.parameters())
    task.vocab_size = 100  # once the corpus is read, its own vocabulary
    assert task.parameter_count(config) == (sum(p.numel() for p in model.parameters())
                                            - (COUNTED_VOCAB - 100) * task.options.d_model)


def test_the_default_count_builds_on_the_meta_device_what_training_builds():
    task, config = trainers.create("digits", {"width": 48, "depth": 3, "batch_norm": False})
    model = task.build_model(config)
    assert task.parameter_count(config) == sum(p.numel() for p in model.parameters()) == 49_738


def test_a_bound_out_of_range_names_its_variable():
    with pytest.raises(SettingsError, match=r"^HPO_MAX_DATA_WORKERS must be in \[0, 256\], "
                                            r"got -1$"):
        Settings.from_env({"HPO_MAX_DATA_WORKERS": "-1"})
    assert Settings.from_env({"HPO_MAX_MODEL_PARAMETERS": "1000"}).max_model_parameters == 1000
