"""Issue 16.3-4: a trial's kept model through ``/v1`` (owner, other owner, viewer), through
``hpo model``, through the dashboard's artifact route, and gone with its study."""

from __future__ import annotations

import io
import sys

import optuna
import pytest
import sqlalchemy as sa
import torch
from typer.testing import CliRunner

import trainers
from hpo.cli import app as hpo_app
from hpo.models import ModelKeeper, artifact_store, model_meta
from hpo.record import StudyRecord
from hpo.spec import parse_spec
from service.auth import create_token
from service.db import Status, StudyRow
from tests.service.conftest import bearer, record_summary, tiny_spec
from trainers.checkpoint import latest_checkpoint
from trainers.model_file import FORMAT, load_model_file

NAME = "kept"
VALUES = [0.80, 0.95, 0.90]  # val_accuracy (maximized) of trials 0, 1, 2; keep_models 2


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> str:
    root = tmp_path_factory.mktemp("ckpt")
    task, config = trainers.create("digits", {
        "max_updates": 4, "max_epochs": None, "eval_interval": 4, "micro_batch_size": 32,
        "width": 16, "device": "cpu", "checkpoint_dir": str(root)})
    trainers.fit(task, config)
    return str(latest_checkpoint(root))


@pytest.fixture
def world(client, app, tokens, checkpoint) -> dict:
    """Alice's study with three COMPLETE trials, written as its driver would; 1 and 2 keep
    their models."""
    data = tiny_spec(NAME, keep_models=2)
    assert client.post("/v1/studies", json=data, headers=bearer(tokens["alice"])).status_code \
        == 201
    c = app.state.components
    spec = parse_spec(data)
    store = artifact_store(c.settings.artifacts_path)
    record = StudyRecord(spec, c.studies.storage, compare_spec=False,
                         models=ModelKeeper(spec, store))
    for i, value in enumerate(VALUES):
        record.ask(f"r{i}")
        record.result(f"r{i}", {"step": 4, "planned_updates": 4, "val_accuracy": value,
                                "checkpoint_location": checkpoint})
        record.complete_or_prune(f"r{i}", "fifo")
    record_summary(app, NAME)
    vera = create_token(c.sessions, "vera", role="viewer")
    study = optuna.load_study(study_name=NAME, storage=c.studies.storage)
    return {**tokens, "vera": vera, "study": study, "dir": c.settings.artifacts_path}


def _no_path(r, world) -> None:
    text = r.text if r.headers.get("content-type", "").startswith("application/json") else \
        r.headers.get("content-disposition", "")
    assert str(world["dir"]) not in text and "/tmp" not in text and "artifacts" not in text


def test_the_owner_downloads_a_kept_model_and_the_best_by_default(client, world):
    r = client.get(f"/v1/studies/{NAME}/trials/2/model", headers=bearer(world["alice"]))
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/octet-stream"
    assert r.headers["content-disposition"] == f'attachment; filename="{NAME}-trial2.pt"'
    model = torch.load(io.BytesIO(r.content), weights_only=True)
    assert model["format"] == FORMAT and model["origin"]["trial"] == 2
    assert model["origin"]["values"] == [0.90]
    best = client.get(f"/v1/studies/{NAME}/model", headers=bearer(world["alice"]))
    assert best.status_code == 200
    assert best.headers["content-disposition"] == f'attachment; filename="{NAME}-trial1.pt"'
    assert torch.load(io.BytesIO(best.content), weights_only=True)["origin"]["trial"] == 1
    _no_path(r, world)


def test_another_owner_gets_404_and_a_viewer_reads(client, world):
    for path in (f"/v1/studies/{NAME}/model", f"/v1/studies/{NAME}/trials/1/model"):
        r = client.get(path, headers=bearer(world["bob"]))
        assert r.status_code == 404 and r.json()["error"]["message"] == \
            f"no study named {NAME!r}"
        viewer = client.get(path, headers=bearer(world["vera"]))
        assert viewer.status_code == 200
        owner = client.get(path, headers=bearer(world["alice"]))
        assert viewer.content == owner.content
    assert client.get(f"/v1/studies/{NAME}/model").status_code == 401


def test_a_trial_without_a_kept_model_or_unknown_answers_404_saying_why(client, world):
    r = client.get(f"/v1/studies/{NAME}/trials/0/model", headers=bearer(world["alice"]))
    assert r.status_code == 404
    assert r.json()["error"]["message"] == (
        f"trial 0 of study {NAME!r} has no kept model: a study keeps the final models of its "
        "best 2 COMPLETE trials (spec field keep_models)")
    _no_path(r, world)
    r = client.get(f"/v1/studies/{NAME}/trials/99/model", headers=bearer(world["alice"]))
    assert r.status_code == 404 and r.json()["error"]["message"] == \
        f"study {NAME!r} has no trial 99"


