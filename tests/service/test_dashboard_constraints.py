"""The dashboard's study answer of a study with constraints (issue 18.2, the breaker's
finding): each trial's constraint values, and the best trial or Pareto front of the
feasible trials only, as REST and the CLI show them. optuna-dashboard 0.21 read neither
(Optuna 5 keeps constraints as ``constraints:KEY`` attributes) and showed an infeasible
trial as the best."""

from __future__ import annotations

import json
import math

import pytest

from hpo.record import StudyRecord
from hpo.spec import parse_spec
from tests.service.conftest import bearer, record_summary, tiny_spec

MEMORY = [{"metric": "peak_memory_bytes", "max": 2.0e8}]


def _run(app, data: dict, results: list[dict]) -> int:
    """Trials of study ``data`` (created already) reporting ``results``, each COMPLETE;
    the Optuna study's id."""
    storage = app.state.components.studies.storage
    record = StudyRecord(parse_spec(data), storage, compare_spec=False)
    for i, result in enumerate(results):
        record.ask(f"r{i}")
        record.result(f"r{i}", {"step": 4, "planned_updates": 4, **result})
        record.complete_or_prune(f"r{i}", "fifo")
    record_summary(app, data["name"])
    return storage.get_study_id_from_name(data["name"])


def _dashboard(client, token: str, study_id: int, after: int = 0) -> dict:
    r = client.get(f"/api/studies/{study_id}?after={after}", headers=bearer(token))
    assert r.status_code == 200, r.text
    return json.loads(r.text)


@pytest.mark.parametrize("who", ["alice", "admin"])
@pytest.mark.parametrize("after", [0, 2, 3])  # 3: the best trial is not among them
def test_the_best_trial_is_the_best_feasible_one_and_each_trial_shows_its_constraints(
        client, app, tokens, who, after):
    data = tiny_spec("bounded", constraints=MEMORY)
    assert client.post("/v1/studies", json=data,
                       headers=bearer(tokens["alice"])).status_code == 201
    # trial 1 has the best accuracy but needed too much memory; trial 3 never said
    sid = _run(app, data, [
        {"val_accuracy": 0.90, "peak_memory_bytes": 1.0e8},
        {"val_accuracy": 0.99, "peak_memory_bytes": 3.0e8},
        {"val_accuracy": 0.95, "peak_memory_bytes": 2.0e8},
        {"val_accuracy": 0.999}])
    answer = _dashboard(client, tokens[who], sid, after)
    rest = client.get("/v1/studies/bounded", headers=bearer(tokens[who])).json()
    assert [t["number"] for t in answer["best_trials"]] == [rest["best_trial"]["number"]] \
        == [2]
    assert answer["best_trials"][0]["constraints"] == [0.0]
    violations = {0: [-1.0e8], 1: [1.0e8], 2: [0.0], 3: [math.inf]}
    assert {t["number"]: t["constraints"] for t in answer["trials"]} == {
        n: c for n, c in violations.items() if n >= after}
    # the trial with no value is written as JSON allows: 1e999, a browser's Infinity
    r = client.get(f"/api/studies/{sid}", headers=bearer(tokens[who]))
    assert '"constraints": [1e999]' in r.text and "Infinity" not in r.text
    if who == "alice":  # a non-admin's answer still leaves out the server path
        assert all(a["key"] != "checkpoint" for t in answer["best_trials"]
                   for a in t["user_attrs"])


def test_no_feasible_trial_means_no_best_trial(client, app, tokens):
    data = tiny_spec("none-fit", constraints=MEMORY)
    assert client.post("/v1/studies", json=data,
                       headers=bearer(tokens["alice"])).status_code == 201
    sid = _run(app, data, [{"val_accuracy": 0.9, "peak_memory_bytes": 5.0e8}])
    answer = _dashboard(client, tokens["alice"], sid)
    assert answer["best_trials"] == []
    assert [t["constraints"] for t in answer["trials"]] == [[3.0e8]]


def test_the_pareto_front_holds_only_feasible_trials(client, app, tokens):
    data = tiny_spec("front", constraints=MEMORY, objective=[
        {"metric": "val_accuracy"}, {"metric": "val_loss", "direction": "minimize"}])
    assert client.post("/v1/studies", json=data,
                       headers=bearer(tokens["alice"])).status_code == 201
    # 1 dominates 0 but is infeasible: the feasible front is 0 and 2
    sid = _run(app, data, [
        {"val_accuracy": 0.90, "val_loss": 0.3, "peak_memory_bytes": 1.0e8},
        {"val_accuracy": 0.95, "val_loss": 0.2, "peak_memory_bytes": 3.0e8},
        {"val_accuracy": 0.80, "val_loss": 0.1, "peak_memory_bytes": 1.0e8},
        {"val_accuracy": 0.70, "val_loss": 0.5, "peak_memory_bytes": 1.0e8}])
    answer = _dashboard(client, tokens["alice"], sid)
    rest = client.get("/v1/studies/front", headers=bearer(tokens["alice"])).json()
    assert sorted(t["number"] for t in answer["best_trials"]) == sorted(
        t["number"] for t in rest["best_trials"]) == [0, 2]


def test_a_study_without_constraints_is_answered_as_optuna_dashboard_answers(
        client, app, tokens):
    data = tiny_spec("plain")
    assert client.post("/v1/studies", json=data,
                       headers=bearer(tokens["alice"])).status_code == 201
    sid = _run(app, data, [{"val_accuracy": 0.5}, {"val_accuracy": 0.7}])
    answer = _dashboard(client, tokens["admin"], sid)
    assert [t["number"] for t in answer["best_trials"]] == [1]
    assert [t["constraints"] for t in answer["trials"]] == [[], []]
