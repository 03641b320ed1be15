"""Several API processes on one port (``HPO_API_PROCESSES``, ``service.api_processes``): each
serves, ``/metrics`` adds up all of them, the dispatcher's state reads the same from any,
a create in another process wakes the dispatcher, a dead one is started again, and a stop
leaves none behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import pytest

from service.api_processes import METRICS_ENV, DispatcherStatus, new_metrics_dir
from service.process import child_env
from service.settings import Settings
from tests.service.conftest import bearer, tiny_spec, wait_for

# -- without a server ---------------------------------------------------------------------


class _Dispatcher:
    last_round_at = 123.5
    restarts = 3
    takeovers = 1

    def alive(self) -> bool:
        return True

    def warm_driver(self) -> str:
        return "ready"


def test_dispatcher_status_reads_back_what_was_published(tmp_path):
    status = DispatcherStatus(tmp_path / "d.json", stale_after_s=30)
    assert (status.alive(), status.warm_driver(), status.last_round_at, status.restarts,
            status.takeovers) == (False, "none", None, 0, 0)  # nothing published yet
    status.publish(_Dispatcher())
    assert (status.alive(), status.warm_driver(), status.last_round_at, status.restarts,
            status.takeovers) == (True, "ready", 123.5, 3, 1)
    assert [p.name for p in tmp_path.iterdir()] == ["d.json"]  # no temporary file left
    assert not DispatcherStatus(tmp_path / "d.json", stale_after_s=0).alive()  # stale


def test_dispatcher_status_survives_a_torn_or_foreign_file(tmp_path):
    path = tmp_path / "d.json"
    path.write_text('{"alive": tr')
    status = DispatcherStatus(path)
    assert (status.alive(), status.warm_driver(), status.restarts) == (False, "none", 0)


def test_settings_travel_as_environment_variables(tmp_path):
    settings = Settings(database_url="sqlite:///x.db", results_dir=tmp_path / "r",
                        open_reads=True, heartbeat_s=0.5, heartbeat_timeout_s=5,
                        api_processes=3, api_threads=7, ray_address="127.0.0.1:6379",
                        log_format="json", auto_migrate=False)
    env = settings.to_env()
    assert env["HPO_OPEN_READS"] == "true" and env["HPO_API_PROCESSES"] == "3"
    assert "HPO_ARTIFACT_DIR" not in env  # None: left out
    assert Settings.from_env(env) == settings


def test_drivers_do_not_inherit_the_metrics_directory(monkeypatch):
    monkeypatch.setenv(METRICS_ENV, "/tmp/somewhere")
    assert METRICS_ENV not in child_env({})
    assert child_env({METRICS_ENV: "/x"})[METRICS_ENV] == "/x"  # unless asked for


def test_a_metrics_folder_a_killed_server_left_is_removed_by_the_next_one(monkeypatch,
                                                                          tmp_path):
    """helper-39: ``kill -9`` of ``hpo serve`` with HPO_API_PROCESSES=2 left its
    ``hpo-api-*`` folder behind at each crash."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True).stdout.strip()
    live = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        left = tmp_path / f"hpo-api-{dead}-abcd1234"
        other = tmp_path / f"hpo-api-{live.pid}-abcd1234"
        unrelated = tmp_path / "hpo-api-notapid"
        for folder in (left, other, unrelated):
            (folder / "counter_1.db").parent.mkdir()
            (folder / "counter_1.db").write_bytes(b"x")
        made = new_metrics_dir()
        assert made.name.startswith(f"hpo-api-{os.getpid()}-") and made.is_dir()
        assert not left.exists() and other.exists() and unrelated.exists()
    finally:
        live.kill()
        live.wait()


def test_api_processes_are_bounded():
    from service.errors import SettingsError

    with pytest.raises(SettingsError, match="HPO_API_PROCESSES"):
        Settings.from_env({"HPO_API_PROCESSES": "0"})


# -- a real server with two API processes ------------------------------------------------


