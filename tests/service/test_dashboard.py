"""The Optuna dashboard at the root path: behind the tokens, default-deny on its routes, scoped to
the token's studies on every route, path form and method, unable to change the studies the
service manages, and robust to infinite and NaN values (optuna-dashboard#108)."""

from __future__ import annotations

import json
import re
import socket
from pathlib import Path

import optuna
import optuna_dashboard
import pytest

from service.app import create_app
from service.dashboard import ALLOWED, REFUSED, Access
from service.dashboard_answers import DASHBOARD_REFUSALS
from tests.service.conftest import TestClient, bearer, record_summary, tiny_spec

ALICE_STUDY = "alice-secret-study"  # a name that appears nowhere else in any answer
BOB_STUDY = "bob-own-study"
ORIGIN = "http://testserver"


def _strict_json(text: str):
    """Parse JSON refusing the non-standard NaN/Infinity literals a browser cannot read."""
    def refuse(literal):
        raise ValueError(f"non-standard JSON literal {literal}")

    return json.loads(text, parse_constant=refuse)


@pytest.fixture
def studies(client, tokens, app) -> dict[str, int]:
    """Alice's and Bob's studies (one finished trial each): their Optuna study ids, and
    ``alice_trial``, the Optuna trial id of Alice's trial."""
    client.post("/v1/studies", json=tiny_spec(ALICE_STUDY), headers=bearer(tokens["alice"]))
    client.post("/v1/studies", json=tiny_spec(BOB_STUDY), headers=bearer(tokens["bob"]))
    storage = app.state.components.studies.storage
    ids = {}
    for name in (ALICE_STUDY, BOB_STUDY):
        study = optuna.load_study(study_name=name, storage=storage)
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
        study.tell(trial, 0.5)
        record_summary(app, name)
        ids[name] = study._study_id
        ids[f"{name}/trial"] = trial._trial_id
    return ids


def _dashboard_routes(app) -> list[tuple[str, str]]:
    """(method, rule) of every route of optuna-dashboard's Bottle app, as it is installed."""
    return [(r.method, r.rule) for r in
            optuna_dashboard.wsgi(app.state.components.studies.storage).routes]


def _concrete(rule: str, study_id: int, trial_id: int) -> str:
    """A path of ``rule`` naming ``study_id`` and ``trial_id``."""
    values = {"": f"/studies/{study_id}", "study_id": study_id, "trial_id": trial_id,
              "plot_type": "contour", "filename": "bundle.js", "history_id": "0",
              "artifact_id": "0123abcd-0000-4000-8000-00000000abcd"}
    return re.sub(r"<(\w*)[^>]*>", lambda m: str(values[m[1]]), rule)


def _variants(path: str) -> list[str]:
    """``path`` in the forms the dashboard's router reads as the same route."""
    forms = [path, path + "/", "/" + path, path.replace("/", "//"), path + "%2F",
             path + "?after=0&study_id=1"]
    if len(path) > 1:  # a percent-escaped first letter
        forms.append(f"/%{ord(path[1]):02X}{path[2:]}")
    return [ORIGIN + form for form in forms]  # absolute: "//x" would name a host


def _gate_refused(r) -> bool:
    """The answer is the gate's (the service's JSON error shape), not the dashboard's (its
    own refusals, pages, are given that shape with ``DASHBOARD_REFUSALS``' messages)."""
    return (r.status_code in (401, 403, 404, 405)
            and r.headers.get("content-type", "").startswith("application/json")
            and (r.request.method == "HEAD" or (
                "error" in r.json()
                and r.json()["error"]["message"] not in DASHBOARD_REFUSALS.values())))


def test_dashboard_page_and_assets_answer_at_the_root_path(client, tokens, studies):
    h = bearer(tokens["alice"])
    page = client.get("/dashboard", headers=h)
    assert page.status_code == 200 and "<title>Optuna Dashboard</title>" in page.text
    assert client.get(f"/dashboard/studies/{studies[ALICE_STUDY]}", headers=h).status_code == 200
    assert client.get("/static/bundle.js").status_code == 200  # code, no data: no token
    assert client.get("/api/meta", headers=h).status_code == 200


