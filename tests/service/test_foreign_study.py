"""A study that only Optuna knows (created directly with Optuna in the service's database, no
row of the service) never breaks ``/v1`` and is shown read-only in the dashboard (issue 16,
point 4): ``/v1`` lists none of it, reads answer 404 (pointing those who see every study to the
dashboard), stop and delete 409 for admins, create with its name 409 naming it; the dashboard
shows it to admins and viewers, not to members, and refuses its notes to everyone. On SQLite
and PostgreSQL."""

from __future__ import annotations

import optuna
import pytest
import sqlalchemy as sa

from service.app import create_app
from service.auth import create_token
from service.dashboard import FOREIGN
from service.db import StudyRow
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec

pytestmark = pytest.mark.filterwarnings(  # set_metric_names, as an Optuna user calls it
    "ignore::optuna.exceptions.ExperimentalWarning")

FOREIGN_STUDY = "made-with-optuna"
READ_HINT = (f"study {FOREIGN_STUDY!r} was made outside the service, directly with Optuna: "
             "/v1 does not manage it; read it in the dashboard (/dashboard)")
WRITE_REFUSAL = (f"study {FOREIGN_STUDY!r} was made outside the service, directly with "
                 "Optuna: the service does not stop or delete it (Optuna's own API or "
                 "`optuna delete-study` does)")
NOT_FOUND = f"no study named {FOREIGN_STUDY!r}"


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(database_url=db_url, results_dir=tmp_path / "results", run_dispatcher=False)


@pytest.fixture
def foreign(app, tokens) -> int:
    """An Optuna-only study with two finished trials (one with intermediate values), made
    beside a study of the service's; its Optuna study id."""
    tokens["viewer"] = create_token(app.state.components.sessions, "watcher", role="viewer")
    storage = app.state.components.studies.storage
    study = optuna.create_study(study_name=FOREIGN_STUDY, storage=storage,
                                direction="maximize")
    study.set_metric_names(["score"])
    study.optimize(lambda t: (t.report(0.5, 1), t.suggest_float("x", 0, 1))[1], n_trials=2)
    return study._study_id


@pytest.fixture
def owned(client, tokens) -> None:
    assert client.post("/v1/studies", json=tiny_spec("alices"),
                       headers=bearer(tokens["alice"])).status_code == 201


def _error(r, status: int) -> str:
    assert r.status_code == status, r.text
    return r.json()["error"]["message"]


def test_v1_lists_only_the_services_own_studies(client, tokens, foreign, owned):
    for who in ("admin", "alice", "viewer"):
        page = client.get("/v1/studies", headers=bearer(tokens[who])).json()
        assert [s["name"] for s in page["items"]] == ["alices"], who
        assert page["total"] == 1


def test_reading_it_through_v1_answers_404_pointing_whoever_sees_it_to_the_dashboard(
        client, tokens, foreign):
    for path in (f"/v1/studies/{FOREIGN_STUDY}", f"/v1/studies/{FOREIGN_STUDY}/trials",
                 f"/v1/studies/{FOREIGN_STUDY}/trials?intermediate=true",
                 f"/v1/studies/{FOREIGN_STUDY}/trials/0",
                 f"/v1/studies/{FOREIGN_STUDY}/model",
                 f"/v1/studies/{FOREIGN_STUDY}/trials/0/model"):
        for who, message in [("admin", READ_HINT), ("viewer", READ_HINT),
                             ("alice", NOT_FOUND), ("bob", NOT_FOUND)]:
            assert _error(client.get(path, headers=bearer(tokens[who])), 404) == message, \
                (path, who)


def test_open_reads_point_to_the_dashboard_too(settings, foreign):
    with TestClient(create_app(settings.replace(open_reads=True))) as c:
        assert _error(c.get(f"/v1/studies/{FOREIGN_STUDY}"), 404) == READ_HINT


