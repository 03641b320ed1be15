"""A study's result folder and the model store never share a path (found by the breaker: a
member's study named ``artifacts`` had the default model store, ``<HPO_RESULTS_DIR>/
artifacts``, as its result folder, and its delete removed every owner's kept models)."""

from __future__ import annotations

import pytest

from hpo.models import study_dir_clash
from service import study_purge
from service.db import Status, StudyRow
from service.settings import Settings
from tests.service.conftest import bearer, tiny_spec


@pytest.fixture(params=[None, "models", "models/inner"])
def settings(sqlite_url, tmp_path, request) -> Settings:
    """The default model store, or one set among the results (its first folder is taken)."""
    results = tmp_path / "results"
    return Settings(database_url=sqlite_url, results_dir=results, run_dispatcher=False,
                    artifact_dir=request.param and results / request.param)


def test_a_study_named_as_the_model_store_is_refused_naming_the_field(client, app, tokens,
                                                                       tmp_path):
    settings: Settings = app.state.components.settings
    taken = settings.artifacts_path.relative_to(settings.results_dir).parts[0]
    (settings.artifacts_path / "kept-model").mkdir(parents=True)
    answer = client.post("/v1/studies", json=tiny_spec(taken), headers=bearer(tokens["bob"]))
    assert answer.status_code == 422, answer.text
    problem = answer.json()["error"]["details"][0]
    assert problem["loc"] == "name" and "artifact directory" in problem["msg"], problem
    assert str(tmp_path) not in answer.text  # no server path in the answer
    assert client.get("/v1/studies", headers=bearer(tokens["admin"])).json()["items"] == []
    for fine in (f"{taken}2", f"{taken}.x", "x"):  # only that name
        assert client.post("/v1/studies", json=tiny_spec(fine),
                           headers=bearer(tokens["bob"])).status_code == 201


def test_the_clash_rule_sees_through_path_forms(tmp_path):
    results = tmp_path / "runs"
    (results / "store").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (results / "link").symlink_to(results / "store")
    assert study_dir_clash(results, "artifacts", results / "artifacts") is not None
    assert study_dir_clash(results, "ARTIFACTS", results / "artifacts") is not None  # macOS
    assert study_dir_clash(results, "store", tmp_path / "runs" / ".." / "runs" / "store")
    assert study_dir_clash(results, "link", results / "store") is not None  # same folder
    assert study_dir_clash(results, "store", results / "store" / "deep") is not None
    assert study_dir_clash(results, "x", results) is not None  # store holds every study
    assert study_dir_clash(results, "store", tmp_path / "elsewhere") is None
    # the FSDP trials' shared scratch, whatever the store (found by the review)
    assert "FSDP" in study_dir_clash(results, "fsdp-checkpoints", tmp_path / "elsewhere")
    assert "FSDP" in study_dir_clash(results, "FSDP-Checkpoints", tmp_path / "elsewhere")
    assert study_dir_clash(results, "artifacts2", results / "artifacts") is None


def test_a_delete_never_removes_the_model_store_as_a_result_folder(client, app, tokens):
    """A study of that name stored before the rule (its row written here by hand): its
    delete removes its row and Optuna study but leaves the store's files."""
    c = app.state.components
    assert client.post("/v1/studies", json=tiny_spec("artifacts-old"),
                       headers=bearer(tokens["bob"])).status_code == 201
    with c.sessions.begin() as session:  # renamed, as a version before the rule let it be
        row = session.query(StudyRow).filter_by(name="artifacts-old").one()
        row.name, row.status = "artifacts", Status.DELETING
    c.studies.storage.get_study_id_from_name("artifacts-old")
    kept = c.settings.artifacts_path / "a-kept-model"
    kept.parent.mkdir(parents=True)
    kept.write_bytes(b"weights")
    study_purge.purge(c.settings, c.sessions, c.studies.storage, "artifacts")
    assert kept.read_bytes() == b"weights"
    with c.sessions.begin() as session:
        assert session.query(StudyRow).filter_by(name="artifacts").one_or_none() is None