def test_every_dashboard_route_shows_nothing_of_another_owners_study(client, tokens, studies,
                                                                     app):
    sid, tid = studies[ALICE_STUDY], studies[f"{ALICE_STUDY}/trial"]
    bob = bearer(tokens["bob"])
    routes = _dashboard_routes(app)
    assert len(routes) == 33  # optuna-dashboard 0.21; a new one is walked too
    leaks, wrong = [], []
    for method, rule in routes:
        for url in _variants(_concrete(rule, sid, tid)):
            for verb in ({method, "HEAD"} if method == "GET" else {method}):
                r = client.request(verb, url, headers=bob, json={}, follow_redirects=False)
                where = (verb, url, r.status_code)
                if ALICE_STUDY in r.text:
                    leaks.append(where)
                if ALLOWED.get((method, rule)) in (Access.PUBLIC, Access.PAGE, Access.LIST):
                    expected = r.status_code in (200, 302)
                else:  # reads of her study: not found; writes: refused
                    expected = _gate_refused(r) and r.status_code == (
                        404 if method == "GET" else 403)
                if not expected:
                    wrong.append(where)
    assert (leaks, wrong) == ([], [])


@pytest.mark.parametrize("verb", ["GET", "HEAD"])
def test_the_study_list_is_filtered_in_every_path_form_and_method(client, tokens, studies,
                                                                  verb):
    bob = bearer(tokens["bob"])
    only_bob = client.get("/api/studies", headers=bob)
    assert [s["study_name"] for s in only_bob.json()["study_summaries"]] == [BOB_STUDY]
    for url in _variants("/api/studies"):
        r = client.request(verb, url, headers=bob)
        assert r.status_code == 200, url
        assert r.headers["content-length"] == str(len(only_bob.content)), url
        assert r.content == (b"" if verb == "HEAD" else only_bob.content), url
    admin = client.request(verb, "/api/studies/", headers=bearer(tokens["admin"]))
    assert int(admin.headers["content-length"]) > len(only_bob.content)


def _raw_request(base_url: str, method: str, target: str, token: str) -> tuple[int, int, bytes]:
    """Status, content-length and body of ``method target`` sent as written on a socket."""
    host, port = base_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(f"{method} {target} HTTP/1.1\r\nHost: {host}\r\nAuthorization: Bearer "
                     f"{token}\r\nConnection: close\r\n\r\n".encode())
        data = b""
        while chunk := sock.recv(1 << 16):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    headers = dict(line.split(b": ", 1) for line in head.split(b"\r\n")[1:])
    return int(head.split()[1]), int(headers[b"content-length"]), body


def test_the_study_list_is_filtered_over_a_real_connection(client, live_server, tokens,
                                                           studies):
    # the forms as a client writes them on the wire, decoded by uvicorn itself
    only_bob = client.get("/api/studies", headers=bearer(tokens["bob"])).content
    for target in ("/api/studies/", "//api/studies", "/api//studies/?after=0", "/api/studies%2F",
                   "/%61pi/studies"):
        for method in ("GET", "HEAD"):
            status, length, body = _raw_request(live_server, method, target, tokens["bob"])
            assert (status, length) == (200, len(only_bob)), (method, target)
            assert body == (b"" if method == "HEAD" else only_bob), (method, target)
    for target in (f"/api/studies/%3{studies[ALICE_STUDY]}", f"//csv/{studies[ALICE_STUDY]}/"):
        status, _, body = _raw_request(live_server, "GET", target, tokens["bob"])
        assert status == 404 and ALICE_STUDY.encode() not in body, target


