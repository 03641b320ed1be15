"""A headless Chromium logs in through the dashboard's login form, then loads the dashboard of a
finished study and renders its charts and its trials; and for a PBT study run on Ray, the page
shows the metric's name on the history plot's axis, the study's note, learning curves with
points and the lineage chart with one trace per member (issue 16, point 5).

Debian's /usr/bin/chromium (``.ci/run`` installs it where it is absent; skipped, saying so,
where it cannot be found). Chromium is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: fd 3 in, fd 4 out, one JSON message per NUL-terminated line).
Every step leaves a screenshot, ``NN-step.png``, in the test's ``tmp_path / "screenshots"``,
for people to look at when a test fails.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import select
import shutil
import subprocess
import time

import httpx
import optuna
import pytest

from hpo.spec import parse_spec
from hpo.tune.driver import run_study
from service.app import create_app
from service.auth import create_token
from tests.service.conftest import bearer, free_port, serve_in_thread, tiny_spec

CHROMIUM = os.environ.get("HPO_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                 reason=f"no Chromium at {CHROMIUM}: install Debian's "
                                 "(apt-get install chromium; .ci/run does where it may) or "
                                 "set HPO_TEST_CHROMIUM to a Chromium")]


class Chromium:
    """One headless Chromium with a fresh profile, one page, driven over the DevTools pipe."""

    def __init__(self, profile_dir, screenshots_dir) -> None:
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4
        wrap = f'exec 3<&{to_chrome} 4>&{from_chrome} {to_chrome}<&- {from_chrome}>&-; exec "$@"'
        self.proc = subprocess.Popen(
            ["bash", "-c", wrap, "bash", CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", f"--user-data-dir={profile_dir}",
             "--window-size=1400,1000", "about:blank"],
            pass_fds=(to_chrome, from_chrome), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer, self._next_id, self.events = b"", 0, []
        self.screenshots_dir, self.n_screenshots = screenshots_dir, 0
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target,
                                 flatten=True)["sessionId"]
        self.call("Page.enable", session=True)

    def call(self, method: str, session: bool = False, **params) -> dict:
        """Send one command; its result (events that arrive meanwhile go to ``events``)."""
        self._next_id += 1
        message = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        while True:
            answer = self._receive(deadline=time.monotonic() + 120)
            if answer.get("id") == self._next_id:
                assert "error" not in answer, (method, answer["error"])
                return answer["result"]
            self.events.append(answer)

    def open(self, url: str) -> None:
        """Navigate and wait for the page's load event."""
        self.events.clear()
        self.call("Page.navigate", session=True, url=url)
        self.wait_for_load()

    def wait_for_load(self) -> None:
        deadline = time.monotonic() + 120
        while not any(e.get("method") == "Page.loadEventFired" for e in self.events):
            self.events.append(self._receive(deadline))
        self.events.clear()

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression,
                           returnByValue=True)
        return result["result"].get("value")

    def dom_when(self, *needles: str, timeout_s: float = 120) -> str:
        """The page's DOM once it contains every one of ``needles`` (its scripts run on)."""
        deadline = time.monotonic() + timeout_s
        while True:
            dom = self.evaluate("document.documentElement.outerHTML")
            if all(n in dom for n in needles) or time.monotonic() > deadline:
                return dom
            time.sleep(0.25)

    def when(self, expression: str, timeout_s: float = 120):
        """The value of the JavaScript ``expression`` once it is truthy (its last value, falsy,
        after ``timeout_s``)."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.evaluate(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.25)

    def screenshot(self, step: str) -> None:
        """The whole page as ``NN-step.png`` in the screenshots directory."""
        self.n_screenshots += 1
        self.screenshots_dir.mkdir(parents=True, exist_ok=True)
        data = self.call("Page.captureScreenshot", session=True, format="png",
                         captureBeyondViewport=True)["data"]
        (self.screenshots_dir / f"{self.n_screenshots:02d}-{step}.png").write_bytes(
            base64.b64decode(data))

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._read], [], [], max(0.0, deadline -
                                                                   time.monotonic()))
            chunk = os.read(self._read, 1 << 20) if ready else b""
            assert chunk, "Chromium went silent or exited"
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self) -> None:
        os.close(self._write)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._read)


def _text(dom: str) -> str:
    body = re.sub(r"<(script|style)\b.*?</\1>", "", dom, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", body))


@pytest.fixture
def served(settings):
    """An app and its live URL, the URL being the app's own address (``HPO_PUBLIC_URL``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    app = create_app(settings.replace(public_url=url))
    with serve_in_thread(app, port=port):
        yield app, url


@pytest.fixture
def chromium(tmp_path):
    browser = Chromium(tmp_path / "profile", tmp_path / "screenshots")
    yield browser
    # the page as the test left it, passed or failed (a failed step's own may be missing);
    # with Chromium gone there is nothing to show
    with contextlib.suppress(AssertionError, OSError):
        browser.screenshot("end")
    browser.close()


