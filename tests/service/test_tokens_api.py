"""Tokens over REST and the CLI (issue 15.1, 15.2): create with a role and an expiry, list
without secrets, revoke from the next request on (bearer and dashboard cookie), expiry,
last use written at most once a minute, and quotas set and cleared."""

from __future__ import annotations

import datetime as dt

import pytest
import sqlalchemy as sa
from typer.testing import CliRunner

from hpo.cli import app as hpo_app
from service.auth import COOKIE_NAME, create_token
from service.db import QuotaRow, TokenRow, utcnow
from service.settings import Settings
from tests.service.conftest import TestClient, bearer

OWN = "http://127.0.0.1:8000"  # Settings().url of the test app
FORM = {"Content-Type": "application/x-www-form-urlencoded", "Origin": OWN}
NO_QUOTA = {"max_running_trials": None, "max_gpus": None, "device_seconds_per_day": None,
            "device_seconds_total": None}


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(database_url=db_url, results_dir=tmp_path / "results", run_dispatcher=False)


def _row(app, name: str) -> TokenRow:
    with app.state.components.sessions() as session:
        return session.execute(sa.select(TokenRow).where(TokenRow.name == name)).scalar_one()


def _set(app, name: str, **values) -> None:
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(TokenRow).where(TokenRow.name == name).values(**values))


def test_an_admin_creates_a_token_whose_secret_is_shown_once_and_works(client, tokens, app):
    admin = bearer(tokens["admin"])
    r = client.post("/v1/tokens", json={"name": "carol", "role": "viewer",
                                         "expires_in_s": 3600}, headers=admin)
    assert r.status_code == 201, r.text
    body = r.json()
    assert r.headers["location"] == "/v1/tokens/carol"
    read = client.get("/v1/tokens/carol", headers=admin).json()
    assert read == {k: v for k, v in r.json().items() if k != "token"}
    assert (body["name"], body["role"], body["state"]) == ("carol", "viewer", "active")
    expires = dt.datetime.fromisoformat(body["expires_at"])
    assert abs(expires - (utcnow() + dt.timedelta(hours=1))) < dt.timedelta(seconds=10)
    assert body["quota"] == NO_QUOTA and body["revoked_at"] is None
    secret = body["token"]
    assert client.get("/v1/studies", headers=bearer(secret)).status_code == 200
    listed = client.get("/v1/tokens", headers=admin)
    assert secret not in listed.text and all("token" not in t for t in listed.json()["items"])
    assert client.post("/v1/tokens", json={"name": "carol"}, headers=admin).status_code == 409
    for lookalike in ("Carol", "CAROL"):  # owners and audit rows show the name alone
        r = client.post("/v1/tokens", json={"name": lookalike, "role": "admin"}, headers=admin)
        assert r.status_code == 409 and r.json()["error"]["message"] == (
            "a token named 'carol' exists; names must differ by more than case")
    bad = client.post("/v1/tokens", json={"name": "../x", "role": "root"}, headers=admin)
    assert bad.status_code == 422
    assert {d["loc"] for d in bad.json()["error"]["details"]} == {"body.name", "body.role"}


def test_the_list_is_paginated_by_creation_and_shows_role_use_expiry_and_quota(
        client, tokens, app):
    admin = bearer(tokens["admin"])
    client.get("/v1/studies", headers=bearer(tokens["alice"]))  # alice's last use
    client.put("/v1/tokens/bob/quota", json={"max_gpus": 2}, headers=admin)
    page = client.get("/v1/tokens?offset=1&limit=2", headers=admin).json()
    assert (page["total"], page["offset"], page["limit"]) == (3, 1, 2)
    alice, bob = page["items"]
    assert (alice["name"], alice["role"], bob["name"], bob["role"]) == (
        "alice", "member", "bob", "member")
    assert alice["last_used_at"] is not None and bob["last_used_at"] is None
    assert bob["quota"] == {**NO_QUOTA, "max_gpus": 2.0}
    first = client.get("/v1/tokens?limit=1", headers=admin).json()["items"]
    assert [t["name"] for t in first] == ["admin"]
    for secret in tokens.values():
        assert secret not in str(page) and secret not in str(first)