def test_the_owner_and_admins_reach_every_read_route_of_a_study(client, tokens, studies, app):
    sid, tid = studies[ALICE_STUDY], studies[f"{ALICE_STUDY}/trial"]
    for who in ("alice", "admin"):
        for method, rule in _dashboard_routes(app):
            if method != "GET":
                continue
            for url in _variants(_concrete(rule, sid, tid)):
                r = client.get(url, headers=bearer(tokens[who]), follow_redirects=False)
                assert not _gate_refused(r), (who, url, r.status_code, r.text[:200])
    detail = client.get(f"/api/studies/{sid}/", headers=bearer(tokens["alice"]))
    assert detail.json()["name"] == ALICE_STUDY


def test_every_allowed_route_is_a_route_of_the_dashboard(app):
    assert set(ALLOWED) <= set(_dashboard_routes(app))


def test_an_unknown_dashboard_path_or_method_answers_in_json(client, tokens):
    h = bearer(tokens["admin"])
    missing = client.get("/api/no-such-route", headers=h)
    assert missing.status_code == 404 and missing.json()["error"]["code"] == "not_found"
    wrong = client.request("PATCH", "/api/studies", headers=h)
    assert wrong.status_code == 405 and wrong.headers["allow"] == "GET, HEAD, POST"
    assert client.get("/api/no-such-route").status_code == 401  # no token: nothing to learn


def test_non_admin_tokens_cannot_write_through_the_dashboard(client, tokens, studies):
    h = bearer(tokens["alice"])
    sid = studies[ALICE_STUDY]
    for method, path in [("PUT", f"/api/studies/{sid}/note"),
                         ("PUT", f"/api/studies/{sid}/{studies[f'{ALICE_STUDY}/trial']}/note")]:
        r = client.request(method, path, headers=h, json={"version": 1, "body": "x"})
        assert r.status_code == 403, (method, path)
        assert r.json()["error"] == {"code": "forbidden", "details": [], "message":
                                     "the dashboard is read-only for non-admin tokens"}


def test_another_owners_study_tells_nothing_of_its_trials(client, tokens, studies):
    # the trial check ran before the owner check: Bob told Alice's trials (404 "no study")
    # from the rest (404 "no trial ... in study ...") through her study's id
    sid, tid = studies[ALICE_STUDY], studies[f"{ALICE_STUDY}/trial"]
    art = "0123abcd-0000-4000-8000-00000000abcd"
    for trial in (tid, studies[f"{BOB_STUDY}/trial"], 10**6):
        r = client.get(f"/artifacts/{sid}/{trial}/{art}", headers=bearer(tokens["bob"]))
        assert r.status_code == 404, trial
        assert r.json()["error"]["message"] == f"no study with id {sid}", trial


def test_ids_beyond_the_database_integers_answer_404(client, tokens, studies):
    # SQLite's driver raises OverflowError on such an int: 500 from the gate's trial check
    # (any token) and from optuna-dashboard (admins)
    sid, tid = studies[BOB_STUDY], studies[f"{BOB_STUDY}/trial"]
    big, art = 2**63, "0123abcd-0000-4000-8000-00000000abcd"
    for who in ("bob", "admin"):
        h = bearer(tokens[who])
        for method, path in [("GET", f"/artifacts/{sid}/{big}/{art}"),
                             ("HEAD", f"/artifacts/{big}/{tid}/{art}"),
                             ("GET", f"/artifacts/{-big - 1}/{art}"),
                             ("GET", f"/csv/{big}"), ("GET", f"/api/studies/{big}"),
                             ("PUT", f"/api/studies/{sid}/{big}/note"),
                             ("PUT", f"/api/studies/{big}/note")]:
            r = client.request(method, path, headers=h, json={"version": 1, "body": "x"})
            expected = 403 if method == "PUT" and who == "bob" else 404  # bob may not write
            assert r.status_code == expected, (who, method, path, r.text)
    ok = client.get(f"/artifacts/{sid}/{tid}/{art}", headers=bearer(tokens["bob"]))
    assert ok.status_code == 404 and not _gate_refused(ok)  # the gate let it through


