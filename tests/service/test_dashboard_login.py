"""The dashboard's login step and its defences against cross-site requests: a token becomes the
session cookie only through the login form posted from the service's own pages, and the cookie
authenticates no write from another origin (the issue's login CSRF and cookie CSRF)."""

from __future__ import annotations

import datetime as dt
import re

import pytest
import sqlalchemy as sa

from service.auth import COOKIE_NAME
from service.dashboard_login import cross_origin_refusal
from tests.service.conftest import TestClient, bearer, tiny_spec

OWN = "http://127.0.0.1:8000"  # Settings().url of the test app: HPO_HOST and HPO_PORT
EVIL = "https://evil.example"
FORM = {"Content-Type": "application/x-www-form-urlencoded"}


@pytest.fixture
def browser(app):
    """A client that keeps cookies and does not follow redirects."""
    with TestClient(app, follow_redirects=False) as c:
        yield c


@pytest.fixture
def study_id(client, tokens, app) -> int:
    client.post("/v1/studies", json=tiny_spec("mine"), headers=bearer(tokens["alice"]))
    return app.state.components.studies.storage.get_study_id_from_name("mine")


def login(browser, token: str) -> str:
    """Log ``browser`` in through the form; the session id its cookie holds."""
    r = browser.post("/dashboard/login", headers={**FORM, "Origin": OWN}, data={"token": token})
    assert r.status_code == 303, r.text
    return browser.cookies[COOKIE_NAME]


def _note(storage, study_id: int) -> str | None:
    attrs = storage.get_study_system_attrs(study_id)
    return next((v for k, v in attrs.items() if "note" in k and isinstance(v, str)), None)


def test_a_page_without_a_token_shows_the_login_form(browser, tokens):
    page = browser.get("/dashboard/studies/3")
    assert page.status_code == 401
    assert "Token needed" in page.text and 'action="/dashboard/login"' in page.text
    assert 'name="next" value="/dashboard/studies/3"' in page.text
    assert "frame-ancestors 'none'" in page.headers["content-security-policy"]
    api = browser.get("/api/studies")
    assert api.status_code == 401 and api.json()["error"]["code"] == "not_authenticated"
    assert browser.get("/dashboard/login").status_code == 200


@pytest.mark.parametrize("path", ["/dashboard", "/api/studies", "/dashboard/login"])
def test_a_token_in_the_address_is_ignored(browser, tokens, path):
    r = browser.get(f"{path}?token={tokens['alice']}")
    assert "set-cookie" not in r.headers
    assert r.status_code == (200 if path == "/dashboard/login" else 401)
    assert COOKIE_NAME not in browser.cookies


@pytest.mark.parametrize("origin", [{"Origin": OWN}, {"Referer": f"{OWN}/dashboard/login"},
                                    {"Origin": "http://localhost:8000"}])
def test_the_login_form_exchanges_a_token_for_a_cookie(browser, tokens, study_id, origin):
    r = browser.post("/dashboard/login", headers={**FORM, **origin},
                     content=f"token={tokens['alice']}&next=/dashboard/studies/{study_id}")
    assert r.status_code == 303, r.text
    assert r.headers["location"] == f"/dashboard/studies/{study_id}"
    cookie = r.headers["set-cookie"]
    session_id = browser.cookies[COOKIE_NAME]
    assert cookie.startswith(f"{COOKIE_NAME}={session_id};")
    assert re.fullmatch(r"hpo_session_[A-Za-z0-9_-]{43}", session_id)
    assert tokens["alice"] not in cookie  # a session of its own, never the token
    assert "HttpOnly" in cookie and "SameSite=strict" in cookie and "Max-Age" not in cookie
    listed = browser.get("/api/studies").json()["study_summaries"]  # the cookie is enough
    assert [s["study_id"] for s in listed] == [study_id]


@pytest.mark.parametrize("origin", [{"Origin": EVIL}, {"Referer": f"{EVIL}/page"},
                                    {"Origin": "null"}, {"Origin": "http://127.0.0.1:8001"},
                                    {"Origin": EVIL, "Referer": f"{OWN}/dashboard"}, {}])
def test_a_login_posted_from_another_site_is_refused(browser, tokens, origin):
    # login CSRF: another page would plant its own token in the visitor's browser
    r = browser.post("/dashboard/login", headers={**FORM, **origin},
                     content=f"token={tokens['alice']}")
    assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden"
    assert "HPO_PUBLIC_URL" in r.json()["error"]["message"]
    assert "set-cookie" not in r.headers


