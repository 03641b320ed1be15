"""The HTTP contract of the API: the OpenAPI document (issue 11.11), UTC datetimes (11.12),
405 for unsupported methods (11.13) and names no study can have (11.14)."""

from __future__ import annotations

import datetime as dt
import logging
import time
import zoneinfo

import httpx
import optuna
import pytest
from fastapi.testclient import TestClient

from hpo.spec import StudySpec
from service.app import create_app
from service.settings import Settings
from tests.service.conftest import bearer, record_summary, tiny_spec

# every API path (one concrete address each) and the methods it takes (HEAD only where declared)
ROUTES = {
    "/healthz": {"GET"}, "/readyz": {"GET"}, "/v1/tasks": {"GET"},
    "/v1/studies": {"GET", "POST"}, "/v1/studies/s": {"GET", "DELETE"},
    "/v1/studies/s/trials": {"GET"}, "/v1/studies/s/trials/0": {"GET"},
    "/v1/studies/s/stop": {"POST"},
    "/v1/studies/s/model": {"GET"}, "/v1/studies/s/trials/0/model": {"GET"},
    "/v1/tokens": {"GET", "POST"}, "/v1/tokens/s": {"GET"}, "/v1/tokens/s/revoke": {"POST"},
    "/v1/tokens/s/quota": {"GET", "PUT"}, "/v1/audit": {"GET"},
    # FastAPI's documentation pages are Starlette routes, which take HEAD with GET
    "/openapi.json": {"GET", "HEAD"}, "/docs": {"GET", "HEAD"}, "/redoc": {"GET", "HEAD"},
    "/docs/oauth2-redirect": {"GET", "HEAD"},
}
METHODS = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE"]
ERROR_REF = {"$ref": "#/components/schemas/ErrorBody"}


def _openapi(client) -> dict:
    r = client.get("/openapi.json")
    assert r.status_code == 200
    return r.json()


# -- 11: the OpenAPI document -------------------------------------------------------------


def test_openapi_documents_the_create_body_as_the_study_spec_in_json_and_yaml(client):
    doc = _openapi(client)
    body = doc["paths"]["/v1/studies"]["post"]["requestBody"]
    assert body["required"] is True
    spec_ref = {"$ref": "#/components/schemas/StudySpec"}
    assert {k: v["schema"] for k, v in body["content"].items()} == {
        "application/json": spec_ref, "application/yaml": spec_ref}
    expected = StudySpec.model_json_schema(ref_template="#/components/schemas/{model}")
    schemas = doc["components"]["schemas"]
    for name, schema in expected.pop("$defs").items():
        assert schemas[name] == schema, name
    assert schemas["StudySpec"] == expected
    assert schemas["StudySpec"]["required"] == ["name", "task", "objective", "budget"]


def test_every_reference_of_the_openapi_document_resolves(client):
    doc = _openapi(client)

    def refs(node):
        if isinstance(node, dict):
            if "$ref" in node:
                yield node["$ref"]
            for value in node.values():
                yield from refs(value)
        elif isinstance(node, list):
            for value in node:
                yield from refs(value)

    found = set(refs(doc))
    assert "#/components/schemas/StudySpec" in found
    for ref in found:
        assert ref.startswith("#/components/schemas/"), ref
        assert ref.rsplit("/", 1)[1] in doc["components"]["schemas"], ref