@pytest.mark.parametrize(("path", "status"), [
    ("/static/..%2f..%2fpyproject.toml", 403),  # Bottle's HTML page (helper-39)
    ("/static/no-such-file.js", 404),
    ("/artifacts/{sid}/{tid}/0123abcd-0000-4000-8000-00000000abcd", 404),  # plain text
])
def test_the_dashboards_own_refusals_answer_in_the_service_error_shape(
        client, tokens, studies, path, status):
    sid, tid = studies[BOB_STUDY], studies[f"{BOB_STUDY}/trial"]
    r = client.get(path.format(sid=sid, tid=tid), headers=bearer(tokens["bob"]))
    assert r.status_code == status
    assert r.headers["content-type"].startswith("application/json")
    assert r.json() == {"error": {"code": {403: "forbidden", 404: "not_found"}[status],
                                  "message": DASHBOARD_REFUSALS[status], "details": []}}


def test_admin_tokens_can_write_notes_through_the_dashboard(client, tokens, studies):
    h = bearer(tokens["admin"])
    sid, tid = studies[ALICE_STUDY], studies[f"{ALICE_STUDY}/trial"]
    r = client.put(f"/api/studies/{sid}/note", headers=h, json={"version": 1, "body": "a note"})
    assert r.status_code == 204, r.text
    r = client.put(f"/api/studies/{sid}/{tid}/note", headers=h,
                   json={"version": 1, "body": "a trial note"})
    assert r.status_code == 204, r.text


@pytest.mark.parametrize(("body", "content_type", "status", "says"), [
    (b"[]", "application/json", 400, "JSON object"),
    (b"null", "application/json", 400, "JSON object"),
    (b"{", "application/json", 400, "not JSON"),
    (b"\xff", "application/json", 400, "not JSON in UTF-8"),
    (b'{"body": "x"}', "application/json", 400, "version"),
    (b'{"version": "1", "body": "x"}', "application/json", 400, "version"),
    (b'{"version": true, "body": "x"}', "application/json", 400, "version"),
    (b'{"version": 0, "body": "x"}', "application/json", 400, "version"),
    (b'{"version": 1, "body": 3}', "application/json", 400, "body"),
    (b'{"version": 1}', "application/json", 400, "body"),
    (b'{"version": 1, "body": "x"}', "text/plain", 415, "application/json"),
    (b'{"version": 1, "body": "x"}', "", 415, "application/json"),
    (b"[" * 200_000 + b"]" * 200_000, "application/json", 400, "nested too deeply"),
])
def test_a_malformed_note_answers_4xx_in_the_error_shape_and_writes_nothing(
        client, tokens, studies, app, body, content_type, status, says):
    # optuna-dashboard answered 500 (its own shape, a traceback in the log) for a body that
    # is not a JSON object: request.json.get on a list or None
    h = {**bearer(tokens["admin"]), "Content-Type": content_type}
    sid, tid = studies[ALICE_STUDY], studies[f"{ALICE_STUDY}/trial"]
    storage = app.state.components.studies.storage
    for path in (f"/api/studies/{sid}/note", f"/api/studies/{sid}/{tid}/note"):
        r = client.put(path, headers=h, content=body)
        assert r.status_code == status, (path, r.text)
        assert says in r.json()["error"]["message"]
    assert not [k for k in storage.get_study_system_attrs(sid) if "note" in k]
    r = client.put(f"/api/studies/{sid}/note", headers=bearer(tokens["alice"]), content=b"[]")
    assert r.status_code == 403  # who may write is answered first


def test_a_pareto_front_of_a_study_without_2_or_3_objectives_answers_400(client, tokens, app):
    # optuna-dashboard answered 500 (plot_pareto_front's ValueError, a traceback in the log)
    storage = app.state.components.studies.storage
    h, admin = bearer(tokens["alice"]), bearer(tokens["admin"])
    assert client.post("/v1/studies", json=tiny_spec("front1"), headers=h).status_code == 201
    optuna.create_study(study_name="made-outside-4", storage=storage,
                        directions=["minimize"] * 4)  # the service makes none of 4 here
    for name, who, n in [("front1", h, 1), ("made-outside-4", admin, 4)]:
        sid = storage.get_study_id_from_name(name)
        r = client.get(f"/api/studies/{sid}/plot/pareto_front", headers=who)
        assert r.status_code == 400, r.text
        assert r.json()["error"]["message"] == ("plot_type: a Pareto front is drawn for 2 or "
                                                f"3 objectives; this study has {n}")
    sid = storage.get_study_id_from_name("front1")
    r = client.get(f"/api/studies/{sid}/plot/nope", headers=h)
    assert r.status_code == 404 and "no plot 'nope'" in r.json()["error"]["message"]
    other = client.get(f"/api/studies/{sid}/plot/pareto_front", headers=bearer(tokens["bob"]))
    assert other.status_code == 404  # another owner's study: not found, as every route