def test_stop_and_delete_refuse_it_and_leave_it_intact(client, tokens, foreign, app):
    for method, path in [("POST", f"/v1/studies/{FOREIGN_STUDY}/stop"),
                         ("DELETE", f"/v1/studies/{FOREIGN_STUDY}")]:
        r = client.request(method, path, headers=bearer(tokens["admin"]))
        assert _error(r, 409) == WRITE_REFUSAL, (method, r.text)
        r = client.request(method, path, headers=bearer(tokens["alice"]))  # nobody's: unseen
        assert _error(r, 404) == NOT_FOUND
        r = client.request(method, path, headers=bearer(tokens["viewer"]))
        assert _error(r, 403) == "token 'watcher' has the role 'viewer', which may only read"
    study = optuna.load_study(study_name=FOREIGN_STUDY,
                              storage=app.state.components.studies.storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE", "COMPLETE"]


def test_creating_a_study_of_its_name_answers_409_naming_it_and_stores_nothing(
        client, tokens, foreign, app):
    for who in ("admin", "alice"):
        r = client.post("/v1/studies", json=tiny_spec(FOREIGN_STUDY),
                        headers=bearer(tokens[who]))
        assert _error(r, 409) == (
            f"a study named {FOREIGN_STUDY!r} exists already in the Optuna storage, made "
            "outside the service (directly with Optuna): choose another name")
    with app.state.components.sessions() as session:
        assert session.execute(sa.select(StudyRow).where(
            StudyRow.name == FOREIGN_STUDY)).first() is None
    study = optuna.load_study(study_name=FOREIGN_STUDY,
                              storage=app.state.components.studies.storage)
    assert study.user_attrs == {} and len(study.trials) == 2  # no spec written into it
    assert study.metric_names == ["score"]


def test_warm_starting_from_it_is_refused_naming_the_field(client, tokens, foreign):
    spec = tiny_spec("warm", warm_start=[{"study": FOREIGN_STUDY, "top_k": 1}])
    r = client.post("/v1/studies", json=spec, headers=bearer(tokens["admin"]))
    assert r.status_code == 422, r.text
    assert [d["loc"] for d in r.json()["error"]["details"]] == ["warm_start.0.study"]


def test_the_dashboard_shows_it_read_only_to_admins_and_viewers_and_not_to_members(
        client, tokens, foreign, owned):
    for who, listed in [("admin", True), ("viewer", True), ("alice", False)]:
        h = bearer(tokens[who])
        names = [s["study_name"] for s in
                 client.get("/api/studies", headers=h).json()["study_summaries"]]
        assert (FOREIGN_STUDY in names) is listed, who
        r = client.get(f"/api/studies/{foreign}", headers=h)
        assert r.status_code == (200 if listed else 404), (who, r.text)
        if listed:
            assert [t["number"] for t in r.json()["trials"]] == [0, 1]
            assert r.json()["objective_names"] == ["score"]
            assert client.get(f"/csv/{foreign}",
                              headers=h).status_code == 200
    admin = bearer(tokens["admin"])
    trial_id = optuna.load_study(study_name=FOREIGN_STUDY,
                                 storage=client.app.state.components.studies.storage
                                 ).trials[0]._trial_id
    for path in (f"/api/studies/{foreign}/note", f"/api/studies/{foreign}/{trial_id}/note"):
        r = client.put(path, headers=admin, json={"version": 1, "body": "x"})
        assert _error(r, 403) == FOREIGN, path


def test_the_services_own_studies_keep_their_admin_notes(client, tokens, foreign, owned, app):
    sid = app.state.components.studies.storage.get_study_id_from_name("alices")
    r = client.put(f"/api/studies/{sid}/note", headers=bearer(tokens["admin"]),
                   json={"version": 1, "body": "a note"})
    assert r.status_code == 204, r.text


def test_open_reads_show_it_in_the_dashboard_and_refuse_its_notes(settings, tokens, foreign):
    with TestClient(create_app(settings.replace(open_reads=True))) as c:
        names = [s["study_name"] for s in c.get("/api/studies").json()["study_summaries"]]
        assert names == [FOREIGN_STUDY]
        assert c.get(f"/api/studies/{foreign}").status_code == 200
        r = c.put(f"/api/studies/{foreign}/note", headers=bearer(tokens["admin"]),
                  json={"version": 1, "body": "x"})
        assert _error(r, 403) == FOREIGN
