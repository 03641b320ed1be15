"""The Optuna dashboard at the root path: behind the tokens, read-only for non-admins,
scoped to the token's studies, and robust to infinite and NaN values (optuna-dashboard#108)."""

from __future__ import annotations

import json

import optuna
import pytest

from service.auth import COOKIE_NAME
from tests.service.conftest import TestClient, bearer, tiny_spec


def _strict_json(text: str):
    """Parse JSON refusing the non-standard NaN/Infinity literals a browser cannot read."""
    def refuse(literal):
        raise ValueError(f"non-standard JSON literal {literal}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def studies(client, tokens, app) -> dict[str, int]:
    """Studies ``a`` (alice) and ``b`` (bob); their Optuna study ids."""
    client.post("/v1/studies", json=tiny_spec("a"), headers=bearer(tokens["alice"]))
    client.post("/v1/studies", json=tiny_spec("b"), headers=bearer(tokens["bob"]))
    storage = app.state.components.studies.storage
    return {name: storage.get_study_id_from_name(name) for name in ("a", "b")}


def test_dashboard_page_and_assets_answer_at_the_root_path(client, tokens, studies):
    h = bearer(tokens["alice"])
    page = client.get("/dashboard", headers=h)
    assert page.status_code == 200 and "<title>Optuna Dashboard</title>" in page.text
    assert client.get(f"/dashboard/studies/{studies['a']}", headers=h).status_code == 200
    assert client.get("/static/bundle.js").status_code == 200  # code, no data: no token
    assert client.get("/api/meta", headers=h).status_code == 200


def test_dashboard_needs_a_token(client, tokens, studies):
    page = client.get("/dashboard")
    assert page.status_code == 401 and "?token=" in page.text
    api = client.get("/api/studies")
    assert api.status_code == 401 and api.json()["error"]["code"] == "not_authenticated"
    assert client.get("/dashboard?token=hpo_wrong").status_code == 401


def test_token_in_the_query_sets_a_cookie_and_redirects_without_it(app, tokens, studies):
    with TestClient(app, follow_redirects=False) as c:
        r = c.get(f"/dashboard/studies/{studies['a']}?token={tokens['alice']}&x=1")
        assert r.status_code == 303
        assert r.headers["location"] == f"/dashboard/studies/{studies['a']}?x=1"
        cookie = r.headers["set-cookie"]
        assert f"{COOKIE_NAME}={tokens['alice']}" in cookie
        assert "HttpOnly" in cookie and "SameSite=strict" in cookie
        assert c.get(f"/api/studies/{studies['a']}").status_code == 200  # cookie kept


def test_non_admin_tokens_cannot_write_through_the_dashboard(client, tokens, studies, app):
    h = bearer(tokens["alice"])
    sid = studies["a"]
    for method, path in [("POST", "/api/studies"), ("DELETE", f"/api/studies/{sid}"),
                         ("POST", f"/api/studies/{sid}/rename"),
                         ("PUT", f"/api/studies/{sid}/note"),
                         ("POST", "/api/trials/1/tell"), ("POST", "/incompatible-rdb-schema")]:
        r = client.request(method, path, headers=h, json={})
        assert r.status_code == 403, (method, path)
        assert r.json()["error"]["code"] == "forbidden"
    assert app.state.components.studies.storage.get_study_id_from_name("a") == sid


def test_admin_tokens_can_write_through_the_dashboard(client, tokens, studies):
    r = client.put(f"/api/studies/{studies['a']}/note", headers=bearer(tokens["admin"]),
                   json={"version": 1, "body": "a note"})
    assert r.status_code == 204, r.text


def test_a_token_sees_only_its_own_studies_in_the_dashboard(client, tokens, studies):
    bob = bearer(tokens["bob"])
    listed = client.get("/api/studies", headers=bob).json()["study_summaries"]
    assert [s["study_name"] for s in listed] == ["b"]
    for path in (f"/api/studies/{studies['a']}", f"/api/studies/{studies['a']}/param_importances",
                 f"/csv/{studies['a']}"):
        assert client.get(path, headers=bob).status_code == 404, path
    assert client.get(f"/api/studies/{studies['b']}", headers=bob).status_code == 200
    admin = client.get("/api/studies", headers=bearer(tokens["admin"])).json()
    assert sorted(s["study_name"] for s in admin["study_summaries"]) == ["a", "b"]


def test_a_study_with_infinite_and_nan_values_renders_in_the_dashboard_api_and_rest(
        client, tokens, app):
    # optuna-dashboard#108: a bare Infinity in the JSON broke the study page
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("inf", n_trials=5), headers=h)
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="inf", storage=storage)
    dist = {"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)}
    for final in (0.5, float("inf"), float("-inf")):
        trial = study.ask(dist)
        for step, value in enumerate([float("nan"), float("inf"), final]):
            trial.report(value, step)
        study.tell(trial, final)
    trial = study.ask(dist)
    trial.report(float("-inf"), 1)
    study.tell(trial, state=optuna.trial.TrialState.FAIL)
    sid = storage.get_study_id_from_name("inf")
    detail = client.get(f"/api/studies/{sid}", headers=h)
    assert detail.status_code == 200
    data = _strict_json(detail.text)
    assert len(data["trials"]) == 4 and data["best_trials"][0]["values"] == ["inf"]
    assert client.get(f"/dashboard/studies/{sid}", headers=h).status_code == 200
    view = client.get("/v1/studies/inf", headers=h)
    assert _strict_json(view.text)["best_trial"]["value"] == "Infinity"
    trials = _strict_json(client.get("/v1/studies/inf/trials?intermediate=true",
                                     headers=h).text)["items"]
    assert trials[2]["value"] == "-Infinity"
    assert trials[0]["intermediate_values"] == {"0": "NaN", "1": "Infinity", "2": 0.5}