@pytest.mark.parametrize("path", ["/api/studies/{id}", "/api/studies/{id}/plot/slice",
                                  "/api/studies/{id}/plot/pareto_front", "/csv/{id}",
                                  "/api/studies/{id}/param_importances"])
def test_a_study_id_that_names_nothing_answers_404_to_tokens_that_see_all(client, tokens,
                                                                          studies, path):
    # the breaker: an admin's plot of a missing study answered 500 (optuna-dashboard's
    # "Record does not exist"), its Pareto front 400 ("this study has 0")
    missing = max(studies.values()) + 1000
    for who in ("admin", "alice"):
        r = client.get(path.format(id=missing), headers=bearer(tokens[who]))
        assert r.status_code == 404, (who, r.text)
        assert r.json()["error"]["message"] == f"no study with id {missing}"


@pytest.mark.parametrize("content_type", [["application/json", "text/plain"],
                                          ["application/json", "application/json"]])
def test_a_note_with_two_content_types_is_refused(client, tokens, studies, content_type):
    # the gate read the first, the dashboard the other: 500
    headers = [("authorization", f"Bearer {tokens['admin']}"),
               *(("content-type", t) for t in content_type)]
    r = client.put(f"/api/studies/{studies[ALICE_STUDY]}/note", headers=headers,
                   content=b'{"version": 1, "body": "x"}')
    assert r.status_code == 400
    assert r.json()["error"]["message"] == "one Content-Type header, not 2"


@pytest.mark.parametrize("body", ['{"version": 1, "body": "x"}'.encode("utf-16"),
                                  b'\xef\xbb\xbf{"version": 1, "body": "x"}'])