def test_a_revoked_token_is_refused_from_its_next_request_bearer_and_cookie(
        client, tokens, app):
    alice = tokens["alice"]
    with TestClient(app, follow_redirects=False) as browser:
        login = browser.post("/dashboard/login", headers=FORM,
                             content=f"token={alice}&next=/dashboard")
        assert login.status_code == 303 and COOKIE_NAME in browser.cookies
        assert browser.get("/api/studies").status_code == 200
        assert client.get("/v1/studies", headers=bearer(alice)).status_code == 200
        r = client.post("/v1/tokens/alice/revoke", headers=bearer(tokens["admin"]))
        assert r.status_code == 200 and r.json()["state"] == "revoked"
        for answer in (client.get("/v1/studies", headers=bearer(alice)),
                       browser.get("/api/studies")):
            assert answer.status_code == 401
            assert answer.json()["error"]["message"].startswith("token 'alice' was revoked at ")
        page = browser.get("/dashboard")
        assert page.status_code == 401 and "Token needed" in page.text
        again = browser.post("/dashboard/login", headers=FORM, content=f"token={alice}")
        assert again.status_code == 401 and "Token &#x27;alice&#x27; was revoked" in again.text
    revoked_at = _row(app, "alice").revoked_at
    assert client.post("/v1/tokens/alice/revoke", headers=bearer(tokens["admin"])).json()[
        "revoked_at"] == revoked_at.isoformat().replace("+00:00", "Z")  # idempotent


def test_a_token_cannot_revoke_itself_and_unknown_names_answer_404(client, tokens):
    admin = bearer(tokens["admin"])
    r = client.post("/v1/tokens/admin/revoke", headers=admin)
    assert r.status_code == 409 and "cannot revoke itself" in r.json()["error"]["message"]
    for method, path in [("POST", "/v1/tokens/nobody/revoke"), ("GET", "/v1/tokens/nobody"),
                         ("GET", "/v1/tokens/nobody/quota"),
                         ("PUT", "/v1/tokens/nobody/quota"), ("GET", "/v1/tokens/a%00b/quota"),
                         ("POST", "/v1/tokens/-x/revoke")]:
        r = client.request(method, path, headers=admin, json={})
        assert r.status_code == 404, (method, path, r.text)
        assert r.json()["error"]["code"] == "not_found"
    assert client.get("/v1/studies", headers=admin).status_code == 200


def test_an_expired_token_answers_401_saying_so(client, tokens, app):
    sessions = app.state.components.sessions
    soon = create_token(sessions, "soon", expires_at=utcnow() + dt.timedelta(hours=1))
    assert client.get("/v1/studies", headers=bearer(soon)).status_code == 200
    _set(app, "soon", expires_at=dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC))
    r = client.get("/v1/studies", headers=bearer(soon))
    assert r.status_code == 401
    assert r.json()["error"]["message"] == "token 'soon' expired at 2026-01-02 03:04:05 UTC"
    listed = client.get("/v1/tokens", headers=bearer(tokens["admin"])).json()["items"]
    assert [t["state"] for t in listed if t["name"] == "soon"] == ["expired"]


def test_last_use_is_written_at_most_once_a_minute(client, tokens, app):
    h = bearer(tokens["bob"])
    assert _row(app, "bob").last_used_at is None
    client.get("/v1/studies", headers=h)
    first = _row(app, "bob").last_used_at
    assert abs(first - utcnow()) < dt.timedelta(seconds=10)
    updates = []

    def count(conn, cursor, statement, *args) -> None:
        updates.append(statement) if statement.lstrip().upper().startswith("UPDATE") else None

    engine = app.state.components.sessions.kw["bind"]
    sa.event.listen(engine, "before_cursor_execute", count)
    try:
        for _ in range(3):
            assert client.get("/v1/studies", headers=h).status_code == 200
        assert updates == [] and _row(app, "bob").last_used_at == first
        _set(app, "bob", last_used_at=first - dt.timedelta(seconds=61))
        updates.clear()
        client.get("/v1/studies", headers=h)
    finally:
        sa.event.remove(engine, "before_cursor_execute", count)
    assert len(updates) == 1 and _row(app, "bob").last_used_at > first