def test_a_bad_login_shows_the_form_again_and_sets_no_cookie(browser):
    r = browser.post("/dashboard/login", headers={**FORM, "Origin": OWN},
                     content="token=hpo_wrong")
    assert r.status_code == 401 and "Unknown token." in r.text
    assert "set-cookie" not in r.headers
    r = browser.post("/dashboard/login", headers={"Origin": OWN}, json={"token": "x"})
    assert r.status_code == 415


@pytest.mark.parametrize("next_path", ["https://evil.example/", "//evil.example/dashboard",
                                       "/dashboard//evil.example", "/api/studies",
                                       "/dashboard/\\evil"])
def test_the_login_redirects_only_to_a_dashboard_page(browser, tokens, next_path):
    r = browser.post("/dashboard/login", headers={**FORM, "Origin": OWN},
                     data={"token": tokens["alice"], "next": next_path})
    assert (r.status_code, r.headers["location"]) == (303, "/dashboard")


def test_logout_clears_the_cookie(browser, tokens):
    login = browser.post("/dashboard/login", headers={**FORM, "Origin": OWN},
                         data={"token": tokens["alice"]})
    assert login.status_code == 303 and browser.get("/api/studies").status_code == 200
    assert browser.post("/dashboard/logout", headers={"Origin": EVIL}).status_code == 403
    r = browser.post("/dashboard/logout", headers={"Origin": OWN})
    assert r.status_code == 303 and r.headers["location"] == "/dashboard/login"
    assert f'{COOKIE_NAME}="";' in r.headers["set-cookie"]
    assert browser.get("/api/studies").status_code == 401


def test_logout_ends_the_session_on_the_server(browser, app, tokens):
    """A copy of the cookie (another port's listener, a shared machine) stops working at
    the logout, not when the browser drops its own copy."""
    session_id = login(browser, tokens["alice"])
    browser.post("/dashboard/logout", headers={"Origin": OWN})
    with TestClient(app) as other:
        other.cookies.set(COOKIE_NAME, session_id)
        r = other.get("/api/studies")
    assert r.status_code == 401
    assert r.json()["error"]["message"] == ("unknown dashboard session (logged out?): "
                                            "log in again")


def test_a_session_is_not_the_token_and_opens_only_the_dashboard(browser, app, tokens):
    """A breaker: the cookie held the token itself, and cookies are not bound to a port
    (RFC 6265, section 8.5): whatever listened on another port of the host got the
    token, and with it the whole REST API. The session id opens the dashboard alone."""
    session_id = login(browser, tokens["admin"])
    assert session_id != tokens["admin"]
    with TestClient(app) as other:
        for path in ("/v1/studies", "/v1/tokens", "/v1/audit"):
            assert other.get(path, headers=bearer(session_id)).status_code == 401, path
        other.cookies.set(COOKIE_NAME, tokens["admin"])  # an older version's cookie
        r = other.get("/api/studies")
        assert r.status_code == 401 and "unknown dashboard session" in r.text
    stored = _sessions(app)
    assert [row.session_hash for row in stored] == [
        __import__("hashlib").sha256(session_id.encode()).hexdigest()]


def test_a_session_ends_after_its_hours_and_ended_ones_are_deleted(browser, app, tokens,
                                                                   monkeypatch):
    from service import auth

    first = login(browser, tokens["alice"])
    later = auth.utcnow() + dt.timedelta(hours=app.state.components.settings
                                         .dashboard_session_hours, seconds=1)
    monkeypatch.setattr(auth, "utcnow", lambda: later)
    r = browser.get("/api/studies")
    assert r.status_code == 401
    assert re.fullmatch(r"the dashboard session ended at \S+ \S+ UTC: log in again",
                        r.json()["error"]["message"])
    second = login(browser, tokens["alice"])  # its login deletes the ended session
    assert browser.get("/api/studies").status_code == 200
    assert second != first and len(_sessions(app)) == 1


def _sessions(app) -> list:
    from service.db import DashboardSessionRow

    with app.state.components.sessions() as session:
        return list(session.execute(sa.select(DashboardSessionRow)).scalars())


