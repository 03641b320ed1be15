"""Constraints over REST (issue 18.2): a spec's constraints are checked at create, and each
trial shows its constraint values and feasibility; the best trial is the best feasible."""

from __future__ import annotations

from hpo.record import StudyRecord
from hpo.spec import parse_spec
from tests.service.conftest import bearer, record_summary, tiny_spec

MEMORY = [{"metric": "peak_memory_bytes", "max": 2.0e8}]


def test_trials_show_constraint_values_and_feasibility_and_best_is_feasible(client, app,
                                                                            tokens):
    data = tiny_spec("bounded", constraints=MEMORY)
    assert client.post("/v1/studies", json=data,
                       headers=bearer(tokens["alice"])).status_code == 201
    c = app.state.components
    record = StudyRecord(parse_spec(data), c.studies.storage, compare_spec=False)
    # trial 1 has the best accuracy but needed too much memory
    for i, (accuracy, memory) in enumerate([(0.90, 1.0e8), (0.99, 3.0e8), (0.95, 2.0e8)]):
        record.ask(f"r{i}")
        record.result(f"r{i}", {"step": 4, "planned_updates": 4, "val_accuracy": accuracy,
                                "peak_memory_bytes": memory})
        record.complete_or_prune(f"r{i}", "fifo")
    record_summary(app, "bounded")
    alice = bearer(tokens["alice"])
    trials = client.get("/v1/studies/bounded/trials", headers=alice).json()["items"]
    assert [(t["constraints"], t["feasible"]) for t in trials] == [
        ({"peak_memory_bytes.max": -1.0e8}, True), ({"peak_memory_bytes.max": 1.0e8}, False),
        ({"peak_memory_bytes.max": 0.0}, True)]
    assert [t["user_attrs"]["feasible"] for t in trials] == [True, False, True]
    study = client.get("/v1/studies/bounded", headers=alice).json()
    assert study["best_trial"]["number"] == 2
    one = client.get("/v1/studies/bounded/trials/1", headers=alice).json()
    assert one["feasible"] is False


def test_a_study_without_constraints_shows_none(client, app, tokens):
    assert client.post("/v1/studies", json=tiny_spec("plain"),
                       headers=bearer(tokens["alice"])).status_code == 201
    record = StudyRecord(parse_spec(tiny_spec("plain")), app.state.components.studies.storage,
                         compare_spec=False)
    record.ask("r0")
    record.result("r0", {"step": 4, "planned_updates": 4, "val_accuracy": 0.5})
    record.complete_or_prune("r0", "fifo")
    (trial,) = client.get("/v1/studies/plain/trials",
                          headers=bearer(tokens["alice"])).json()["items"]
    assert trial["constraints"] is None and trial["feasible"] is None
    assert "feasible" not in trial["user_attrs"]


def test_a_constraint_on_a_metric_nobody_reports_answers_422_naming_it(client, tokens):
    r = client.post("/v1/studies", json=tiny_spec("bad", constraints=[
        {"metric": "peak_memory", "max": 1.0}]), headers=bearer(tokens["alice"]))
    assert r.status_code == 422
    fields = {e["loc"]: e["msg"] for e in r.json()["error"]["details"]}
    assert fields["constraints.0.metric"].endswith(
        "not 'peak_memory' (did you mean 'peak_memory_bytes'?)")


def test_an_infeasible_trial_s_model_answer_says_why_and_no_feasible_means_no_best(
        client, app, tokens):
    data = tiny_spec("none-fit", constraints=MEMORY)
    assert client.post("/v1/studies", json=data,
                       headers=bearer(tokens["alice"])).status_code == 201
    record = StudyRecord(parse_spec(data), app.state.components.studies.storage,
                         compare_spec=False)
    record.ask("r0")
    record.result("r0", {"step": 4, "planned_updates": 4, "val_accuracy": 0.9,
                         "peak_memory_bytes": 5.0e8})
    record.complete_or_prune("r0", "fifo")
    record_summary(app, "none-fit")
    alice = bearer(tokens["alice"])
    r = client.get("/v1/studies/none-fit/trials/0/model", headers=alice)
    assert r.status_code == 404 and r.json()["error"]["message"] == (
        "trial 0 of study 'none-fit' has no kept model: it breaks the study's constraints, "
        "and an infeasible trial keeps none")
    r = client.get("/v1/studies/none-fit/model", headers=alice)
    assert r.status_code == 404 and r.json()["error"]["message"] == \
        "study 'none-fit' has no COMPLETE and feasible trial yet, so no model"
