"""Token roles (issue 15.1): a viewer reads every owner's studies and changes nothing, on every
route of the app (walked from ``app.routes``) and every write route of the dashboard (walked
from optuna-dashboard's own route table); members and admins keep what they had."""

from __future__ import annotations

import re

import optuna
import optuna_dashboard
import pytest
import sqlalchemy as sa
from fastapi.routing import APIRoute
from starlette.routing import Mount

from service.auth import COOKIE_NAME, Principal, create_token
from service.dashboard import DashboardGate
from service.dashboard_login import FORM_TYPE
from service.db import AuditRow, QuotaRow, Role, StudyRow, TokenRow
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec

WRITE_METHODS = {"POST", "PUT", "PATCH", "DELETE"}
OWN = "http://127.0.0.1:8000"  # Settings().url of the test app
# the bodies a write needs to be valid, so that only the role can refuse it
BODIES = {("POST", "/v1/studies"): tiny_spec("viewers"),
          ("POST", "/v1/tokens"): {"name": "made-by-viewer", "role": "admin"},
          ("PUT", "/v1/tokens/{name}/quota"): {"max_gpus": 1}}


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(database_url=db_url, results_dir=tmp_path / "results", run_dispatcher=False)


@pytest.fixture
def world(client, tokens, app) -> dict[str, str]:
    """Tokens admin, alice, bob (members) and vera (viewer); Alice's study ``alice`` (the
    study and the token share the name, so that every ``{name}`` of a path names one), with
    one finished trial."""
    sessions = app.state.components.sessions
    vera = create_token(sessions, "vera", role="viewer")
    assert client.post("/v1/studies", json=tiny_spec("alice"),
                       headers=bearer(tokens["alice"])).status_code == 201
    study = optuna.load_study(study_name="alice", storage=app.state.components.studies.storage)
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
    study.tell(trial, 0.5)
    return {**tokens, "vera": vera, "study_id": str(study._study_id),
            "trial_id": str(trial._trial_id)}


def _snapshot(app) -> dict:
    """Everything a write could change: studies, tokens, quotas, audit rows, trials."""
    with app.state.components.sessions() as session:
        return {
            "studies": session.execute(sa.select(StudyRow.name, StudyRow.status,
                                                 StudyRow.stop_requested)
                                       .order_by(StudyRow.name)).all(),
            "tokens": session.execute(sa.select(TokenRow.name, TokenRow.role,
                                                TokenRow.revoked_at)
                                      .order_by(TokenRow.name)).all(),
            "quotas": session.execute(sa.select(sa.func.count()).select_from(QuotaRow)).all(),
            "audit": session.execute(sa.select(sa.func.count()).select_from(AuditRow)).all(),
            "trials": [(s.study_name, s.n_trials) for s in optuna.get_all_study_summaries(
                app.state.components.studies.storage)],
        }


def _app_routes(app) -> list[tuple[str, str, object]]:
    """(method, path template, route) of every route of the app but the dashboard's mount."""
    walked = []
    for route in _flat(app.routes):
        if isinstance(route, Mount):
            assert isinstance(route.app, DashboardGate)  # walked by the dashboard tests below
            continue
        walked += [(method, route.path, route) for method in sorted(route.methods)]
    return walked


def _flat(routes) -> list:
    """``routes`` with each included router (FastAPI >= 0.165 keeps it whole) replaced by its
    routes, whose paths carry the router's prefix."""
    flat = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            assert route.include_context.prefix == ""  # the prefixes are the routers' own
        flat += _flat(included.routes) if included is not None else [route]
    return flat


def _fill(path: str) -> str:
    return re.sub(r"\{(\w+)(:\w+)?\}", lambda m: {"name": "alice", "number": "0",
                                                   "rest": "nowhere"}[m[1]], path)


def test_a_viewer_is_refused_every_write_and_reads_every_study_on_every_route(
        client, app, world):
    before = _snapshot(app)
    walked = _app_routes(app)
    assert len(walked) >= 20 and ("PUT", "/v1/tokens/{name}/quota") in {
        (m, p) for m, p, _ in walked}
    oks = 0
    for method, template, route in walked:
        path = _fill(template)
        body = BODIES.get((method, template))
        viewer = client.request(method, path, headers=bearer(world["vera"]), json=body)
        if route.name == "unknown_api_path":  # no route of that address exists: 404 to all
            assert viewer.status_code == 404, (method, path)
        elif method in WRITE_METHODS:
            assert viewer.status_code == 403, (method, path, viewer.text)
            error = viewer.json()["error"]
            assert error["code"] == "forbidden" and "'viewer'" in error["message"], error
        else:  # a viewer reads the studies as an admin does, the rest as a member does
            like = "admin" if template.startswith("/v1/studies") else "bob"
            other = client.request(method, path, headers=bearer(world[like]))
            assert viewer.status_code == other.status_code, (method, path, viewer.text)
            if like == "admin" and viewer.status_code == 200:
                assert viewer.json() == other.json(), (method, path)
            assert viewer.status_code in (200, 403, 404), (method, path, viewer.text)
            oks += viewer.status_code == 200
    assert oks >= 8  # the lists, tasks, health, the documentation
    listed = client.get("/v1/studies", headers=bearer(world["vera"])).json()
    assert [s["name"] for s in listed["items"]] == ["alice"]  # Alice's, read by the viewer
    assert _snapshot(app) == before


