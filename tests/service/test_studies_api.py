"""``/v1/studies`` through TestClient: create, validation, conflicts, reads, stop, delete."""

from __future__ import annotations

import json
import math

import optuna
import pytest
import sqlalchemy as sa
import yaml
from fastapi.testclient import TestClient

from service.app import create_app
from service.auth import create_token
from service.db import Status, StudyRow
from service.settings import Settings
from tests.hpo.test_spec import INVALID
from tests.service.conftest import bearer, record_summary, tiny_spec


def _stored(app) -> tuple[list[str], list[str]]:
    """Names in the service's table and in Optuna's storage."""
    c = app.state.components
    with c.sessions() as session:
        rows = session.execute(sa.select(StudyRow.name)).scalars().all()
    return sorted(rows), sorted(s.study_name for s in c.studies.storage.get_all_studies())


def test_create_answers_201_with_the_queued_study_and_creates_the_optuna_study(client, tokens,
                                                                             app):
    r = client.post("/v1/studies", json=tiny_spec("s1"), headers=bearer(tokens["alice"]))
    assert r.status_code == 201, r.text
    body = r.json()
    assert body["status"] == "QUEUED" and body["owner"] == "alice"
    assert body["progress"] == {"finished": 0, "n_trials": 3, "fraction": 0.0}
    assert body["spec"]["objective"] == {"metric": "val_accuracy", "direction": "maximize"}
    assert r.headers["location"] == "/v1/studies/s1"
    assert _stored(app) == (["s1"], ["s1"])
    study = optuna.load_study(study_name="s1", storage=app.state.components.studies.storage)
    assert study.user_attrs["hpo_spec"] == body["spec"]


def test_create_accepts_yaml_with_its_content_type(client, tokens):
    text = yaml.safe_dump(tiny_spec("from-yaml"))
    r = client.post("/v1/studies", content=text, headers={
        **bearer(tokens["alice"]), "Content-Type": "application/yaml"})
    assert r.status_code == 201, r.text
    assert r.json()["name"] == "from-yaml"


def test_existing_name_answers_409_and_keeps_the_first(client, tokens, app):
    assert client.post("/v1/studies", json=tiny_spec("dup"),
                       headers=bearer(tokens["alice"])).status_code == 201
    r = client.post("/v1/studies", json=tiny_spec("dup", n_trials=9),
                    headers=bearer(tokens["bob"]))
    assert r.status_code == 409
    assert r.json()["error"]["code"] == "conflict"
    assert client.get("/v1/studies/dup", headers=bearer(tokens["alice"])).json()["n_trials"] == 3


@pytest.mark.parametrize("second", ["BOB-S1", "Bob-s1", "bob-S1"])
def test_a_name_that_differs_only_in_case_answers_409_and_keeps_the_first(client, tokens, app,
                                                                          second):
    """A breaker: beside bob's ``bob-s1``, alice could make ``BOB-S1``; on a
    case-insensitive file system both studies' result files are one folder, so her trials
    would write into his and deleting her study would delete his files."""
    assert client.post("/v1/studies", json=tiny_spec("bob-s1"),
                       headers=bearer(tokens["bob"])).status_code == 201
    r = client.post("/v1/studies", json=tiny_spec(second), headers=bearer(tokens["alice"]))
    assert r.status_code == 409, r.text
    assert r.json()["error"]["message"] == (
        "a study named 'bob-s1' exists already; study names must differ by more than case "
        "(the two would share one result folder on a case-insensitive file system)")
    assert _stored(app) == (["bob-s1"], ["bob-s1"])
    assert client.post("/v1/studies", json=tiny_spec("bob-s2"),  # another name still goes
                       headers=bearer(tokens["alice"])).status_code == 201


def test_the_database_refuses_two_names_that_differ_only_in_case(app):
    """The unique index on lower(name) (migration 0008) settles two concurrent creates that
    the service's own check lets through together."""
    from service.db import StudyRow

    with app.state.components.sessions() as session:
        session.add(StudyRow(name="same", status="QUEUED", spec={}, n_trials=1))
        session.commit()
        session.add(StudyRow(name="SAME", status="QUEUED", spec={}, n_trials=1))
        with pytest.raises(sa.exc.IntegrityError):
            session.commit()


