"""The checks that need a task's datasets run in the driver, not on the request path (issue 13,
point 4): a spec they refuse is created (201), then its study ends FAILED naming the field."""

from __future__ import annotations

import httpx

from service import worker
from service.app import create_app
from service.auth import create_token
from service.settings import Settings
from tests.service.conftest import TestClient, bearer, tiny_spec, wait_for
from tests.service.test_dispatcher import RecordingDispatcher
from tests.service.test_e2e import _admin_token
from trainers.tasks.digits import DigitsTask

# digits with tiny_spec's config plans 23 updates per trial: ASHA's grace period cannot be 500
BEYOND = {"name": "asha", "grace_period": 500}
REASON = ("SpecError: scheduler.grace_period: 500 is beyond the trials' planned updates (23)")


def _no_datasets(self, seed):
    raise AssertionError("a task's datasets were built on the request path")


def test_create_builds_no_dataset_and_the_driver_fails_the_study_naming_the_field(
        db_url, tmp_path, monkeypatch):
    settings = Settings(database_url=db_url, results_dir=tmp_path / "results",
                        run_dispatcher=False, warm_drivers=False)
    app = create_app(settings)
    sessions = app.state.components.sessions
    token = create_token(sessions, "alice")
    with TestClient(app) as client:
        with monkeypatch.context() as m:  # the request process: no dataset may be built
            m.setattr(DigitsTask, "datasets", _no_datasets)
            r = client.post("/v1/studies", json=tiny_spec("beyond", scheduler=BEYOND),
                            headers=bearer(token))
        assert r.status_code == 201, r.text
        assert r.json()["status"] == "QUEUED"
        dispatcher = RecordingDispatcher(settings, sessions, app.state.components.studies)
        try:
            dispatcher.run_once()
            claim = dispatcher.drivers["beyond"].claim
        finally:
            dispatcher.kill_all()
        monkeypatch.setattr(worker, "watch_for_interrupt", lambda event: None)
        worker.drive(settings, sessions, "beyond", claim)  # the driver's start: datasets here
        study = client.get("/v1/studies/beyond", headers=bearer(token)).json()
        trials = client.get("/v1/studies/beyond/trials", headers=bearer(token)).json()
    assert study["status"] == "FAILED"
    assert study["error"] == REASON
    assert trials["total"] == 0


def test_over_http_a_budget_the_datasets_refuse_is_created_then_fails_naming_the_field(
        server_process, sqlite_url):
    server = server_process(sqlite_url)
    token = _admin_token(sqlite_url)
    server.start()
    r = httpx.post(f"{server.url}/v1/studies", json=tiny_spec("beyond-http", scheduler=BEYOND),
                   headers=bearer(token), timeout=60)
    assert r.status_code == 201, r.text

    def ended() -> dict | None:
        study = httpx.get(f"{server.url}/v1/studies/beyond-http", headers=bearer(token),
                          timeout=30).json()
        return study if study["status"] in ("COMPLETED", "STOPPED", "FAILED") else None

    study = wait_for(ended, what="study beyond-http to end")
    assert study["status"] == "FAILED"
    assert study["error"] == REASON

