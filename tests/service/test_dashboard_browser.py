"""A headless Chromium loads the dashboard of a finished study through the service's auth and
renders its charts and its trials (Debian's /usr/bin/chromium; skipped where it is absent)."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import optuna
import pytest

from tests.service.conftest import bearer, tiny_spec

CHROMIUM = os.environ.get("HPO_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")


def _rendered_dom(url: str) -> str:
    """The DOM after the page's scripts ran (Chromium's virtual time runs them to rest)."""
    proc = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--virtual-time-budget=20000", "--dump-dom", url],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return proc.stdout


def _text(dom: str) -> str:
    body = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


def test_dashboard_of_a_finished_study_renders_its_chart_and_trials(client, live_server,
                                                                     tokens, app):
    client.post("/v1/studies", json=tiny_spec("browser", n_trials=5),
                headers=bearer(tokens["alice"]))
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="browser", storage=storage)
    for i in range(5):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
        for step in range(3):
            trial.report(0.1 * i + 0.01 * step, step)
        study.tell(trial, 0.1 * i + 0.02)
    sid = storage.get_study_id_from_name("browser")
    token = tokens["alice"]  # not an admin: the read-only view

    page = _rendered_dom(f"{live_server}/dashboard/studies/{sid}?token={token}")
    assert "js-plotly-plot" in page and "main-svg" in page  # plotly drew its charts
    text = _text(page)
    assert "browser (id=" in text and "History" in text
    assert "Best Trial (number=4)" in text

    trials = _text(_rendered_dom(f"{live_server}/dashboard/studies/{sid}/trials?token={token}"))
    assert "5 Trials" in trials
    assert all(f"Trial {n}" in trials for n in range(5)) and "Complete" in trials

    refused = _rendered_dom(f"{live_server}/dashboard/studies/{sid}")
    assert "Token needed" in refused and "js-plotly-plot" not in refused