def test_openapi_documents_the_bearer_scheme_on_every_route_that_takes_a_token(client):
    doc = _openapi(client)
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["type"] == "http"
    assert doc["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    for path, operations in doc["paths"].items():
        for method, operation in operations.items():
            expected = [{"HTTPBearer": []}] if path.startswith("/v1/") else None
            assert operation.get("security") == expected, (method, path)


# what each route answers besides its success (403: a viewer's write, a non-admin on the
# admins' routes; another owner's study is 404, so that its name does not leak; 408: a body
# slower than HPO_BODY_TIMEOUT_S, see test_connection_limits.py)
DOCUMENTED_ERRORS = {
    ("get", "/healthz"): set(),
    ("get", "/readyz"): {503},
    ("post", "/v1/studies"): {400, 401, 403, 408, 409, 413, 415, 422, 503},
    ("get", "/v1/studies"): {401, 422, 503},
    ("get", "/v1/studies/{name}"): {401, 404, 422, 503},
    ("delete", "/v1/studies/{name}"): {401, 403, 404, 408, 409, 413, 422, 503},
    ("get", "/v1/studies/{name}/trials"): {401, 404, 422, 503},
    ("get", "/v1/studies/{name}/trials/{number}"): {401, 404, 422, 503},
    ("post", "/v1/studies/{name}/stop"): {401, 403, 404, 408, 409, 413, 422, 503},
    ("get", "/v1/studies/{name}/model"): {401, 404, 422, 503},
    ("get", "/v1/studies/{name}/trials/{number}/model"): {401, 404, 422, 503},
    ("get", "/v1/tasks"): {401, 503},
    ("get", "/v1/tokens"): {401, 403, 422, 503},
    ("post", "/v1/tokens"): {400, 401, 403, 408, 409, 413, 422, 503},
    ("get", "/v1/tokens/{name}"): {401, 403, 404, 422, 503},
    ("post", "/v1/tokens/{name}/revoke"): {401, 403, 404, 408, 409, 413, 422, 503},
    ("get", "/v1/tokens/{name}/quota"): {401, 403, 404, 422, 503},
    ("put", "/v1/tokens/{name}/quota"): {400, 401, 403, 404, 408, 413, 422, 503},
    ("get", "/v1/audit"): {401, 403, 422, 503},
}


def test_openapi_documents_every_error_status_of_each_route_with_the_error_shape(client):
    doc = _openapi(client)
    operations = {(m, p): op for p, ops in doc["paths"].items() for m, op in ops.items()}
    assert set(operations) == set(DOCUMENTED_ERRORS)
    for key, operation in operations.items():
        errors = {int(s) for s in operation["responses"] if int(s) >= 400}
        assert errors == DOCUMENTED_ERRORS[key], key
        for status in errors - {503} if key == ("get", "/readyz") else errors:
            schema = operation["responses"][str(status)]["content"]["application/json"]["schema"]
            assert schema == ERROR_REF, (key, status)
    assert "HTTPValidationError" not in doc["components"]["schemas"]


def test_the_documented_statuses_are_answered_in_the_error_shape(client, tokens, settings):
    alice = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("s"), headers=alice)
    answers = {
        400: client.post("/v1/studies", content=b"{", headers=alice),
        401: client.get("/v1/studies"),
        404: client.get("/v1/studies/nope", headers=alice),
        409: client.post("/v1/studies", json=tiny_spec("s"), headers=alice),
        413: client.post("/v1/studies/s/stop", content=b"x" * (settings.max_body_bytes + 1),
                         headers=alice),
        415: client.post("/v1/studies", content=b"x", headers={**alice,
                                                                "Content-Type": "text/plain"}),
        422: client.get("/v1/studies?limit=0", headers=alice),
    }
    for status, r in answers.items():
        assert r.status_code == status, r.text
        assert set(r.json()) == {"error"} and set(r.json()["error"]) == {
            "code", "message", "details"}


# -- 12: datetimes carry UTC ------------------------------------------------------------


