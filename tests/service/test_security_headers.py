"""Every answer of the service carries the headers that keep another site's page from using
it (service.middleware.SecurityHeaders), the dashboard's and its files' included."""

from __future__ import annotations

from pathlib import Path

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from tests.service.conftest import bearer, tiny_spec


@pytest.fixture
def artifact(client, tokens, app, tmp_path) -> str:
    """The path of a file kept as an artifact of alice's study's trial."""
    client.post("/v1/studies", json=tiny_spec("kept"), headers=bearer(tokens["alice"]))
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="kept", storage=storage)
    trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
    store = FileSystemArtifactStore(Path(app.state.components.settings.artifacts_path))
    Path(app.state.components.settings.artifacts_path).mkdir(parents=True, exist_ok=True)
    (tmp_path / "m.txt").write_text("<script>alert(1)</script>")
    art = upload_artifact(artifact_store=store, file_path=str(tmp_path / "m.txt"),
                          study_or_trial=trial)
    study.tell(trial, 0.5)
    return f"/artifacts/{study._study_id}/{trial._trial_id}/{art}"


@pytest.mark.parametrize("who", ["alice", None])
def test_every_answer_carries_nosniff_and_may_be_framed_by_its_own_origin_only(
        client, tokens, artifact, who):
    h = bearer(tokens[who]) if who else {}
    paths = ["/v1/studies", "/v1/studies/kept", "/v1/nope", "/healthz", "/docs",
             "/openapi.json", "/dashboard", "/dashboard/login", "/api/studies", "/api/meta",
             "/static/bundle.js", "/csv/1", artifact]
    for path in paths:
        r = client.get(path, headers=h)
        assert r.headers["x-content-type-options"] == "nosniff", (path, r.status_code)
        assert r.headers["x-frame-options"] == "SAMEORIGIN", path
        assert "access-control-allow-origin" not in r.headers, path
        csp = r.headers.get("content-security-policy")
        assert csp is None or "frame-ancestors" in csp, (path, csp)
        if who and path == "/dashboard":  # optuna-dashboard's policy, which named none
            assert csp.endswith("; frame-ancestors 'self'") and "default-src 'self'" in csp
        if path == "/dashboard/login":  # the service's own page keeps its stricter one
            assert csp.endswith("frame-ancestors 'none'") and csp.count("frame-ancestors") == 1


def test_an_artifact_is_served_without_its_wildcard_cors_header(client, tokens, artifact):
    # optuna-dashboard sends Access-Control-Allow-Origin: * with every artifact
    r = client.get(artifact, headers=bearer(tokens["alice"]))
    assert r.status_code == 200 and r.text == "<script>alert(1)</script>"
    assert "access-control-allow-origin" not in r.headers
    assert r.headers["x-content-type-options"] == "nosniff"
