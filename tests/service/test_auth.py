"""Tokens: hash-only storage, 401 without a known token, owner scoping (404), admins, open reads."""

from __future__ import annotations

import datetime as dt

import sqlalchemy as sa
from typer.testing import CliRunner

from hpo.cli import app as hpo_app
from service.auth import hash_token
from service.db import TokenRow
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec


def test_only_the_hash_of_a_token_is_stored(app, tokens):
    with app.state.components.sessions() as session:
        rows = session.execute(sa.select(TokenRow)).scalars().all()
    stored = {r.name: r.token_hash for r in rows}
    assert stored["alice"] == hash_token(tokens["alice"])
    assert all(tokens[name] not in value for name, value in stored.items())
    assert tokens["alice"].startswith("hpo_") and len(tokens["alice"]) == 47


def test_missing_or_unknown_token_answers_401_for_reads_and_writes(client, tokens):
    for headers in ({}, bearer("hpo_wrong"), {"Authorization": f"Basic {tokens['alice']}"}):
        r = client.get("/v1/studies", headers=headers)
        assert r.status_code == 401 and r.json()["error"]["code"] == "not_authenticated"
        assert r.headers["www-authenticate"] == "Bearer"
        assert client.post("/v1/studies", json=tiny_spec("x"), headers=headers).status_code == 401
    assert client.get("/v1/tasks").status_code == 401


def test_a_token_sees_and_controls_only_its_own_studies(client, tokens):
    client.post("/v1/studies", json=tiny_spec("alices"), headers=bearer(tokens["alice"]))
    client.post("/v1/studies", json=tiny_spec("bobs"), headers=bearer(tokens["bob"]))
    bob = bearer(tokens["bob"])
    assert [s["name"] for s in client.get("/v1/studies", headers=bob).json()["items"]] == ["bobs"]
    for method, path in [("GET", "/v1/studies/alices"), ("GET", "/v1/studies/alices/trials"),
                         ("GET", "/v1/studies/alices/trials/0"),
                         ("POST", "/v1/studies/alices/stop"), ("DELETE", "/v1/studies/alices")]:
        r = client.request(method, path, headers=bob)
        assert r.status_code == 404, (method, path, r.text)
    assert client.get("/v1/studies/alices", headers=bearer(tokens["alice"])).status_code == 200


def test_an_admin_token_sees_and_controls_every_study(client, tokens):
    client.post("/v1/studies", json=tiny_spec("a1"), headers=bearer(tokens["alice"]))
    client.post("/v1/studies", json=tiny_spec("b1"), headers=bearer(tokens["bob"]))
    admin = bearer(tokens["admin"])
    items = client.get("/v1/studies", headers=admin).json()["items"]
    names = {s["name"]: s["owner"] for s in items}
    assert names == {"a1": "alice", "b1": "bob"}
    assert client.post("/v1/studies/a1/stop", headers=admin).json()["status"] == "STOPPED"
    assert client.delete("/v1/studies/b1", headers=admin).status_code == 204


def test_open_reads_need_no_token_but_writes_still_do(settings, tokens):
    from service.app import create_app

    open_app = create_app(Settings(**{**settings.__dict__, "open_reads": True}))
    with TestClient(open_app) as c:
        c.post("/v1/studies", json=tiny_spec("o1"), headers=bearer(tokens["alice"]))
        assert [s["name"] for s in c.get("/v1/studies").json()["items"]] == ["o1"]
        assert c.get("/v1/studies/o1", headers=bearer(tokens["bob"])).status_code == 200
        assert c.get("/v1/tasks").status_code == 200
        assert c.post("/v1/studies", json=tiny_spec("o2")).status_code == 401
        assert c.post("/v1/studies/o1/stop", headers=bearer(tokens["bob"])).status_code == 404


def test_token_create_prints_a_token_once_and_refuses_a_taken_name(sqlite_url, monkeypatch):
    monkeypatch.setenv("HPO_DATABASE_URL", sqlite_url)
    runner = CliRunner()
    first = runner.invoke(hpo_app, ["token", "create", "carol", "--admin"])
    assert first.exit_code == 0, first.output
    token = first.stdout.strip().splitlines()[-1]
    assert token.startswith("hpo_")
    again = runner.invoke(hpo_app, ["token", "create", "carol"])
    assert again.exit_code == 2 and "exists" in again.output
    bad = runner.invoke(hpo_app, ["token", "create", "../x"])
    assert bad.exit_code == 2

    from service.auth import resolve
    from service.db import build_engine, session_factory

    engine = build_engine(sqlite_url)
    who = resolve(session_factory(engine), token)
    engine.dispose()
    assert who.name == "carol" and who.is_admin