def test_the_walk_covers_every_write_of_the_api(app):
    writes = {(m, p) for m, p, r in _app_routes(app) if m in WRITE_METHODS
              and isinstance(r, APIRoute) and r.name != "unknown_api_path"}
    assert {("POST", "/v1/studies"), ("POST", "/v1/studies/{name}/stop"),
            ("DELETE", "/v1/studies/{name}"), ("POST", "/v1/tokens"),
            ("POST", "/v1/tokens/{name}/revoke"), ("PUT", "/v1/tokens/{name}/quota")} <= writes


def _dashboard_writes(app, world) -> list[tuple[str, str]]:
    """(method, concrete path) of every route of optuna-dashboard that is not GET."""
    values = {"study_id": world["study_id"], "trial_id": world["trial_id"], "history_id": "0",
              "artifact_id": "0123abcd-0000-4000-8000-00000000abcd"}
    routes = optuna_dashboard.wsgi(app.state.components.studies.storage).routes
    return [(r.method, re.sub(r"<(\w*)[^>]*>", lambda m: values[m[1]], r.rule))
            for r in routes if r.method not in ("GET", "HEAD", "OPTIONS")]


@pytest.mark.parametrize("by", ["bearer", "cookie"])
def test_a_viewer_is_refused_every_dashboard_write_by_bearer_or_cookie(app, world, by):
    before = _snapshot(app)
    writes = _dashboard_writes(app, world)
    assert len(writes) == 20  # optuna-dashboard 0.21; a new one is walked too
    with TestClient(app) as browser:
        headers = {"Origin": OWN}
        if by == "cookie":
            login = browser.post("/dashboard/login", data={"token": world["vera"]},
                                 headers={**headers, "Content-Type": FORM_TYPE},
                                 follow_redirects=False)
            assert login.status_code == 303 and COOKIE_NAME in browser.cookies
        else:
            headers.update(bearer(world["vera"]))
        assert browser.get("/api/studies", headers=headers).status_code == 200
        for method, path in writes:
            r = browser.request(method, path, headers=headers, json={"body": "x"})
            assert r.status_code == 403, (method, path, r.text)
            assert "'viewer'" in r.json()["error"]["message"], (method, path)
        # a method the dashboard has no route for is refused as a write, before any 404/405
        assert browser.request("PATCH", "/api/studies", headers=headers).status_code == 403
    assert _snapshot(app) == before


def test_an_admin_can_still_write_a_note_and_a_viewer_cannot(client, app, world):
    path = f"/api/studies/{world['study_id']}/note"
    note = {"version": 1, "body": "hello"}
    r = client.put(path, headers={**bearer(world["vera"]), "Origin": OWN}, json=note)
    assert r.status_code == 403
    assert client.put(path, headers=bearer(world["admin"]), json=note).status_code == 204


def test_members_keep_their_writes_and_admins_everything(client, world):
    alice = bearer(world["alice"])
    assert client.post("/v1/studies", json=tiny_spec("mine"), headers=alice).status_code == 201
    assert client.post("/v1/studies/mine/stop", headers=alice).json()["status"] == "STOPPED"
    assert client.delete("/v1/studies/mine", headers=alice).status_code == 204
    for method, path in [("GET", "/v1/tokens"), ("GET", "/v1/audit"),
                         ("POST", "/v1/tokens/bob/revoke"), ("GET", "/v1/tokens/bob/quota")]:
        r = client.request(method, path, headers=alice)
        assert r.status_code == 403, (method, path)
        assert r.json()["error"]["message"] == ("this needs an admin token; token 'alice' has "
                                                "the role 'member'")
        assert client.request(method, path, headers=bearer(world["admin"])).status_code == 200


def test_principal_keeps_is_admin_and_role_consistent():
    assert Principal(1, "a", is_admin=True).role is Role.ADMIN
    assert Principal(1, "a").role is Role.MEMBER and not Principal(1, "a").is_admin
    viewer = Principal(1, "v", role="viewer")
    assert viewer.role is Role.VIEWER and not viewer.is_admin and not viewer.may_write
    assert Principal(1, "a", role=Role.ADMIN).is_admin
    with pytest.raises(ValueError, match="is_admin=True with role"):
        Principal(1, "a", is_admin=True, role=Role.VIEWER)