def _datetimes(node, path=""):
    """(path, value) of every string of ``node`` that reads as an ISO datetime."""
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _datetimes(value, f"{path}.{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _datetimes(value, f"{path}[{i}]")
    elif isinstance(node, str) and len(node) >= 19 and node[10:11] == "T":
        try:
            value = dt.datetime.fromisoformat(node)
        except ValueError:
            return
        yield path, value


@pytest.fixture
def new_york_clock():
    """The process's local time zone is America/New_York (UTC-5 in December)."""
    import os

    old = os.environ.get("TZ")
    os.environ["TZ"] = "America/New_York"
    time.tzset()
    yield zoneinfo.ZoneInfo("America/New_York")
    if old is None:
        del os.environ["TZ"]
    else:
        os.environ["TZ"] = old
    time.tzset()


def test_every_datetime_in_every_answer_is_utc_also_under_a_local_time_zone(
        client, tokens, app, new_york_clock):
    alice = bearer(tokens["alice"])
    created = client.post("/v1/studies", json=tiny_spec("s"), headers=alice)
    study = optuna.load_study(study_name="s", storage=app.state.components.studies.storage)
    dist = {"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)}
    done = study.ask(dist)
    done.report(0.5, 1)
    study.tell(done, 0.9)
    study.ask(dist)  # RUNNING: a start, no end
    record_summary(app, "s")
    answers = {
        "create": created, "list": client.get("/v1/studies", headers=alice),
        "view": client.get("/v1/studies/s", headers=alice),
        "trials": client.get("/v1/studies/s/trials?intermediate=true", headers=alice),
        "trial": client.get("/v1/studies/s/trials/0", headers=alice),
        "stop": client.post("/v1/studies/s/stop", headers=alice),
    }
    found = {}
    for what, r in answers.items():
        assert r.status_code < 300, r.text
        for path, value in _datetimes(r.json()):
            assert value.utcoffset() == dt.timedelta(0), (what, path, value)
            found[f"{what}{path}"] = value
    assert {"create.created_at", "list.items[0].created_at", "view.created_at",
            "stop.ended_at", "trials.items[0].datetime_start",
            "trials.items[0].datetime_complete", "trials.items[1].datetime_start",
            "trial.datetime_start", "trial.datetime_complete",
            "view.best_trial.datetime_start"} <= set(found)
    # Optuna hands out the New York wall clock, naive: the answer is that instant in UTC
    stored = study.trials[0]
    assert stored.datetime_start.tzinfo is None
    assert found["trial.datetime_start"] == stored.datetime_start.replace(
        tzinfo=new_york_clock).astimezone(dt.UTC)
    assert found["trial.datetime_complete"] == stored.datetime_complete.replace(
        tzinfo=new_york_clock).astimezone(dt.UTC)
    now = dt.datetime.now(dt.UTC)
    assert abs(found["trial.datetime_start"] - now) < dt.timedelta(hours=1)
    assert abs(found["create.created_at"] - now) < dt.timedelta(hours=1)
    # the running trial's device-seconds count from its start, not 5 hours more
    assert 0 <= answers["view"].json()["device_seconds"] < 3600


# -- 13: unsupported methods ------------------------------------------------------------


def test_the_route_table_covers_every_documented_path(client):
    documented = {p.replace("{name}", "s").replace("{number}", "0")
                  for p in _openapi(client)["paths"]}
    assert documented <= set(ROUTES)


@pytest.mark.parametrize("path", sorted(ROUTES))
def test_a_method_a_route_does_not_take_answers_405_with_allow_head_included(
        live_server, tokens, path):
    takes = ROUTES[path]
    with httpx.Client(base_url=live_server, headers=bearer(tokens["admin"])) as http:
        for method in METHODS:
            if method in takes:
                continue  # tested by the route's own tests
            r = http.request(method, path)
            assert r.status_code == 405, (method, path, r.text)
            assert set(r.headers["allow"].split(", ")) == takes, (method, path)
            assert r.headers["content-type"] == "application/json"
            if method != "HEAD":
                assert r.json()["error"]["code"] == "method_not_allowed"


def test_unknown_api_paths_answer_404_in_the_error_shape_for_every_method(live_server, tokens):
    with httpx.Client(base_url=live_server, headers=bearer(tokens["admin"])) as http:
        for method in METHODS:
            r = http.request(method, "/v1/nowhere")
            assert r.status_code == 404, method
            if method != "HEAD":
                assert r.json()["error"]["code"] == "not_found"


# -- 14: names no study can have ------------------------------------------------------------


@pytest.fixture
def db_app(db_url, tmp_path):
    return create_app(Settings(database_url=db_url, results_dir=tmp_path / "results",
                               run_dispatcher=False))


@pytest.mark.parametrize("name", ["a%00b", "%00", "a%0Ab", "a%09b", "x" * 65, "-a", "a%20b",
                                  "%C3%A9", "a%5Cb"])
def test_a_name_no_study_can_have_answers_404_on_every_route_and_backend(db_app, name, caplog):
    from service.auth import create_token

    token = create_token(db_app.state.components.sessions, "alice")
    caplog.set_level(logging.DEBUG)
    with TestClient(db_app, raise_server_exceptions=False) as client:
        headers = bearer(token)
        answers = [client.get(f"/v1/studies/{name}", headers=headers),
                   client.delete(f"/v1/studies/{name}", headers=headers),
                   client.get(f"/v1/studies/{name}/trials", headers=headers),
                   client.get(f"/v1/studies/{name}/trials/0", headers=headers),
                   client.post(f"/v1/studies/{name}/stop", headers=headers)]
    for r in answers:
        assert r.status_code == 404, (r.request.method, r.request.url, r.text)
        assert r.json()["error"]["code"] == "not_found"
        assert "Traceback" not in r.text
    for record in caplog.records:
        assert "\x00" not in record.getMessage()