def test_a_study_without_complete_trials_has_no_best_model(client, tokens, app):
    client.post("/v1/studies", json=tiny_spec("empty"), headers=bearer(tokens["alice"]))
    r = client.get("/v1/studies/empty/model", headers=bearer(tokens["alice"]))
    assert r.status_code == 404
    assert r.json()["error"]["message"] == "study 'empty' has no COMPLETE trial yet, so no model"
    with app.state.components.sessions.begin() as session:  # it ended: no "yet"
        session.execute(sa.update(StudyRow).where(StudyRow.name == "empty").values(
            status=Status.COMPLETED))
    r = client.get("/v1/studies/empty/model", headers=bearer(tokens["alice"]))
    assert r.json()["error"]["message"] == "study 'empty' has no COMPLETE trial, so no model"


def test_the_dashboard_lists_and_serves_the_artifact_to_its_owner_only(client, world):
    study, trial = world["study"], world["study"].trials[1]
    meta = model_meta(study._storage, trial, NAME)
    path = f"/artifacts/{study._study_id}/{trial._trial_id}/{meta['artifact_id']}"
    r = client.get(path, headers=bearer(world["alice"]))
    assert r.status_code == 200
    api = client.get(f"/v1/studies/{NAME}/trials/1/model", headers=bearer(world["alice"]))
    assert r.content == api.content
    assert client.get(path, headers=bearer(world["bob"])).status_code == 404
    detail = client.get(f"/api/studies/{study._study_id}", headers=bearer(world["alice"]))
    listed = {t["number"]: [a["filename"] for a in t["artifacts"]]
              for t in detail.json()["trials"]}
    assert listed == {0: [], 1: [f"{NAME}-trial1.pt"], 2: [f"{NAME}-trial2.pt"]}


def test_deleting_the_study_deletes_its_model_files(client, world):
    files = sorted(p.name for p in world["dir"].iterdir())
    assert len(files) == 2
    assert client.delete(f"/v1/studies/{NAME}", headers=bearer(world["bob"])).status_code == 404
    assert sorted(p.name for p in world["dir"].iterdir()) == files
    assert client.delete(f"/v1/studies/{NAME}", headers=bearer(world["alice"])).status_code == 204
    assert list(world["dir"].iterdir()) == []


def test_hpo_model_writes_the_file(live_server, world, tmp_path, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("HPO_URL", live_server)
    monkeypatch.setenv("HPO_TOKEN", world["alice"])
    monkeypatch.chdir(out)
    runner = CliRunner()
    result = runner.invoke(hpo_app, ["model", NAME, "-o", str(out / "best.pt")])
    assert result.exit_code == 0, result.output
    assert load_model_file(out / "best.pt")["origin"]["trial"] == 1
    # the interpreter hpo runs in (its venv's), which has torch and trainers
    assert f"{sys.executable} -m trainers evaluate" in result.output
    result = runner.invoke(hpo_app, ["model", NAME, "--trial", "2"])  # the service's name
    assert result.exit_code == 0, result.output
    assert load_model_file(out / f"{NAME}-trial2.pt")["origin"]["trial"] == 2
    result = runner.invoke(hpo_app, ["model", NAME, "--trial", "0"])
    assert result.exit_code == 1 and "keep_models" in result.output
    assert not (out / f"{NAME}-trial0.pt").exists()
    monkeypatch.setenv("HPO_TOKEN", world["bob"])
    result = runner.invoke(hpo_app, ["model", NAME])
    assert result.exit_code == 1 and "404" in result.output
    assert sorted(p.name for p in out.iterdir()) == ["best.pt", f"{NAME}-trial2.pt"]


def test_a_trial_of_another_study_is_not_reached_through_a_study_one_sees(client, world):
    # optuna-dashboard finds a trial's artifact by the trial's id alone: bob's own study id
    # with alice's trial id served alice's model to bob
    assert client.post("/v1/studies", json=tiny_spec("bobs"),
                       headers=bearer(world["bob"])).status_code == 201
    study, trial = world["study"], world["study"].trials[1]
    meta = model_meta(study._storage, trial, NAME)
    bobs = optuna.load_study(study_name="bobs", storage=study._storage)._study_id
    for who in ("bob", "admin"):  # admins too: the path names a trial the study lacks
        r = client.get(f"/artifacts/{bobs}/{trial._trial_id}/{meta['artifact_id']}",
                       headers=bearer(world[who]))
        assert r.status_code == 404, who
        assert r.json()["error"]["message"] == \
            f"no trial with id {trial._trial_id} in study {bobs}"
    # the same rule for a trial's note, which optuna-dashboard also writes by trial id
    storage = study._storage
    before = [storage.get_study_system_attrs(i) for i in (study._study_id, bobs)]
    r = client.put(f"/api/studies/{bobs}/{trial._trial_id}/note",
                   json={"version": 1, "body": "moved"}, headers=bearer(world["admin"]))
    assert r.status_code == 404
    assert [storage.get_study_system_attrs(i) for i in (study._study_id, bobs)] == before
    ok = client.get(f"/artifacts/{study._study_id}/{trial._trial_id}/{meta['artifact_id']}",
                    headers=bearer(world["admin"]))
    assert ok.status_code == 200