def _children(pid: int, marker: str) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
            cmdline = (entry / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if int(stat.rpartition(")")[2].split()[1]) == pid and marker in cmdline:
            out.append(int(entry.name))
    return out


def _metric(text: str, line_start: str) -> float:
    values = [float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
              if line.startswith(line_start)]
    assert len(values) == 1, (line_start, text[:2000])
    return values[0]


HEALTHZ = 'hpo_http_requests_total{method="GET",route="/healthz",status="200"}'


def test_two_api_processes_serve_one_port(server_process, sqlite_url, tmp_path):
    server = server_process(sqlite_url, HPO_API_PROCESSES="2", HPO_METRICS_OPEN="true",
                            HPO_WARM_DRIVER="false", HPO_DISPATCH_INTERVAL_S="120")
    server.start()
    first = server.proc.pid
    other = wait_for(lambda: _children(first, "--api-process"), 60, 0.2, "the other one")
    assert len(other) == 1
    shared = Path(dict(v.split("=", 1) for v in Path(f"/proc/{other[0]}/environ").read_bytes()
                       .decode().split("\0") if "=" in v)[METRICS_ENV])
    assert shared.is_dir()
    token = _admin_token(server)

    # the first process stopped: the other alone answers, with the dispatcher's state
    os.kill(first, signal.SIGSTOP)
    try:
        assert httpx.get(f"{server.url}/healthz", timeout=90).status_code == 200
        ready = httpx.get(f"{server.url}/readyz", timeout=30).json()
        assert ready["checks"]["dispatcher"] == "ok"
        assert "warm_driver" not in ready["checks"]  # off, as in the first process
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert _metric(text, "hpo_driver_restarts_total") == 0
        assert _metric(text, "hpo_dispatcher_heartbeat_age_seconds") >= 0
        # a create here wakes the first process's dispatcher (its next round is 120 s off)
        created = httpx.post(f"{server.url}/v1/studies", json=tiny_spec("woken", n_trials=1),
                             headers=bearer(token), timeout=30)
        assert created.status_code == 201, created.text
    finally:
        os.kill(first, signal.SIGCONT)
    woke = time.monotonic()
    wait_for(lambda: httpx.get(f"{server.url}/v1/studies/woken", headers=bearer(token),
                               timeout=30).json()["status"] != "QUEUED", 60, 0.2, "a claim")
    assert time.monotonic() - woke < 60

    # every process's answers are counted, whichever answers the scrape
    for _ in range(30):  # a new connection each: the kernel hands them to either process
        assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    for _ in range(4):
        text = httpx.get(f"{server.url}/metrics", timeout=30).text
        assert _metric(text, HEALTHZ) == 31
        assert _metric(text, "hpo_driver_restarts_total") == 0

    # one that dies is started again; its counts stay
    os.kill(other[0], signal.SIGKILL)
    again = wait_for(lambda: [p for p in _children(first, "--api-process") if p != other[0]],
                     60, 0.2, "a new API process")
    os.kill(first, signal.SIGSTOP)
    try:
        assert httpx.get(f"{server.url}/healthz", timeout=90).status_code == 200
    finally:
        os.kill(first, signal.SIGCONT)
    assert _metric(httpx.get(f"{server.url}/metrics", timeout=30).text, HEALTHZ) == 32

    httpx.post(f"{server.url}/v1/studies/woken/stop", headers=bearer(token), timeout=30)
    assert server.stop() == 0
    assert not _children(first, "--api-process")
    assert not Path(f"/proc/{again[0]}").exists()
    assert not shared.exists()


def _admin_token(server) -> str:
    from service.auth import create_token
    from service.db import build_engine, session_factory

    engine = build_engine(server.env["HPO_DATABASE_URL"])
    try:
        return create_token(session_factory(engine), "admin", admin=True)
    finally:
        engine.dispose()


def test_creates_in_api_processes_without_a_dispatcher_end_none_of_them(server_process,
                                                                         sqlite_url):
    """With ``HPO_RUN_DISPATCHER=false`` no process runs a dispatcher: a create in another
    process wakes none (the wake signal's default action ended the first process, exit -10,
    and with it the others), and a stray wake signal ends nothing."""
    server = server_process(sqlite_url, HPO_API_PROCESSES="2", HPO_RUN_DISPATCHER="false",
                            HPO_WARM_DRIVER="false")
    server.start()
    first = server.proc.pid
    others = wait_for(lambda: _children(first, "--api-process"), 60, 0.2, "the other one")
    token = _admin_token(server)
    for i in range(12):  # new connections: the kernel hands them to either process
        r = httpx.post(f"{server.url}/v1/studies", json=tiny_spec(f"quiet-{i}", n_trials=1),
                       headers={**bearer(token), "Connection": "close"}, timeout=30)
        assert r.status_code == 201, r.text
    os.kill(first, signal.SIGUSR1)
    assert httpx.get(f"{server.url}/healthz", timeout=30).status_code == 200
    assert server.proc.poll() is None
    assert _children(first, "--api-process") == others
    listed = httpx.get(f"{server.url}/v1/studies?limit=50", headers=bearer(token), timeout=30)
    assert sorted(s["status"] for s in listed.json()["items"]) == ["QUEUED"] * 12
