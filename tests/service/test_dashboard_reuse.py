"""The dashboard under a reused study id (SQLite gives a deleted study's id to the next one)
and its own server errors: the breaker's findings (helper-33)."""

from __future__ import annotations

import optuna
import pytest

from tests.service.conftest import TestClient, bearer, record_summary, tiny_spec

WIDE = {"lr": {"type": "float", "low": 1e-3, "high": 0.1, "log": True},
        "depth": {"type": "int", "low": 1, "high": 3}}
NARROW = {"weight_decay": {"type": "float", "low": 0.0, "high": 0.1}}


def _create_with_trials(client, app, token: str, name: str, space: dict, n: int) -> int:
    """Study ``name`` with ``n`` COMPLETE trials over ``space``; its Optuna study id."""
    r = client.post("/v1/studies", json=tiny_spec(name, search_space=space),
                    headers=bearer(token))
    assert r.status_code == 201, r.text
    study = optuna.load_study(study_name=name, storage=app.state.components.studies.storage)
    dists = {"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True),
             "depth": optuna.distributions.IntDistribution(1, 3),
             "weight_decay": optuna.distributions.FloatDistribution(0.0, 0.1)}
    for k in range(n):
        trial = study.ask({p: dists[p] for p in space})
        trial.set_user_attr(f"{name}-attr", k)
        study.tell(trial, 0.1 * (k + 1))
    record_summary(app, name)
    return study._study_id


def _seen(client, token: str, study_id: int) -> set[str]:
    """Every parameter and user attribute name the dashboard shows of ``study_id``."""
    h = bearer(token)
    detail = client.get(f"/api/studies/{study_id}", headers=h)
    assert detail.status_code == 200, detail.text
    data = detail.json()
    names = {p["name"] for key in ("union_search_space", "intersection_search_space")
             for p in data[key]}
    names |= {a["key"] for a in data["union_user_attrs"]}
    names |= {p["name"] for t in data["trials"] for p in t["params"]}
    importances = client.get(f"/api/studies/{study_id}/param_importances", headers=h)
    assert importances.status_code == 200, importances.text
    names |= {i["name"] for objective in importances.json()["param_importances"]
              for i in objective}
    return names


@pytest.mark.parametrize("n_new", [0, 3], ids=["new-study-empty", "new-study-with-trials"])
def test_a_reused_study_id_shows_nothing_of_the_deleted_study(client, app, tokens, n_new):
    """Alice's study is shown (its caches filled), deleted, and Bob's next study gets its
    id: Bob sees his study alone, empty or with the same number of trials as hers (the
    importance cache was keyed by that number)."""
    gone = _create_with_trials(client, app, tokens["alice"], "alice-old", WIDE, 3)
    assert _seen(client, tokens["alice"], gone) >= {"lr", "depth", "alice-old-attr"}
    assert client.delete("/v1/studies/alice-old",
                         headers=bearer(tokens["alice"])).status_code == 204
    reused = _create_with_trials(client, app, tokens["bob"], "bob-new", NARROW, n_new)
    assert reused == gone  # SQLite's INTEGER PRIMARY KEY: the case under test
    expected = {"weight_decay", "bob-new-attr"} if n_new else set()
    assert _seen(client, tokens["bob"], reused) == expected
    assert _seen(client, tokens["admin"], reused) == expected


def test_the_same_name_created_again_is_a_new_study_to_the_dashboard(client, app, tokens):
    """A name freed by a delete and taken again (same id, same name): still a new study."""
    first = _create_with_trials(client, app, tokens["alice"], "again", WIDE, 3)
    assert "depth" in _seen(client, tokens["alice"], first)
    assert client.delete("/v1/studies/again",
                         headers=bearer(tokens["alice"])).status_code == 204
    second = _create_with_trials(client, app, tokens["bob"], "again", NARROW, 2)
    assert second == first
    assert _seen(client, tokens["bob"], second) == {"weight_decay", "again-attr"}


def test_every_api_process_forgets_a_reused_id_it_cached(settings, tokens):
    """Two apps on one database, as ``HPO_API_PROCESSES`` runs them: the study deleted and
    created again through one is not shown stale by the other."""
    from service.app import create_app

    first, second = create_app(settings), create_app(settings)
    with TestClient(first) as a, TestClient(second) as b:
        gone = _create_with_trials(a, first, tokens["alice"], "alice-old", WIDE, 3)
        assert "lr" in _seen(b, tokens["admin"], gone)  # cached in the second process
        assert a.delete("/v1/studies/alice-old",
                        headers=bearer(tokens["alice"])).status_code == 204
        reused = _create_with_trials(a, first, tokens["bob"], "bob-new", NARROW, 3)
        assert reused == gone
        assert _seen(b, tokens["admin"], reused) == {"weight_decay", "bob-new-attr"}


@pytest.mark.parametrize("who", ["alice", "admin"])
@pytest.mark.parametrize("deleted", [True, False], ids=["study-deleted-meanwhile", "a-bug"])
@pytest.mark.parametrize("path", ["/csv/{id}", "/api/studies/{id}",
                                  "/api/studies/{id}/plot/timeline"])
def test_a_failure_inside_the_dashboard_answers_in_the_service_error_shape(
        client, app, tokens, monkeypatch, who, deleted, path):
    """The study deleted while the dashboard reads it (its trials gone after its name was
    read: a KeyError that Bottle answered with its HTML error page, or optuna-dashboard with
    ``{"reason": ...}``): 404 naming the study; any other failure: 500 ``internal``,
    without the exception's text."""
    study_id = _create_with_trials(client, app, tokens["alice"], "alice-s", WIDE, 2)
    storage = app.state.components.studies.storage

    def failing(*args, **kwargs):
        if deleted:
            storage.delete_study(study_id)
            raise KeyError("Record does not exist.")
        raise RuntimeError("a bug at /srv/secret/path")

    monkeypatch.setattr(storage, "get_all_trials", failing)  # the study detail's read
    monkeypatch.setattr(optuna.study.Study, "get_trials", failing)  # the CSV's, the plots'
    r = client.get(path.format(id=study_id), headers=bearer(tokens[who]))
    assert r.headers["content-type"] == "application/json"
    if deleted:
        assert (r.status_code, r.json()["error"]) == (404, {
            "code": "not_found", "message": f"no study with id {study_id}", "details": []})
    else:
        assert (r.status_code, r.json()["error"]["code"]) == (500, "internal")
        assert "/srv" not in r.text


@pytest.mark.parametrize("query, status", [
    ("after=0", 200), ("after=1", 200), ("after=99999", 200), ("after=1&after=0", 200),
    ("after=x", 400), ("after=-1", 400), ("after=", 400), ("after=1.5", 400),
    ("after=%D9%A3", 400), ("after=" + "9" * 19, 400), ("after=1&after=y", 400)])
def test_the_study_detail_takes_after_as_a_count_or_answers_400_naming_it(
        client, app, tokens, query, status):
    """``?after=x`` was a 500 of optuna-dashboard (``int()`` outside its try), and ``-1`` a 400
    of its own shape."""
    study_id = _create_with_trials(client, app, tokens["alice"], "paged", WIDE, 2)
    r = client.get(f"/api/studies/{study_id}?{query}", headers=bearer(tokens["alice"]))
    assert r.status_code == status, r.text
    if status == 400:
        assert r.json()["error"]["message"].startswith("after: ")
    else:
        assert len(r.json()["trials"]) == max(0, 2 - int(query.split("&")[-1][6:]))