def test_a_note_not_in_plain_utf8_json_is_refused_in_the_error_shape(client, tokens, studies,
                                                                     body):
    r = client.put(f"/api/studies/{studies[ALICE_STUDY]}/note", content=body, headers={
        **bearer(tokens["admin"]), "Content-Type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["message"] == \
        "the body is not JSON in UTF-8"


def test_a_pareto_front_of_two_objectives_is_drawn(client, tokens, app):
    h = bearer(tokens["alice"])
    spec = tiny_spec("front2", objective=[{"metric": "val_loss", "direction": "minimize"},
                                          {"metric": "val_accuracy", "direction": "maximize"}])
    assert client.post("/v1/studies", json=spec, headers=h).status_code == 201
    sid = app.state.components.studies.storage.get_study_id_from_name("front2")
    r = client.get(f"/api/studies/{sid}/plot/pareto_front", headers=h)
    assert r.status_code == 200 and "data" in r.json(), r.text[:200]


def test_the_dashboard_cannot_change_the_studies_or_trials_even_for_admins(client, tokens,
                                                                           studies, app):
    storage = app.state.components.studies.storage
    sid, tid = studies[ALICE_STUDY], studies[f"{ALICE_STUDY}/trial"]
    before = {s.study_name: s._study_id for s in storage.get_all_studies()}
    admin = bearer(tokens["admin"])
    for method, path, body in [
            ("POST", "/api/studies", {"study_name": "made-here", "directions": ["minimize"]}),
            ("POST", f"/api/studies/{sid}/rename", {"study_name": "renamed"}),
            ("DELETE", f"/api/studies/{sid}", {}),
            ("POST", f"/api/trials/{tid}/tell", {"state": "Fail"}),
            ("POST", f"/api/trials/{tid}/user-attrs", {"user_attrs": {"k": 1}}),
            ("POST", f"/api/studies/{sid}/preference", {"mode": "ChooseWorst", "clicked": 0}),
            ("POST", f"/api/studies/{sid}/{tid}/skip", {}),
            ("POST", f"/api/artifacts/{sid}", {})]:
        r = client.request(method, path, headers=admin, json=body)
        assert r.status_code == 403, (method, path, r.text)
        assert r.json()["error"]["message"] == REFUSED and "/v1" in REFUSED
    # a plain form POST, as another page could send it: never the schema upgrade
    r = client.post("/incompatible-rdb-schema", headers=admin, data={"x": "1"},
                    follow_redirects=False)
    assert r.status_code == 403 and r.json()["error"]["message"] == REFUSED
    assert {s.study_name: s._study_id for s in storage.get_all_studies()} == before
    trial = storage.get_trial(tid)
    assert (trial.state, trial.user_attrs.get("k")) == (optuna.trial.TrialState.COMPLETE, None)
    view = client.get(f"/v1/studies/{ALICE_STUDY}", headers=admin).json()
    assert (view["name"], view["counts"]["complete"]) == (ALICE_STUDY, 1)


def test_open_reads_show_every_study_without_a_token(settings, tokens, studies):
    with TestClient(create_app(settings.replace(open_reads=True))) as c:
        names = [s["study_name"] for s in c.get("/api/studies/").json()["study_summaries"]]
        assert sorted(names) == sorted([ALICE_STUDY, BOB_STUDY])
        assert c.get(f"/api/studies/{studies[ALICE_STUDY]}").status_code == 200
        assert c.put(f"/api/studies/{studies[ALICE_STUDY]}/note",
                     json={"version": 1, "body": "x"}).status_code == 401


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
    record_summary(app, "inf")
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


@pytest.mark.parametrize("method", ["GET", "HEAD"])
@pytest.mark.parametrize("path, file", [
    ("/static/bundle.js", "public/bundle.js"),
    ("/static/bundle.js.LICENSE.txt", "public/bundle.js.LICENSE.txt"),
    ("/favicon.ico", "img/favicon.ico")])
def test_static_files_answer_without_an_accept_encoding_header(client, method, path, file):
    # optuna-dashboard reads request.headers["Accept-Encoding"] unguarded: it answered 500
    expected = (Path(optuna_dashboard.__file__).parent / file).read_bytes()
    request = client.build_request(method, path)
    del request.headers["accept-encoding"]
    r = client.send(request)
    assert r.status_code == 200
    assert r.headers.get("content-encoding") is None
    assert int(r.headers["content-length"]) == len(expected)
    assert r.content == (b"" if method == "HEAD" else expected)


CHECKPOINT = "/srv/hpo-runs/checkpointed/trial_0/checkpoint_000014"  # a server path
NODE_IP = "10.20.30.41"  # a Ray node's internal address


@pytest.fixture
def checkpointed(client, tokens, app) -> int:
    """Alice's study with one trial holding a ``checkpoint`` attribute; its Optuna id."""
    client.post("/v1/studies", json=tiny_spec("checkpointed"), headers=bearer(tokens["alice"]))
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="checkpointed", storage=storage)
    study.add_trial(optuna.trial.create_trial(
        params={"lr": 0.01}, distributions={"lr": optuna.distributions.FloatDistribution(
            1e-3, 0.1, log=True)},
        value=0.5, user_attrs={"checkpoint": CHECKPOINT, "n_steps": 14, "node_ip": NODE_IP,
                               "node_id": "9f3c"}))
    return study._study_id


def _study_attrs(r) -> tuple[list, list, list]:
    data = _strict_json(r.text)
    return ([a["key"] for a in data["union_user_attrs"]],
            [a["key"] for a in data["trials"][0]["user_attrs"]],
            [a["key"] for a in data["best_trials"][0]["user_attrs"]])


@pytest.mark.parametrize("path", ["/api/studies/{}", "/api/studies/{}/", "/api/studies/{}?after=0",
                                  "//api//studies//{}"])
def test_the_dashboard_hides_the_checkpoint_path_from_non_admin_tokens(client, tokens, checkpointed,
                                                                       path):
    alice = bearer(tokens["alice"])
    url = ORIGIN + path.format(checkpointed)
    r = client.get(url, headers=alice)
    assert r.status_code == 200 and CHECKPOINT not in r.text and NODE_IP not in r.text
    assert _study_attrs(r) == (["n_steps", "node_id"],) * 3
    head = client.head(url, headers=alice)
    assert (head.status_code, head.content) == (200, b"")
    assert int(head.headers["content-length"]) == len(r.content)
    admin = client.get(url, headers=bearer(tokens["admin"]))  # admins see what the driver wrote
    assert _study_attrs(admin) == (["checkpoint", "n_steps", "node_id", "node_ip"],) * 3
    assert CHECKPOINT in admin.text and NODE_IP in admin.text


def test_the_dashboard_csv_has_no_checkpoint_column_for_non_admin_tokens(client, tokens,
                                                                         checkpointed):
    r = client.get(f"/csv/{checkpointed}", headers=bearer(tokens["alice"]))
    assert r.status_code == 200
    # the value's column is named by the study's metric (set at create since issue 16.1)
    assert r.text == ("Number,State,val_accuracy,Param lr,UserAttribute n_steps,"
                      "UserAttribute node_id\r\n"
                      "0,COMPLETE,0.5,0.01,14,9f3c\r\n")
    admin = client.get(f"/csv/{checkpointed}", headers=bearer(tokens["admin"]))
    assert admin.text.splitlines()[0] == ("Number,State,val_accuracy,Param lr,"
                                          "UserAttribute checkpoint,UserAttribute n_steps,"
                                          "UserAttribute node_id,UserAttribute node_ip")


@pytest.mark.parametrize("who", ["alice", "admin"])
def test_v1_trials_leave_out_the_checkpoint_path_and_the_node_address(client, tokens,
                                                                       checkpointed, who):
    h = bearer(tokens[who])
    for url in ["/v1/studies/checkpointed/trials/0", "/v1/studies/checkpointed/trials"]:
        r = client.get(url, headers=h)
        assert r.status_code == 200 and CHECKPOINT not in r.text and NODE_IP not in r.text
        trial = r.json() if url.endswith("/0") else r.json()["items"][0]
        assert trial["user_attrs"] == {"n_steps": 14, "node_id": "9f3c"}


def test_open_reads_hide_the_checkpoint_path_too(settings, tokens, checkpointed):
    with TestClient(create_app(settings.replace(open_reads=True))) as c:
        r = c.get(f"/api/studies/{checkpointed}")
        assert r.status_code == 200 and CHECKPOINT not in r.text and NODE_IP not in r.text
        table = c.get(f"/csv/{checkpointed}").text
        assert CHECKPOINT not in table and NODE_IP not in table


def test_the_dashboard_shows_a_failed_trials_reason_as_v1_does(client, tokens, checkpointed,
                                                               app, settings):
    # a FAIL trial's fail_reason holds the error's text as Tune gave it (a traceback with
    # server paths); /v1 answers its one public line, the dashboard answered all of it
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="checkpointed", storage=storage)
    reason = ("Traceback (most recent call last):\n"
              '  File "/srv/hpo/venv/lib/trainers/loop.py", line 12, in fit\n'
              "    raise RuntimeError(msg)\n"
              "RuntimeError: no space left on /srv/hpo-runs/checkpointed/trial_1")
    study.add_trial(optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL,
                                              user_attrs={"fail_reason": reason}))
    public = client.get("/v1/studies/checkpointed/trials/1", headers=bearer(tokens["alice"]))
    line = public.json()["user_attrs"]["fail_reason"]
    assert line == "RuntimeError: no space left on <path>"
    with TestClient(create_app(settings.replace(open_reads=True))) as anonymous:
        for c, h in [(client, bearer(tokens["alice"])), (anonymous, {})]:
            detail = c.get(f"/api/studies/{checkpointed}", headers=h)
            assert detail.status_code == 200 and "/srv/" not in detail.text
            assert {"key": "fail_reason", "value": line} in \
                _strict_json(detail.text)["trials"][1]["user_attrs"]
            table = c.get(f"/csv/{checkpointed}", headers=h)
            assert table.status_code == 200 and "/srv/" not in table.text and line in table.text
    admin = client.get(f"/api/studies/{checkpointed}", headers=bearer(tokens["admin"]))
    assert "/srv/hpo/venv" in admin.text  # admins see what the driver wrote