def test_service_commands_refuse_bad_settings_and_databases_in_one_line(monkeypatch):
    runner = CliRunner()
    monkeypatch.setenv("HPO_PORT", "0")  # serve binds its port first: any free one will do
    monkeypatch.setenv("HPO_DATABASE_URL", "postgresql+psycopg://u:s3cret@127.0.0.1:1/none")
    for argv in (["token", "create", "dave"], ["serve"]):  # serve: before starting any Ray
        result = runner.invoke(hpo_app, argv)
        assert result.exit_code == 1, result.output
        assert "cannot open storage" in result.output and "s3cret" not in result.output
        assert "Traceback" not in result.output
    monkeypatch.setenv("HPO_OPEN_READS", "maybe")
    for argv in (["token", "create", "dave"], ["serve"]):
        result = runner.invoke(hpo_app, argv)
        assert result.exit_code == 2, result.output
        assert "HPO_OPEN_READS must be true or false" in result.output


# Each study route with a validated path or query parameter, with an invalid value of it; the
# walk below checks that the list covers every such route of the app. (A ``{name}`` no study can
# have answers 404 whoever asks, before any token is read: service.routers.studies.study_name.)
INVALID = [("GET", "/v1/studies", "/v1/studies?limit=0"),
           ("GET", "/v1/studies", "/v1/studies?offset=-1"),
           ("GET", "/v1/studies", "/v1/studies?status=NOPE"),
           ("GET", "/v1/studies/{name}/trials", "/v1/studies/s1/trials?limit=100000"),
           ("GET", "/v1/studies/{name}/trials", "/v1/studies/s1/trials?intermediate=maybe"),
           ("GET", "/v1/studies/{name}/trials/{number}", "/v1/studies/s1/trials/abc"),
           ("GET", "/v1/studies/{name}/trials/{number}", "/v1/studies/s1/trials/-1"),
           ("GET", "/v1/studies/{name}/trials/{number}/model", "/v1/studies/s1/trials/x/model")]


def test_the_token_is_judged_before_the_parameters_on_every_study_route(app, client, tokens):
    """401 (no, unknown, revoked or expired token) precedes 422: the study routes resolve
    their token with their work, which invalid parameters never reach (the 422 handler
    resolves it first, service.api_errors)."""
    from service.auth import create_token, utcnow
    from tests.service.test_roles import _app_routes

    sessions = app.state.components.sessions
    vera = create_token(sessions, "vera", role="viewer")
    gone = create_token(sessions, "gone")
    old = create_token(sessions, "old", expires_at=utcnow() - dt.timedelta(seconds=1))
    assert client.post("/v1/tokens/gone/revoke", headers=bearer(tokens["admin"])).status_code == 200
    with_params = {(m, path) for m, path, r in _app_routes(app) if path.startswith("/v1/studies")
                   and (r.dependant.path_params or r.dependant.query_params)}
    assert with_params == {(m, p) for m, p, _ in INVALID}
    expected = {401: "not_authenticated", 422: "invalid_request"}
    for _, _, url in INVALID:
        for token, code in {None: 401, "hpo_unknown": 401, gone: 401, old: 401, vera: 422,
                            tokens["alice"]: 422, tokens["admin"]: 422}.items():
            r = client.get(url, headers=bearer(token) if token else {})
            assert r.status_code == code, (url, token, r.text)
            assert r.json()["error"]["code"] == expected[code]
            assert (r.headers.get("www-authenticate") == "Bearer") == (code == 401)
    for method, url in [("GET", "/v1/studies/bad%20name%21"), ("POST", "/v1/studies/bad%21/stop"),
                        ("DELETE", "/v1/studies/bad%21")]:
        for token in (None, "hpo_unknown", vera, tokens["alice"]):
            r = client.request(method, url, headers=bearer(token) if token else {})
            assert r.status_code == 404, (method, url, token, r.text)


def test_with_open_reads_an_anonymous_bad_read_is_422_and_a_bad_token_still_401(settings):
    from service.app import create_app

    open_app = create_app(Settings(**{**settings.__dict__, "open_reads": True}))
    with TestClient(open_app) as c:
        for _, _, url in INVALID:
            assert c.get(url).status_code == 422, url
            assert c.get(url, headers=bearer("hpo_unknown")).status_code == 401, url