def test_quotas_are_set_replaced_cleared_and_validated_over_rest(client, tokens, app):
    admin = bearer(tokens["admin"])
    limits = {"max_running_trials": 2, "max_gpus": 1.5, "device_seconds_per_day": 3600,
              "device_seconds_total": None}
    r = client.put("/v1/tokens/alice/quota", json=limits, headers=admin)
    assert r.status_code == 200 and r.json() == {**limits, "device_seconds_per_day": 3600.0}
    assert client.get("/v1/tokens/alice/quota", headers=admin).json() == r.json()
    with app.state.components.sessions() as session:
        row = session.execute(sa.select(QuotaRow)).scalar_one()
    assert (row.owner_id, row.max_running_trials, row.max_gpus, row.device_seconds_total) == (
        _row(app, "alice").id, 2, 1.5, None)
    assert client.put("/v1/tokens/alice/quota", json={"max_gpus": 0},
                      headers=admin).json() == {**NO_QUOTA, "max_gpus": 0.0}
    assert client.put("/v1/tokens/alice/quota", json={}, headers=admin).json() == NO_QUOTA
    for body, loc in [({"max_gpus": -1}, "body.max_gpus"),
                      ({"max_running_trials": 1.5}, "body.max_running_trials"),
                      ({"device_seconds_total": "lots"}, "body.device_seconds_total"),
                      ({"device_seconds_total": False}, "body.device_seconds_total"),
                      ({"max_running_trials": "2"}, "body.max_running_trials"),
                      ({"max_cpus": 1}, "body.max_cpus")]:
        r = client.put("/v1/tokens/alice/quota", json=body, headers=admin)
        assert r.status_code == 422, body
        assert [d["loc"] for d in r.json()["error"]["details"]] == [loc]
    assert client.get("/v1/tokens/alice/quota", headers=admin).json() == NO_QUOTA


# -- the CLI ------------------------------------------------------------------------------


@pytest.fixture
def cli(settings, app, monkeypatch):
    """``hpo`` on the app's database."""
    monkeypatch.setenv("HPO_DATABASE_URL", settings.database_url)
    runner = CliRunner()
    return lambda *argv: runner.invoke(hpo_app, list(argv))


def test_cli_creates_tokens_with_a_role_and_an_expiry(cli, app):
    made = cli("token", "create", "vera", "--role", "viewer", "--expires-in", "30d")
    assert made.exit_code == 0, made.output
    row = _row(app, "vera")
    assert (row.role, row.is_admin) == ("viewer", False)
    assert abs(row.expires_at - (utcnow() + dt.timedelta(days=30))) < dt.timedelta(seconds=30)
    assert cli("token", "create", "root", "--admin").exit_code == 0
    assert (_row(app, "root").role, _row(app, "root").is_admin) == ("admin", True)
    assert cli("token", "create", "root2", "--admin", "--role", "admin").exit_code == 0
    for argv, message in [(["x1", "--admin", "--role", "viewer"], "--admin contradicts"),
                          (["x2", "--role", "root"], "--role must be one of admin, member, "
                                                     "viewer"),
                          (["x3", "--expires-in", "30x"], "--expires-in must be"),
                          (["x4", "--expires-in", "0d"], "--expires-in must be"),
                          (["x5", "--expires-in", "999999999d"], "--expires-in must be at most"),
                          (["x6", "--expires-in", "3651d"], "--expires-in must be at most"),
                          (["x7", "--expires-in", "\uff15d"], "--expires-in must be")]:
        r = cli("token", "create", *argv)
        assert r.exit_code == 2 and message in r.output, (argv, r.output)
        assert "Traceback" not in r.output
    assert cli("token", "create", "m", "--expires-in", "90s").exit_code == 0
    assert abs(_row(app, "m").expires_at - utcnow() - dt.timedelta(seconds=90)) < dt.timedelta(
        seconds=30)