def test_name_of_an_optuna_study_made_outside_the_service_answers_409_and_keeps_it(
        client, tokens, app):
    optuna.create_study(study_name="outside", storage=app.state.components.studies.storage)
    r = client.post("/v1/studies", json=tiny_spec("outside"), headers=bearer(tokens["alice"]))
    assert r.status_code == 409
    assert _stored(app) == ([], ["outside"])


@pytest.mark.parametrize("body", [b"{not json", b'{"name": "x",}', b"\xff\xfe", b""])
def test_malformed_json_answers_400_and_stores_nothing(client, tokens, app, body):
    r = client.post("/v1/studies", content=body, headers={
        **bearer(tokens["alice"]), "Content-Type": "application/json"})
    assert r.status_code == 400
    assert r.json()["error"]["code"] == "malformed_body"
    assert _stored(app) == ([], [])


def test_malformed_yaml_answers_400(client, tokens):
    r = client.post("/v1/studies", content="name: [unclosed\n", headers={
        **bearer(tokens["alice"]), "Content-Type": "application/yaml"})
    assert r.status_code == 400 and "YAML" in r.json()["error"]["message"]


_DEEP = "[" * 100_000 + "]" * 100_000
_ALIAS_BOMB = "name: bomb\nconfig:\n  lr: [&a [x, x, x, x, x, x, x, x, x], [*a, *a, *a]]\n"


@pytest.mark.parametrize("media, body, why", [
    ("application/json", _DEEP, "nested too deeply"),
    ("application/yaml", _DEEP, "nested too deeply"),
    ("application/json", '{"budget": {"n_trials": ' + "9" * 5000 + "}}", "4300"),
    ("application/json", '{"name": "a", "name": "b"}', "duplicate key 'name'"),
    ("application/yaml", "name: a\nname: b\n", "duplicate key 'name'"),
    ("application/yaml", _ALIAS_BOMB, "aliases (*a) are not supported"),
    # a list or mapping as a key (the breaker: a TypeError before PyYAML's own check, 500)
    ("application/yaml", "{[1]: 2}", "unhashable key"),
    ("application/yaml", "name: a\nconfig:\n  ? {lr: 1}\n  : x\n", "unhashable key"),
], ids=["deep-json", "deep-yaml", "huge-int", "duplicate-json", "duplicate-yaml", "alias",
        "list-key", "mapping-key"])
def test_bodies_that_would_exhaust_or_mislead_the_parser_answer_400(client, tokens, app, media,
                                                                      body, why):
    r = client.post("/v1/studies", content=body, headers={
        **bearer(tokens["alice"]), "Content-Type": media})
    assert r.status_code == 400, r.text
    assert why in r.json()["error"]["message"] and len(r.text) < 2000
    assert _stored(app) == ([], [])


def test_media_types_are_case_insensitive(client, tokens):
    r = client.post("/v1/studies", json=tiny_spec("cased"), headers={
        **bearer(tokens["alice"]), "Content-Type": "Application/JSON; charset=UTF-8"})
    assert r.status_code == 201, r.text


def test_path_options_are_for_admins_only(client, tokens, app):
    # charlm's corpus and cache_dir read and write the training machine's files
    spec = {**tiny_spec("paths"), "task": "charlm", "config": {"corpus": "/etc/hostname"},
            "search_space": {"cache_dir": {"type": "categorical", "choices": ["/tmp/x"]}},
            "objective": {"metric": "val_loss"}}
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["error"]["details"]] == [
        "config.corpus", "search_space.cache_dir"]
    assert _stored(app) == ([], [])


@pytest.mark.parametrize("path", ["/v1/studies/s/trials/9223372036854775808",
                                  "/v1/studies?offset=99999999999999999999",
                                  "/v1/studies/s/trials?offset=99999999999999999999"])
def test_out_of_range_numbers_in_the_address_answer_422(client, tokens, path):
    client.post("/v1/studies", json=tiny_spec("s"), headers=bearer(tokens["alice"]))
    r = client.get(path, headers=bearer(tokens["alice"]))
    assert r.status_code == 422, r.text


def test_unknown_api_path_answers_404_in_the_error_shape(client, tokens):
    r = client.get("/v1/studies/a%2Fb/trials/1/x", headers=bearer(tokens["alice"]))
    assert r.status_code == 404 and r.json()["error"]["code"] == "not_found", r.text


