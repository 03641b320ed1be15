"""Tokens: hash-only storage, 401 without a known token, owner scoping (404), admins, open reads."""

from __future__ import annotations

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