def test_dashboard_of_a_finished_study_renders_after_logging_in(served, chromium):
    app, url = served
    token = create_token(app.state.components.sessions, "alice")  # not an admin: read-only
    created = httpx.post(f"{url}/v1/studies", json=tiny_spec("browser", n_trials=5),
                         headers=bearer(token))
    assert created.status_code == 201, created.text
    storage = app.state.components.studies.storage
    study = optuna.load_study(study_name="browser", storage=storage)
    for i in range(5):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
        for step in range(3):
            trial.report(0.1 * i + 0.01 * step, step)
        study.tell(trial, 0.1 * i + 0.02)
    sid = storage.get_study_id_from_name("browser")

    chromium.open(f"{url}/dashboard/studies/{sid}?token={token}")  # the address gives no login
    refused = chromium.dom_when("Token needed")
    chromium.screenshot("login-form")
    assert "Token needed" in refused and "js-plotly-plot" not in refused
    assert chromium.evaluate("document.querySelector('input[name=next]').value") == \
        f"/dashboard/studies/{sid}"

    chromium.evaluate(f"document.querySelector('input[name=token]').value = {token!r};"
                      "document.querySelector('form').submit()")
    chromium.wait_for_load()  # the form's POST, its redirect to the study's page
    page = chromium.dom_when("js-plotly-plot", "main-svg", "Best Trial (number=4)")
    chromium.screenshot("study-page")
    assert "js-plotly-plot" in page and "main-svg" in page  # plotly drew its charts
    text = _text(page)
    assert "browser (id=" in text and "History" in text
    assert "Best Trial (number=4)" in text

    chromium.open(f"{url}/dashboard/studies/{sid}/trials")
    trials = _text(chromium.dom_when("5 Trials", "Trial 4"))
    chromium.screenshot("trial-list")
    assert "5 Trials" in trials
    assert all(f"Trial {n}" in trials for n in range(5)) and "Complete" in trials


PBT_SPEC = {  # three toy members, 12 optimizer updates each, an exploit round every 6
    "name": "browser-pbt", "task": "toy-hpo",
    "config": {"max_updates": 12, "max_epochs": None, "eval_interval": 3,
               "micro_batch_size": 8},
    "search_space": {"quality": {"type": "float", "low": 0.0, "high": 10.0}},
    "objective": {"metric": "val_loss"},
    "sampler": {"name": "random", "seed": 1},
    "scheduler": {"name": "pbt", "perturbation_interval": 6},
    "budget": {"n_trials": 3, "max_concurrent_trials": 3},
    "resources": {"cpus": 0.5},
}
# what the page drew, read from plotly's own state of each graph div (its ``data``) and
# from the SVG it rendered (axis titles, legend entries, points)
HISTORY_Y_TITLE = ("[...document.querySelectorAll('#plot-history .ytitle')]"
                   ".map(e => e.textContent)")
CURVE_POINTS = ("(() => { const el = document.getElementById('graph-intermediate-values');"
                " if (!el || !el.data) return null;"
                " return {traces: el.data.filter(t => t.x && t.x.length > 0).length,"
                " points: el.querySelectorAll('.scatterlayer .point').length}; })()")
LINEAGE = ("(() => { const el = document.getElementById('user-defined-plot:hpo-lineage');"
           " if (!el || !el.data) return null;"
           " return {members: el.data.filter(t => /^trial \\d+$/.test(t.name)"
           " && (t.xaxis || 'x') === 'x').map(t => t.name),"
           " legend: [...el.querySelectorAll('.legend .traces .legendtext')]"
           ".map(e => e.textContent)}; })()")
HEADINGS = "[...document.querySelectorAll('h1, h2')].map(e => e.textContent)"


@pytest.mark.slow
def test_a_finished_pbt_study_shows_metric_name_note_learning_curves_and_lineage(
        served, settings, chromium, ray_session, tmp_path):
    app, url = served
    token = create_token(app.state.components.sessions, "alice")
    created = httpx.post(f"{url}/v1/studies", json=PBT_SPEC, headers=bearer(token))
    assert created.status_code == 201, created.text
    # the service's driver, in this process (the app runs no dispatcher): the same call
    out = run_study(parse_spec(PBT_SPEC), settings.database_url, results_dir=tmp_path / "ray",
                    compare_spec=False, owner="alice")
    assert (out.counts.complete, out.counts.failed) == (3, 0)
    sid = app.state.components.studies.storage.get_study_id_from_name("browser-pbt")

    chromium.open(f"{url}/dashboard/studies/{sid}")
    chromium.dom_when("Token needed")
    chromium.evaluate(f"document.querySelector('input[name=token]').value = {token!r};"
                      "document.querySelector('form').submit()")
    chromium.wait_for_load()
    lineage = chromium.when(f"(() => {{ const v = {LINEAGE}; "
                            "return v && v.legend.length ? v : null; })()")
    titles = chromium.when(f"(() => {{ const v = {HISTORY_Y_TITLE}; "
                           "return v.length ? v : null; })()")
    curves = chromium.when(f"(() => {{ const v = {CURVE_POINTS}; "
                           "return v && v.points ? v : null; })()")
    chromium.screenshot("pbt-study-page")
    assert titles == ["val_loss"]  # the metric's name, not "Objective 0"
    # a learning curve per member, each evaluated 4 times (steps 3, 6, 9, 12)
    assert curves == {"traces": 3, "points": 12}, curves
    # one trace per member on the first panel, each in the legend once (then "exploits",
    # drawn only when an exploit happened)
    assert sorted(lineage["members"]) == ["trial 0", "trial 1", "trial 2"], lineage
    assert [n for n in lineage["legend"] if n != "exploits"] == ["trial 0", "trial 1",
                                                                   "trial 2"], lineage

    chromium.open(f"{url}/dashboard/studies/{sid}/note")  # the note has a page of its own
    headings = chromium.when(f"(() => {{ const v = {HEADINGS}; "
                             "return v.includes('Outcome') ? v : null; })()")
    chromium.screenshot("pbt-note")
    assert headings and {"browser-pbt", "Search space", "Outcome"} <= set(headings), headings
    text = _text(chromium.evaluate("document.documentElement.outerHTML"))
    assert "COMPLETED" in text and "toy-hpo" in text and "alice" in text