@pytest.mark.parametrize("body", [[1, 2], "a string", 3, None])
def test_json_that_is_not_an_object_answers_422(client, tokens, body):
    r = client.post("/v1/studies", content=json.dumps(body), headers={
        **bearer(tokens["alice"]), "Content-Type": "application/json"})
    assert r.status_code == 422
    assert r.json()["error"]["details"][0]["loc"] == ""


@pytest.mark.parametrize("case", sorted(INVALID))
def test_every_invalid_spec_kind_answers_422_naming_the_field_and_stores_nothing(
        client, tokens, app, case):
    data, loc = INVALID[case]
    body = json.dumps(data)  # Python's JSON: NaN cases travel as the NaN literal
    r = client.post("/v1/studies", content=body, headers={
        **bearer(tokens["alice"]), "Content-Type": "application/json"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_spec"
    assert loc in [d["loc"] for d in error["details"]], error
    assert all(d["msg"] for d in error["details"])
    assert _stored(app) == ([], [])


def test_a_failure_while_creating_the_optuna_study_leaves_nothing_stored(client, tokens, app,
                                                                          monkeypatch):
    import service.studies

    real_insert_study = service.studies.insert_study

    def broken_insert_study(conn, name, *rows):  # SQLite: in the CREATING row's transaction
        real_insert_study(conn, name, *rows)
        raise RuntimeError("disk full")

    monkeypatch.setattr(service.studies, "insert_study", broken_insert_study)
    with TestClient(app, raise_server_exceptions=False) as c:
        r = c.post("/v1/studies", json=tiny_spec("half"), headers=bearer(tokens["alice"]))
    assert r.status_code == 500
    assert r.json()["error"] == {"code": "internal", "message": "internal error", "details": []}
    assert _stored(app) == ([], [])


def test_unsupported_content_type_answers_415(client, tokens):
    r = client.post("/v1/studies", content="x", headers={
        **bearer(tokens["alice"]), "Content-Type": "text/plain"})
    assert r.status_code == 415
    assert r.json()["error"]["code"] == "unsupported_media_type"


def test_body_over_the_limit_answers_413_declared_or_chunked(client, tokens, settings):
    big = b"x" * (settings.max_body_bytes + 1)
    r = client.post("/v1/studies", content=big, headers=bearer(tokens["alice"]))
    assert r.status_code == 413 and r.json()["error"]["code"] == "body_too_large"

    def chunks():
        for _ in range(settings.max_body_bytes // 4096 + 2):
            yield b"y" * 4096

    r = client.post("/v1/studies", content=chunks(), headers=bearer(tokens["alice"]))
    assert r.status_code == 413


def _with_trials(app, name: str, values: list[float | None]) -> None:
    """Finish trials of ``name`` directly in Optuna: a float COMPLETE, None PRUNED."""
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name=name, storage=storage)
    for value in values:
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
        trial.report(0.5, 10)
        trial.report(float("nan") if value is None else value, 20)
        trial.set_user_attr("device_seconds", 2.5)
        if value is None:
            study.tell(trial, state=optuna.trial.TrialState.PRUNED)
        else:
            study.tell(trial, value)
    record_summary(app, name)


def test_study_view_has_counts_best_trial_progress_and_device_seconds(client, tokens, app):
    client.post("/v1/studies", json=tiny_spec("v", n_trials=4), headers=bearer(tokens["alice"]))
    _with_trials(app, "v", [0.9, 0.95, None])
    body = client.get("/v1/studies/v", headers=bearer(tokens["alice"])).json()
    assert body["counts"] == {"complete": 2, "pruned": 1, "failed": 0, "running": 0,
                              "waiting": 0, "requeued": 0}
    assert body["progress"] == {"finished": 3, "n_trials": 4, "fraction": 0.75}
    assert body["best_trial"]["number"] == 1 and body["best_trial"]["value"] == 0.95
    assert body["device_seconds"] == 7.5
    assert body["dashboard_url"].startswith("/dashboard/studies/")


def test_trials_are_paginated_with_intermediate_values_on_request(client, tokens, app):
    client.post("/v1/studies", json=tiny_spec("p", n_trials=9), headers=bearer(tokens["alice"]))
    _with_trials(app, "p", [0.1 * i for i in range(1, 6)] + [None])
    h = bearer(tokens["alice"])
    page = client.get("/v1/studies/p/trials?offset=2&limit=3", headers=h).json()
    assert page["total"] == 6 and page["offset"] == 2 and page["limit"] == 3
    assert [t["number"] for t in page["items"]] == [2, 3, 4]
    assert page["items"][0]["intermediate_values"] is None
    page = client.get("/v1/studies/p/trials?offset=5&intermediate=true", headers=h).json()
    (pruned,) = page["items"]
    assert pruned["state"] == "PRUNED"
    assert pruned["intermediate_values"] == {"10": 0.5, "20": "NaN"}  # JSON has no NaN
    one = client.get("/v1/studies/p/trials/1", headers=h).json()
    assert one["number"] == 1 and math.isclose(one["value"], 0.2)
    assert one["intermediate_values"] == {"10": 0.5, "20": one["value"]}
    assert client.get("/v1/studies/p/trials/99", headers=h).status_code == 404
    assert client.get("/v1/studies/p/trials?limit=0", headers=h).status_code == 422


def test_list_filters_by_status_and_paginates_newest_first(client, tokens):
    h = bearer(tokens["alice"])
    for i in range(5):
        client.post("/v1/studies", json=tiny_spec(f"l{i}"), headers=h)
    client.post("/v1/studies/l1/stop", headers=h)
    page = client.get("/v1/studies?limit=2", headers=h).json()
    assert page["total"] == 5 and [s["name"] for s in page["items"]] == ["l4", "l3"]
    page = client.get("/v1/studies?status=STOPPED", headers=h).json()
    assert [s["name"] for s in page["items"]] == ["l1"]
    bad = client.get("/v1/studies?status=NOPE", headers=h)
    assert bad.status_code == 422 and bad.json()["error"]["details"][0]["loc"] == "query.status"


@pytest.mark.parametrize("internal", ["CREATING", "DELETING"])
def test_list_refuses_the_internal_statuses_and_names_only_the_visible_ones(client, tokens,
                                                                           internal):
    """Found by the breaker: ``?status=DELETING`` was accepted and its 422 listed them."""
    bad = client.get(f"/v1/studies?status={internal}", headers=bearer(tokens["alice"]))
    problem = bad.json()["error"]["details"][0]
    assert bad.status_code == 422 and problem["loc"] == "query.status"
    assert "'QUEUED', 'RUNNING', 'COMPLETED', 'STOPPED' or 'FAILED'" in problem["msg"]
    assert "CREATING" not in problem["msg"] and "DELETING" not in problem["msg"]


def test_stop_of_a_queued_study_ends_it_stopped_and_of_an_ended_one_answers_409(client, tokens):
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("q"), headers=h)
    r = client.post("/v1/studies/q/stop", headers=h)
    assert r.status_code == 202 and r.json()["status"] == "STOPPED"
    assert r.json()["ended_at"] is not None
    r = client.post("/v1/studies/q/stop", headers=h)
    assert r.status_code == 409 and "STOPPED" in r.json()["error"]["message"]


def test_stop_of_a_running_study_asks_its_driver(client, tokens, app):
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("r"), headers=h)
    _set_status(app, "r", Status.RUNNING)
    r = client.post("/v1/studies/r/stop", headers=h)
    assert r.status_code == 202
    assert r.json()["status"] == "RUNNING" and r.json()["stop_requested"] is True


