"""A headless Chromium logs in through the dashboard's login form, then loads the dashboard of a
finished study and renders its charts and its trials (Debian's /usr/bin/chromium; skipped where
it is absent). Chromium is driven over the DevTools protocol on a pipe
(``--remote-debugging-pipe``: fd 3 in, fd 4 out, one JSON message per NUL-terminated line)."""

from __future__ import annotations

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

from service.app import create_app
from service.auth import create_token
from tests.service.conftest import bearer, free_port, serve_in_thread, tiny_spec

CHROMIUM = os.environ.get("HPO_TEST_CHROMIUM") or shutil.which("chromium") or "/usr/bin/chromium"
pytestmark = [pytest.mark.server,
              pytest.mark.skipif(not os.access(CHROMIUM, os.X_OK),
                                 reason=f"no Chromium at {CHROMIUM} (apt-get install chromium)")]


class Chromium:
    """One headless Chromium with a fresh profile, one page, driven over the DevTools pipe."""

    def __init__(self, profile_dir) -> None:
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        # Chromium reads commands on fd 3 and writes answers on fd 4
        wrap = f'exec 3<&{to_chrome} 4>&{from_chrome} {to_chrome}<&- {from_chrome}>&-; exec "$@"'
        self.proc = subprocess.Popen(
            ["bash", "-c", wrap, "bash", CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
             "--remote-debugging-pipe", f"--user-data-dir={profile_dir}", "about:blank"],
            pass_fds=(to_chrome, from_chrome), stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._buffer, self._next_id, self.events = b"", 0, []
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
    browser = Chromium(tmp_path / "profile")
    yield browser
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
    assert "Token needed" in refused and "js-plotly-plot" not in refused
    assert chromium.evaluate("document.querySelector('input[name=next]').value") == \
        f"/dashboard/studies/{sid}"

    chromium.evaluate(f"document.querySelector('input[name=token]').value = {token!r};"
                      "document.querySelector('form').submit()")
    chromium.wait_for_load()  # the form's POST, its redirect to the study's page
    page = chromium.dom_when("js-plotly-plot", "main-svg", "Best Trial (number=4)")
    assert "js-plotly-plot" in page and "main-svg" in page  # plotly drew its charts
    text = _text(page)
    assert "browser (id=" in text and "History" in text
    assert "Best Trial (number=4)" in text

    chromium.open(f"{url}/dashboard/studies/{sid}/trials")
    trials = _text(chromium.dom_when("5 Trials", "Trial 4"))
    assert "5 Trials" in trials
    assert all(f"Trial {n}" in trials for n in range(5)) and "Complete" in trials