def _texts(node) -> str:
    """Every string inside a decoded JSON value, one per line (plotly escapes ``/``)."""
    if isinstance(node, str):
        return node + "\n"
    items = node.values() if isinstance(node, dict) else node if isinstance(node, list) else []
    return "".join(_texts(v) for v in items)


@pytest.mark.parametrize("plot", ["timeline", "slice"])
def test_the_dashboard_plots_hover_texts_hide_what_v1_hides(client, tokens, checkpointed, app,
                                                           plot):
    # optuna's hover texts hold each trial's user attributes: the checkpoint path and a
    # failed trial's traceback reached non-admin tokens through the plots
    storage = app.state.components.studies.storage
    optuna.load_study(study_name="checkpointed", storage=storage).add_trial(
        optuna.trial.create_trial(state=optuna.trial.TrialState.FAIL, user_attrs={
            "fail_reason": 'File "/srv/hpo/venv/loop.py", line 1\nValueError: bad'}))
    url = f"/api/studies/{checkpointed}/plot/{plot}"
    r = client.get(url, headers=bearer(tokens["alice"]))
    texts = _texts(json.loads(r.text))
    assert r.status_code == 200 and "/srv/" not in texts
    head = client.head(url, headers=bearer(tokens["alice"]))
    assert int(head.headers["content-length"]) == len(r.content)
    if plot == "timeline":  # its hover texts: the other attributes stay; admins see all
        assert "n_steps" in texts and "ValueError: bad" in texts
        assert CHECKPOINT in _texts(json.loads(
            client.get(url, headers=bearer(tokens["admin"])).text))


