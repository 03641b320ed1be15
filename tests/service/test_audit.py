"""The audit trail (issue 15.5): every study create, stop and delete, token creation and
revocation and quota change is a row of ``hpo_audit`` (who, what, when, from where) and a
log line; admins read it at ``GET /v1/audit``, newest first, paginated and filtered."""

from __future__ import annotations

import datetime as dt
import logging

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from hpo.cli import app as hpo_app
from service import audit
from service.auth import resolve
from service.db import AuditRow, utcnow
from service.settings import Settings
from tests.service.conftest import bearer, tiny_spec

ADDRESS = "testclient"  # the client host of starlette's TestClient


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(database_url=db_url, results_dir=tmp_path / "results", run_dispatcher=False)


def _rows(app) -> list[tuple]:
    """(actor, action, target, address, detail) of every audit row, oldest first."""
    with app.state.components.sessions() as session:
        return [(r.actor, r.action, r.target, r.address, r.detail) for r in session.execute(
            sa.select(AuditRow).order_by(AuditRow.id)).scalars()]


def test_study_create_stop_and_delete_are_recorded_with_actor_and_address(
        client, tokens, app, caplog):
    caplog.set_level(logging.INFO, logger="service.audit")
    alice, admin = bearer(tokens["alice"]), bearer(tokens["admin"])
    assert client.post("/v1/studies", json=tiny_spec("s1"), headers=alice).status_code == 201
    assert client.post("/v1/studies/s1/stop", headers=alice).status_code == 202
    assert client.post("/v1/studies", json=tiny_spec("s2"), headers=alice).status_code == 201
    assert client.delete("/v1/studies/s2", headers=admin).status_code == 204
    # refused changes are not changes: nothing recorded
    assert client.post("/v1/studies", json=tiny_spec("s1"), headers=alice).status_code == 409
    assert client.delete("/v1/studies/s1", headers=bearer(tokens["bob"])).status_code == 404
    assert _rows(app) == [("alice", "study.create", "s1", ADDRESS, None),
                          ("alice", "study.stop", "s1", ADDRESS, None),
                          ("alice", "study.create", "s2", ADDRESS, None),
                          ("admin", "study.delete", "s2", ADDRESS, None)]
    lines = [r.getMessage() for r in caplog.records if r.name == "service.audit"]
    assert lines == ["audit: alice study.create s1 from testclient",
                     "audit: alice study.stop s1 from testclient",
                     "audit: alice study.create s2 from testclient",
                     "audit: admin study.delete s2 from testclient"]


def test_token_and_quota_changes_over_rest_are_recorded(client, tokens, app):
    admin = bearer(tokens["admin"])
    client.post("/v1/tokens", json={"name": "vera", "role": "viewer"}, headers=admin)
    client.put("/v1/tokens/vera/quota", json={"max_gpus": 1}, headers=admin)
    client.post("/v1/tokens/vera/revoke", headers=admin)
    client.post("/v1/tokens/vera/revoke", headers=admin)  # no change: no second row
    assert _rows(app) == [
        ("admin", "token.create", "vera", ADDRESS, {"role": "viewer", "expires_at": None}),
        ("admin", "quota.set", "vera", ADDRESS,
         {"max_running_trials": None, "max_gpus": 1.0, "device_seconds_per_day": None,
          "device_seconds_total": None}),
        ("admin", "token.revoke", "vera", ADDRESS, None)]


def test_cli_changes_are_recorded_with_the_local_user_and_address_cli(settings, app,
                                                                       monkeypatch):
    monkeypatch.setenv("HPO_DATABASE_URL", settings.database_url)
    monkeypatch.setattr(audit.getpass, "getuser", lambda: "ops")
    runner = CliRunner()
    for argv in (["create", "carol", "--role", "member"], ["quota", "carol",
                                                           "--max-running-trials", "2"],
                 ["quota", "carol"], ["revoke", "carol"]):
        assert runner.invoke(hpo_app, ["token", *argv]).exit_code == 0
    assert _rows(app) == [
        ("ops", "token.create", "carol", "cli", {"role": "member", "expires_at": None}),
        ("ops", "quota.set", "carol", "cli",
         {"max_running_trials": 2, "max_gpus": None, "device_seconds_per_day": None,
          "device_seconds_total": None}),
        ("ops", "token.revoke", "carol", "cli", None)]


def test_admins_read_the_audit_newest_first_paginated_and_filtered(client, tokens, app):
    alice, bob = bearer(tokens["alice"]), bearer(tokens["bob"])
    for name, h in [("a1", alice), ("b1", bob), ("a2", alice)]:
        client.post("/v1/studies", json=tiny_spec(name), headers=h)
    client.post("/v1/studies/a1/stop", headers=alice)
    admin = bearer(tokens["admin"])
    page = client.get("/v1/audit?limit=2", headers=admin).json()
    assert (page["total"], page["offset"], page["limit"]) == (4, 0, 2)
    assert [(e["actor"], e["action"], e["target"], e["address"]) for e in page["items"]] == [
        ("alice", "study.stop", "a1", ADDRESS), ("alice", "study.create", "a2", ADDRESS)]
    at = dt.datetime.fromisoformat(page["items"][0]["at"])
    assert at.utcoffset() == dt.timedelta(0) and abs(at - utcnow()) < dt.timedelta(seconds=30)
    rest = client.get("/v1/audit?offset=2&limit=2", headers=admin).json()["items"]
    assert [e["target"] for e in rest] == ["b1", "a1"]
    mine = client.get("/v1/audit?actor=alice&action=study.create", headers=admin).json()
    assert mine["total"] == 2 and [e["target"] for e in mine["items"]] == ["a2", "a1"]
    assert client.get("/v1/audit?actor=nobody", headers=admin).json() == {
        "items": [], "total": 0, "offset": 0, "limit": 50}
    for query, loc in [("limit=0", "query.limit"), ("actor=a%00b", "query.actor"),
                       ("action=DROP%20TABLE", "query.action")]:
        r = client.get(f"/v1/audit?{query}", headers=admin)
        assert r.status_code == 422 and [d["loc"] for d in r.json()["error"]["details"]] == [loc]
    for token in ("alice", "bob"):
        r = client.get("/v1/audit", headers=bearer(tokens[token]))
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert client.get("/v1/audit").status_code == 401