def test_a_cookie_write_from_another_origin_is_refused(browser, tokens, study_id, app):
    storage = app.state.components.studies.storage
    login(browser, tokens["admin"])
    note = {"version": 1, "body": "planted"}
    for origin in ({"Origin": EVIL}, {"Referer": f"{EVIL}/x"}, {}):
        r = browser.put(f"/api/studies/{study_id}/note", headers=origin, json=note)
        assert r.status_code == 403 and r.json()["error"]["code"] == "forbidden", origin
    assert _note(storage, study_id) is None


@pytest.mark.parametrize("origin", [{"Origin": OWN}, {"Referer": f"{OWN}/dashboard/studies/1"}])
def test_a_cookie_write_from_the_services_own_pages_is_allowed(browser, tokens, study_id, app,
                                                               origin):
    login(browser, tokens["admin"])
    r = browser.put(f"/api/studies/{study_id}/note", headers=origin,
                    json={"version": 1, "body": "a note"})
    assert r.status_code == 204, r.text
    assert _note(app.state.components.studies.storage, study_id) == "a note"


@pytest.mark.parametrize("origin", [{}, {"Origin": EVIL}])
def test_a_bearer_write_needs_no_origin(client, tokens, study_id, origin):
    r = client.put(f"/api/studies/{study_id}/note", json={"version": 1, "body": "by bearer"},
                   headers={**bearer(tokens["admin"]), **origin})
    assert r.status_code == 204, r.text
    created = client.post("/v1/studies", json=tiny_spec("by-bearer"),
                          headers={**bearer(tokens["alice"]), **origin})
    assert created.status_code == 201, created.text


def test_the_rest_api_does_not_read_the_dashboard_cookie(browser, tokens):
    login(browser, tokens["admin"])
    for method, path in [("GET", "/v1/studies"), ("POST", "/v1/studies")]:
        r = browser.request(method, path, headers={"Origin": OWN}, json=tiny_spec("x"))
        assert r.status_code == 401, (method, path)


@pytest.mark.parametrize(("own", "source", "allowed"), [
    ("http://127.0.0.1:8000", "http://127.0.0.1:8000", True),
    ("http://127.0.0.1:8000", "http://LOCALHOST:8000/dashboard", True),
    ("http://127.0.0.1:8000", "http://[::1]:8000", True),
    ("http://127.0.0.1:8000", "https://127.0.0.1:8000", False),
    ("http://127.0.0.1:8000", "http://127.0.0.1", False),
    ("https://hpo.example.org", "https://hpo.example.org:443/x", True),
    ("https://hpo.example.org", "https://hpo.example.org.evil.example", False),
    ("https://hpo.example.org", "http://hpo.example.org", False),
    ("https://hpo.example.org", "https://localhost", False),
    ("https://hpo.example.org", "https://hpo.example.org:bad", False),
    ("http://host:bad", "http://host:bad", False),
])
def test_the_same_origin_check(own, source, allowed):
    assert (cross_origin_refusal({"origin": source}, own) is None) is allowed


def test_a_token_keeps_only_its_newest_sessions(browser, app, tokens, monkeypatch):
    """A breaker: 300 logins of one token left 300 rows; any token holder (a viewer too)
    could grow the table without bound. A login ends the token's oldest beyond the cap."""
    from service import auth

    monkeypatch.setattr(auth, "MAX_SESSIONS_PER_TOKEN", 3)
    first = [login(browser, tokens["alice"]) for _ in range(5)]
    bobs = login(browser, tokens["bob"])  # another token's are its own
    assert len(_sessions(app)) == 4
    with TestClient(app) as other:
        for session_id, status in [*zip(first, [401, 401, 200, 200, 200], strict=True),
                                  (bobs, 200)]:
            other.cookies.set(COOKIE_NAME, session_id)
            assert other.get("/api/studies").status_code == status


def test_with_open_reads_an_ended_session_reads_as_anyone(settings, tokens):
    """A breaker: with HPO_OPEN_READS, a browser still sending the cookie of a session that
    ended (12 hours after the login) met the login form where anyone may read; a write
    with it is still refused."""
    from service.app import create_app

    with TestClient(create_app(settings.replace(open_reads=True)),
                    follow_redirects=False) as browser:
        session_id = login(browser, tokens["alice"])
        browser.post("/dashboard/logout", headers={"Origin": OWN})
        browser.cookies.set(COOKIE_NAME, session_id)  # as a browser keeps a stale one
        assert browser.get("/api/studies").status_code == 200
        assert browser.get("/dashboard").status_code == 200
        r = browser.put("/api/studies/1/note", headers={"Origin": OWN},
                        json={"version": 1, "body": "x"})
        assert r.status_code == 401