def test_stop_in_one_update_changes_only_what_each_status_asks(db_url, tmp_path):
    """A queued study waiting for its quota ends STOPPED, no longer waiting; a running one
    keeps its status, its wait and no end until its driver ends it (SQLite and PostgreSQL)."""
    app = create_app(Settings(database_url=db_url, results_dir=tmp_path / "results",
                              run_dispatcher=False))
    with TestClient(app) as client:
        _stop_both(app, client, bearer(create_token(app.state.components.sessions, "alice")))


def _stop_both(app, client, h) -> None:
    for name in ("wq", "wr"):
        client.post("/v1/studies", json=tiny_spec(name), headers=h)
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).values(waiting_for="quota max_gpus"))
    _set_status(app, "wr", Status.RUNNING)
    queued = client.post("/v1/studies/wq/stop", headers=h).json()
    running = client.post("/v1/studies/wr/stop", headers=h).json()
    with app.state.components.sessions() as session:
        rows = {r.name: r for r in session.execute(sa.select(StudyRow)).scalars()}
    assert (rows["wq"].status, rows["wq"].stop_requested, rows["wq"].waiting_for) == \
        (Status.STOPPED, True, None)
    assert rows["wq"].ended_at is not None and queued["status"] == "STOPPED"
    assert (rows["wr"].status, rows["wr"].stop_requested, rows["wr"].waiting_for,
            rows["wr"].ended_at) == (Status.RUNNING, True, "quota max_gpus", None)
    assert running["status"] == "RUNNING" and running["ended_at"] is None