def test_record_refuses_an_unknown_action_and_joins_a_given_session(app):
    sessions = app.state.components.sessions
    with pytest.raises(ValueError, match="unknown audit action 'study.rename'"):
        audit.record(sessions, "x", "study.rename", "s", None)
    with sessions() as session:
        audit.record(session, "x", "study.stop", "s", "10.0.0.1")
        session.rollback()  # the caller's transaction decides
    assert _rows(app) == []
    audit.record(sessions, "x", "study.stop", "s", None, {"n": 1})
    assert _rows(app) == [("x", "study.stop", "s", None, {"n": 1})]


def test_a_study_change_is_made_only_with_its_audit_row(client, tokens, app):
    """Create, stop and delete write their audit row in the statement (PostgreSQL) or the
    transaction (SQLite) of the change itself: where the row cannot be written, the change
    is not made either (an error answer, nothing stored)."""
    from fastapi.testclient import TestClient

    alice = bearer(tokens["alice"])
    assert client.post("/v1/studies", json=tiny_spec("kept"), headers=alice).status_code == 201
    assert client.post("/v1/studies", json=tiny_spec("ended"), headers=alice).status_code == 201
    assert client.post("/v1/studies/ended/stop", headers=alice).status_code == 202
    sessions = app.state.components.sessions
    engine = sessions.kw["bind"]
    # sqlite3 says OperationalError (the database is unavailable), psycopg UndefinedTable
    failed = {"sqlite": (503, "storage_unavailable"),
              "postgresql": (500, "internal")}[engine.dialect.name]
    with engine.begin() as conn:  # the audit table is gone for a while
        conn.execute(sa.text("ALTER TABLE hpo_audit RENAME TO hpo_audit_away"))
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            for method, path, body in (("POST", "/v1/studies", tiny_spec("never")),
                                       ("POST", "/v1/studies/kept/stop", None),
                                       ("DELETE", "/v1/studies/ended", None)):
                r = c.request(method, path, json=body, headers=alice)
                assert (r.status_code, r.json()["error"]["code"]) == failed, (path, r.text)
    finally:
        with engine.begin() as conn:
            conn.execute(sa.text("ALTER TABLE hpo_audit_away RENAME TO hpo_audit"))
    h = alice
    assert client.get("/v1/studies/never", headers=h).status_code == 404
    storage = app.state.components.studies.storage
    assert sorted(s.study_name for s in storage.get_all_studies()) == ["ended", "kept"]
    kept = client.get("/v1/studies/kept", headers=h).json()
    assert (kept["status"], kept["stop_requested"]) == ("QUEUED", False)
    assert client.get("/v1/studies/ended", headers=h).json()["status"] == "STOPPED"
    assert _rows(app) == [("alice", "study.create", "kept", ADDRESS, None),
                          ("alice", "study.create", "ended", ADDRESS, None),
                          ("alice", "study.stop", "ended", ADDRESS, None)]
    # with the table back, the same changes are made and recorded
    assert client.post("/v1/studies/kept/stop", headers=h).status_code == 202
    assert client.delete("/v1/studies/ended", headers=h).status_code == 204
    assert _rows(app)[3:] == [("alice", "study.stop", "kept", ADDRESS, None),
                              ("alice", "study.delete", "ended", ADDRESS, None)]


def test_an_address_with_control_characters_is_stored_escaped(client, tokens, app):
    """A trusted proxy's ``X-Forwarded-For`` becomes the client's host as sent: its control
    characters are stored escaped, as the log line shows them, on every write path (the
    change's own statement on PostgreSQL, its transaction on SQLite, and ``record``)."""
    hostile, shown = "10.0.0.1\r\n\x1b[2Jx", "10.0.0.1\\r\\n\\x1b[2Jx"
    assert client.post("/v1/studies", json=tiny_spec("s1"),
                       headers=bearer(tokens["alice"])).status_code == 201
    c = app.state.components
    auditor = audit.Auditor(c.sessions, "alice", hostile)
    c.studies.stop(resolve(c.sessions, tokens["alice"]), "s1", auditor)
    auditor("token.create", "t")
    assert [r[3] for r in _rows(app)] == [ADDRESS, shown, shown]


def test_a_long_address_is_cut_between_escapes_never_inside_one(app):
    audit.record(app.state.components.sessions, "x", "study.stop", "s", "a" * 61 + "\x1b[2J")
    audit.record(app.state.components.sessions, "x", "study.stop", "s", "b" * 70)
    assert [r[3] for r in _rows(app)] == ["a" * 61, "b" * 64]