def test_cli_lists_revokes_and_sets_quotas(cli, app, tokens, client):
    assert cli("token", "quota", "bob", "--max-gpus", "2", "--max-running-trials", "3",
               ).exit_code == 0
    r = cli("token", "quota", "bob", "--max-gpus", "none", "--device-seconds-total", "7200")
    assert r.exit_code == 0 and r.stdout.strip() == (
        "bob: max_running_trials=3, device_seconds_total=7200")
    assert cli("token", "quota", "bob").stdout.strip() == r.stdout.strip()
    for argv, flag in [(["--max-gpus", "-1"], "--max-gpus"),
                       (["--max-running-trials", "1.5"], "--max-running-trials"),
                       (["--device-seconds-per-day", "lots"], "--device-seconds-per-day"),
                       (["--max-running-trials", "3000000000"], "--max-running-trials"),
                       (["--max-running-trials", "9" * 23], "--max-running-trials"),
                       (["--max-gpus", "1e20"], "--max-gpus"),
                       (["--device-seconds-total", "1e300"], "--device-seconds-total")]:
        bad = cli("token", "quota", "bob", *argv)
        assert bad.exit_code == 2 and f"{flag} must be" in bad.output, bad.output
        assert "Traceback" not in bad.output
    assert cli("token", "quota", "nobody", "--max-gpus", "1").exit_code == 2
    assert client.get("/v1/studies", headers=bearer(tokens["bob"])).status_code == 200
    revoked = cli("token", "revoke", "bob")
    assert revoked.exit_code == 0 and "token 'bob' revoked at" in revoked.output
    assert client.get("/v1/studies", headers=bearer(tokens["bob"])).status_code == 401
    assert "already revoked" in cli("token", "revoke", "bob").output
    assert cli("token", "revoke", "nobody").exit_code == 2
    listed = cli("token", "list")
    assert listed.exit_code == 0
    rows = {cells[0]: cells for cells in (
        [c for c in line.replace("│", " ").split() if c] for line in listed.stdout.splitlines())
        if cells and cells[0] in tokens}
    today = f"{utcnow():%Y-%m-%d}"
    # name, role, created (2 cells), last used (2), expires, revoked (2), quota
    assert rows["bob"][:3] == ["bob", "member", today] and rows["bob"][3 + 1] == today
    assert rows["bob"][6] == "-" and rows["bob"][7] == today
    assert rows["bob"][9:] == ["max_running_trials=3,", "device_seconds_total=7200"]
    assert rows["alice"][4:] == ["-", "-", "-", "-"]
    assert rows["admin"][1] == "admin"
    for secret in tokens.values():
        assert secret not in listed.output


def test_token_commands_refuse_an_outdated_database_in_one_line(tmp_path, monkeypatch):
    from service.db import build_engine
    from tests.service.test_migrations import LEGACY

    url = f"sqlite:///{tmp_path / 'old.db'}"
    engine = build_engine(url)
    LEGACY.create_all(engine)  # the tables before migrations: no role, no quotas
    engine.dispose()
    monkeypatch.setenv("HPO_DATABASE_URL", url)
    monkeypatch.setenv("HPO_AUTO_MIGRATE", "false")
    for argv in (["list"], ["revoke", "alice"], ["quota", "alice"]):
        r = CliRunner().invoke(hpo_app, ["token", *argv])
        assert r.exit_code == 1 and "run `hpo db upgrade`" in r.output, (argv, r.output)
        assert "Traceback" not in r.output


def test_concurrent_creates_of_names_differing_in_case_make_one_token(app):
    """Found by the breaker: the service's check and its insert are two statements, so two
    creates at once (carol, CAROL) both passed the check; the database's unique index on
    lower(name) now refuses the second."""
    import threading

    from service.auth import create_token
    from service.errors import TokenExists

    sessions = app.state.components.sessions
    for i in range(5):
        barrier, made, refused = threading.Barrier(2), [], []

        def create(name, barrier=barrier, made=made, refused=refused):
            barrier.wait()
            try:
                made.append(create_token(sessions, name))
            except TokenExists as e:
                refused.append(str(e))

        threads = [threading.Thread(target=create, args=(n,)) for n in (f"c{i}", f"C{i}")]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert (len(made), len(refused)) == (1, 1), refused