def _set_status(app, name: str, status: Status) -> None:
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(status=status))


def test_answers_carry_no_traceback_nor_server_path_even_from_older_records(client, tokens, app):
    """Rows and trials written before errors were kept as one line (issue 11): the study's
    ``error`` and a trial's ``fail_reason`` are answered as their exception's line, and a
    trial's ``checkpoint`` directory (for the driver) is not answered at all."""
    traceback = ('Traceback (most recent call last):\n  File "/srv/hpo/hpo/tune/driver.py", '
                 'line 9, in run\n    log()\nOverflowError: too large for /srv/hpo/runs/x\n')
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("old"), headers=h)
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == "old").values(
            status=Status.FAILED, error=traceback))
    study = optuna.load_study(study_name="old", storage=app.state.components.studies.storage)
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
    trial.set_user_attr("fail_reason", traceback)
    trial.set_user_attr("checkpoint", "/srv/hpo/runs/old/trial_0/checkpoint_000002")
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    line = "OverflowError: too large for <path>"
    assert client.get("/v1/studies/old", headers=h).json()["error"] == line
    listed = client.get("/v1/studies", headers=h).json()["items"]
    assert [s["error"] for s in listed if s["name"] == "old"] == [line]
    for answer in (client.get("/v1/studies/old/trials", headers=h).json()["items"][0],
                   client.get("/v1/studies/old/trials/0", headers=h).json()):
        assert answer["user_attrs"] == {"fail_reason": line}


def test_delete_refuses_a_running_study_and_removes_an_ended_one_with_its_trials(
        client, tokens, app, settings):
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("d"), headers=h)
    _with_trials(app, "d", [0.5])
    (settings.results_dir / "d").mkdir(parents=True)
    _set_status(app, "d", Status.RUNNING)
    r = client.delete("/v1/studies/d", headers=h)
    assert r.status_code == 409 and "running" in r.json()["error"]["message"]
    _set_status(app, "d", Status.COMPLETED)
    assert client.delete("/v1/studies/d", headers=h).status_code == 204
    assert _stored(app) == ([], [])
    assert not (settings.results_dir / "d").exists()
    assert client.get("/v1/studies/d", headers=h).status_code == 404
    assert client.post("/v1/studies", json=tiny_spec("d"), headers=h).status_code == 201


def test_unknown_study_answers_404_in_the_error_shape(client, tokens):
    r = client.get("/v1/studies/nope", headers=bearer(tokens["alice"]))
    assert r.status_code == 404
    assert r.json() == {"error": {"code": "not_found", "message": "no study named 'nope'",
                                  "details": []}}


def test_openapi_documents_every_route(client):
    paths = client.get("/openapi.json").json()["paths"]
    assert {"/v1/studies", "/v1/studies/{name}", "/v1/studies/{name}/trials",
            "/v1/studies/{name}/trials/{number}", "/v1/studies/{name}/stop", "/v1/tasks",
            "/healthz", "/readyz"} <= set(paths)
    assert client.get("/docs").status_code == 200


def test_warm_start_from_a_study_of_another_owner_answers_422_and_from_ones_own_is_accepted(
        client, tokens, app):
    client.post("/v1/studies", json=tiny_spec("bobs-earlier"), headers=bearer(tokens["bob"]))
    client.post("/v1/studies", json=tiny_spec("alices-earlier"),
                headers=bearer(tokens["alice"]))
    _with_trials(app, "alices-earlier", [0.9, 0.8])
    _with_trials(app, "bobs-earlier", [0.9])
    h = bearer(tokens["alice"])
    r = client.post("/v1/studies", headers=h, json=tiny_spec(
        "warm-bad", warm_start=[{"study": "bobs-earlier", "top_k": 1}]))
    assert r.status_code == 422
    assert r.json()["error"]["details"][0]["loc"] == "warm_start.0.study"
    r = client.post("/v1/studies", headers=h, json=tiny_spec(
        "warm-missing", warm_start=[{"study": "nowhere", "top_k": 1}]))
    assert r.status_code == 422
    r = client.post("/v1/studies", headers=h, json=tiny_spec(
        "warm-ok", warm_start=[{"study": "alices-earlier", "top_k": 1}]))
    assert r.status_code == 201, r.text
    assert _stored(app)[0] == ["alices-earlier", "bobs-earlier", "warm-ok"]