@pytest.mark.parametrize("where", ["fail_reason", "choice", "attribute"])
def test_a_br_inside_a_trials_value_hides_the_attributes_all_the_same(client, tokens,
                                                                      checkpointed, app, where):
    """helper-42: optuna joins a hover text's lines with ``<br>``; a ``<br>`` inside a value
    (a member's own error text, a categorical choice, an attribute) made the text fail to
    parse back, and it went out whole, the checkpoint path and node address in it."""
    storage = app.state.components.studies.storage
    hidden = {"checkpoint": CHECKPOINT, "node_ip": NODE_IP}
    choice = optuna.distributions.CategoricalDistribution(["a<br>b", "c"])
    trial = {
        "fail_reason": dict(state=optuna.trial.TrialState.FAIL, user_attrs={
            **hidden, "fail_reason": "ValueError: bad<br>input"}),
        "choice": dict(params={"act": "a<br>b"}, distributions={"act": choice}, value=0.3,
                       user_attrs=hidden),
        "attribute": dict(value=0.3, user_attrs={**hidden, "note<br>": "x<br>y"}),
    }[where]
    optuna.load_study(study_name="checkpointed", storage=storage).add_trial(
        optuna.trial.create_trial(**trial))
    r = client.get(f"/api/studies/{checkpointed}/plot/timeline", headers=bearer(tokens["alice"]))
    texts = _texts(json.loads(r.text))
    assert r.status_code == 200 and CHECKPOINT not in texts and NODE_IP not in texts
    shown = {"fail_reason": '"fail_reason": "ValueError: bad<br>input"',
             "choice": '"act": "a<br>b"', "attribute": '"note<br>": "x<br>y"'}[where]
    assert shown in texts  # the value as it was, its <br> kept