def test_warm_start_takes_the_points_of_the_study_checked_at_create_not_a_later_namesake(
        client, tokens, app):
    """A queued study's warm start from ``shared`` (bob's, checked readable at create) must
    not take the trials of alice's ``shared``, made after bob deleted his: the points are
    read and stored at create, and the driver never looks the name up again."""
    bob, alice = bearer(tokens["bob"]), bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("shared"), headers=bob)
    _with_trials(app, "shared", [0.7, 0.9])
    storage = app.state.components.studies.storage
    bobs = optuna.load_study(study_name="shared", storage=storage).best_trial
    r = client.post("/v1/studies", headers=bob, json=tiny_spec(
        "bob-warm", warm_start=[{"study": "shared", "top_k": 1}, {"params": {"lr": 0.01}}]))
    assert r.status_code == 201, r.text
    assert client.delete("/v1/studies/shared", headers=bob).status_code == 204
    assert client.post("/v1/studies", json=tiny_spec("shared"), headers=alice).status_code == 201
    _with_trials(app, "shared", [0.95, 0.99])

    from hpo.record import StudyRecord
    from hpo.spec import load_stored
    from hpo.warmstart import enqueue_warm_start
    stored = optuna.load_study(study_name="bob-warm", storage=storage).user_attrs["hpo_spec"]
    record = StudyRecord(load_stored(stored), storage, compare_spec=False)
    assert enqueue_warm_start(record, look_up=False) == 2
    waiting = record.study.get_trials(states=(optuna.trial.TrialState.WAITING,))
    assert [(t.system_attrs["fixed_params"], t.user_attrs["warm_start"]) for t in waiting] == [
        (bobs.params, f"study:shared#{bobs.number}"), ({"lr": 0.01}, "points[1]")]


def test_warm_start_of_a_study_stored_without_its_points_looks_no_name_up(client, tokens, app,
                                                                         caplog):
    """A service's study made before its points were stored enqueues only its own points."""
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("earlier"), headers=h)
    _with_trials(app, "earlier", [0.9])
    client.post("/v1/studies", headers=h, json=tiny_spec(
        "older", warm_start=[{"study": "earlier", "top_k": 1}, {"params": {"lr": 0.02}}]))
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="older", storage=storage)
    storage.set_study_system_attr(storage.get_study_id_from_name("older"),
                                  "hpo:warm_start_points", None)

    from hpo.record import StudyRecord
    from hpo.spec import load_stored
    from hpo.warmstart import enqueue_warm_start
    record = StudyRecord(load_stored(study.user_attrs["hpo_spec"]), storage, compare_spec=False)
    with caplog.at_level("WARNING", logger="hpo.warmstart"):
        assert enqueue_warm_start(record, look_up=False) == 1
    assert [t.system_attrs["fixed_params"] for t in record.study.trials] == [{"lr": 0.02}]
    assert "study older: warm start from earlier skipped: its points were not stored" in \
        caplog.text


def test_a_summary_written_after_its_study_s_delete_is_refused_on_sqlite_too(app):
    """SQLite enforced no foreign key in the service's tables either: a driver's summary
    written as its study was deleted stayed as an orphan, and SQLite gives a deleted
    study's id to the next study made, whose view then showed the old study's summary
    (perhaps another owner's). Enforced, the write fails and a delete cascades, as on
    PostgreSQL."""
    from service.db import StudyRow, SummaryRow, build_engine, session_factory

    engine = build_engine(str(app.state.components.sessions.kw["bind"].url))  # new connections
    with session_factory(engine)() as session:
        old = StudyRow(name="old", status="COMPLETED", spec={}, n_trials=1)
        session.add(old)
        session.flush()
        session.add(SummaryRow(study_id=old.id, summary="{}"))
        session.commit()
        old_id = old.id
        session.delete(old)
        session.commit()
        assert session.execute(sa.select(SummaryRow)).scalars().all() == []  # cascaded
        session.add(SummaryRow(study_id=old_id, summary='{"best": "old owner"}'))
        with pytest.raises(sa.exc.IntegrityError, match="FOREIGN KEY"):
            session.commit()
    engine.dispose()
