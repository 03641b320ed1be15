"""The first ten minutes (issue 14.7): ``make install`` explains a missing Python 3.11, and
``make demo``'s script keeps its dashboard up on a terminal until Enter, and stops at once
elsewhere saying how to keep it. The demo's script runs here against a stand-in ``hpo``
(a tiny HTTP server for ``hpo serve``): what is tested is the script's own flow."""

from __future__ import annotations

import os
import pty
import select
import shutil
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.service.conftest import free_port

REPO = Path(__file__).resolve().parents[1]

STAND_IN = textwrap.dedent('''\
    #!{python}
    """A stand-in for the hpo CLI: token create, serve (readyz + one study), submit, model."""
    import http.server, json, os, signal, sys
    command = sys.argv[1]
    if command == "token":
        print("hpo_demo_token")
    elif command == "submit":
        print("study submitted", file=sys.stderr)
    elif command == "model":  # hpo model NAME -o FILE
        with open(sys.argv[sys.argv.index("-o") + 1], "wb") as f:
            f.write(b"model")
        print("wrote", sys.argv[sys.argv.index("-o") + 1])
    elif command == "serve":
        class Answer(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                body = b"{{}}" if self.path == "/readyz" else json.dumps({{
                    "best_trial": {{"value": 0.99, "number": 7}}, "device_seconds": 12.0,
                    "dashboard_url": "/dashboard/studies/1"}}).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)
            def log_message(self, *args):
                pass
        server = http.server.HTTPServer(("127.0.0.1", int(os.environ["HPO_PORT"])), Answer)
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
        server.serve_forever()
''')


def _bin(tmp_path: Path) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"  # a wrapper, not a link: a link leaves the venv behind
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" "$@"\n')
    python.chmod(0o755)
    hpo = bin_dir / "hpo"
    hpo.write_text(STAND_IN.format(python=sys.executable))
    hpo.chmod(0o755)
    return bin_dir


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "DEMO_KEEP"}
    return {**env, "BIN": str(_bin(tmp_path)), "DEMO_DIR": str(tmp_path / "demo"),
            "DEMO_PORT": str(free_port()), **extra}


def test_off_a_terminal_the_demo_stops_and_says_how_to_keep_it(tmp_path):
    proc = subprocess.run(["bash", "examples/serve-demo.sh"], cwd=REPO, env=_env(tmp_path),
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "== (the server stops now; DEMO_KEEP=1 make demo keeps it serving the dashboard)" \
        in proc.stdout
    assert "until you press Enter" not in proc.stdout
    assert "== server stopped cleanly" in proc.stdout


@pytest.mark.parametrize("cause", ["taken port", "bad port", "no BIN", "no spec",
                                   "bad setting"])
def test_a_refused_demo_leaves_the_last_demos_folder(tmp_path, cause):
    """Every refusal before the server starts comes before DEMO_DIR is wiped (a taken port,
    a missing venv or spec, a bad setting had deleted the last demo's model and log)."""
    import socket

    env = _env(tmp_path)
    port = env["DEMO_PORT"]
    last = Path(env["DEMO_DIR"])
    last.mkdir()
    (last / "best.pt").write_bytes(b"the last demo's model")
    argv = ["bash", "examples/serve-demo.sh"]
    expected = {
        "taken port": f"port {port} is taken (another server?); set DEMO_PORT",
        "bad port": "DEMO_PORT must be a port number, got 'http'",
        "no BIN": f"no {tmp_path}/nowhere/hpo: run make install first, or set BIN",
        "no spec": f"cannot read the study name of the spec {tmp_path}/typo.yaml",
        "bad setting": "error: HPO_DASHBOARD_SESSION_HOURS must be in (0, 8760], got 0",
    }[cause]
    if cause == "bad port":
        env["DEMO_PORT"] = "http"
    elif cause == "no BIN":
        env["BIN"] = str(tmp_path / "nowhere")
    elif cause == "no spec":
        argv.append(str(tmp_path / "typo.yaml"))
    elif cause == "bad setting":
        env["HPO_DASHBOARD_SESSION_HOURS"] = "0"
    with socket.create_server(("127.0.0.1", int(port))):  # taken only in "taken port"
        if cause != "taken port":
            env["DEMO_PORT"] = env["DEMO_PORT"] if cause == "bad port" else str(free_port())
        proc = subprocess.run(argv, cwd=REPO, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.strip() == expected
    assert sorted(p.name for p in last.iterdir()) == ["best.pt"]
    assert (last / "best.pt").read_bytes() == b"the last demo's model"


def test_the_demo_ends_pointing_to_the_study_page_and_the_best_models_commands(tmp_path):
    env = _env(tmp_path)
    proc = subprocess.run(["bash", "examples/serve-demo.sh"], cwd=REPO, env=env,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    url, bin_dir, demo = f"http://127.0.0.1:{env['DEMO_PORT']}", env["BIN"], env["DEMO_DIR"]
    assert (Path(demo) / "best.pt").read_bytes() == b"model"  # downloaded while serving
    lines = proc.stdout.splitlines()
    assert lines.index("== server stopped cleanly") < len(lines) - 3
    assert lines[-3:] == [
        f"== study page: {url}/dashboard/studies/1 - log in with the token hpo_demo_token",
        f"== best model (trial 7), while the server runs: HPO_URL={url} "
        f"HPO_TOKEN=hpo_demo_token {bin_dir}/hpo model digits-tpe-asha -o best.pt",
        f"==   evaluate the copy this demo saved: {bin_dir}/python -m trainers evaluate "
        f"{demo}/best.pt"]


def test_on_a_terminal_the_demo_serves_until_enter(tmp_path):
    pid, fd = pty.fork()
    if pid == 0:  # the child: the script on a terminal
        os.chdir(REPO)
        os.execve("/bin/bash", ["bash", "examples/serve-demo.sh"], _env(tmp_path))
    seen = b""
    deadline = time.monotonic() + 120
    while b"until you press Enter or Ctrl-C" not in seen:
        assert time.monotonic() < deadline, seen.decode(errors="replace")
        if select.select([fd], [], [], 1)[0]:
            seen += os.read(fd, 4096)
    assert b"the server stops now" not in seen
    os.write(fd, b"\n")
    while True:
        try:
            if not select.select([fd], [], [], 60)[0]:
                break
            chunk = os.read(fd, 4096)
        except OSError:  # the terminal closed: the script ended
            break
        if not chunk:
            break
        seen += chunk
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, seen.decode(errors="replace")
    assert b"== server stopped cleanly" in seen


def test_make_install_explains_a_missing_python_311(tmp_path):
    old = tmp_path / "python3.10"
    old.write_text("#!/bin/sh\n[ \"$1\" = --version ] && echo 'Python 3.10.12' && exit 0\nexit 1\n")
    old.chmod(0o755)
    make = shutil.which("make")
    assert make, "make is needed to run the project's commands"
    proc = subprocess.run([make, "install", f"PYTHON={old}", f"VENV={tmp_path / 'venv'}"],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode != 0
    assert f"error: Python 3.11 is needed, and '{old}' is Python 3.10.12." in proc.stderr
    assert "make demo PYTHON=python3.11" in proc.stderr
    assert "Traceback" not in proc.stderr and "AssertionError" not in proc.stderr
    assert not (tmp_path / "venv").exists()


def test_a_cli_401_says_how_to_get_a_token(monkeypatch):
    from typer.testing import CliRunner

    import hpo.cli
    from service.client import ApiError, Client

    def refuse(self, name):
        raise ApiError(401, "not_authenticated", "a bearer token is required")

    monkeypatch.setattr(Client, "study", refuse)
    monkeypatch.delenv("HPO_TOKEN", raising=False)
    result = CliRunner().invoke(hpo.cli.app, ["status", "some-study"])
    assert result.exit_code == 1
    assert "error (401 not_authenticated): a bearer token is required" in result.output
    assert ("set HPO_TOKEN or pass --token; a token comes from `hpo token create NAME`"
            in " ".join(result.output.split()))


@pytest.mark.parametrize("message", ["token 'ana' was revoked at 2026-12-01 10:34:54 UTC",
                                     "token 'ana' expired at 2026-12-01 10:34:54 UTC"])
def test_a_cli_401_for_a_revoked_or_expired_token_says_to_ask_for_a_new_one(monkeypatch,
                                                                            message):
    from typer.testing import CliRunner

    import hpo.cli
    from service.client import ApiError, Client

    def refuse(self, name):
        raise ApiError(401, "not_authenticated", message)

    monkeypatch.setattr(Client, "study", refuse)
    monkeypatch.setenv("HPO_TOKEN", "hpo_x")
    result = CliRunner().invoke(hpo.cli.app, ["status", "some-study"])
    output = " ".join(result.output.split())
    assert result.exit_code == 1 and message in output
    assert "this token no longer works: ask an admin for a new one" in output
    assert "hpo token create NAME" not in output


def test_the_quick_starts_files_are_ignored_by_git():
    """The default SQLite file (and its WAL files), hpo serve's and hpo run's results and the
    demo's directory stay out of `git status` (issue 14.9)."""
    paths = ["hpo.db", "hpo.db-wal", "hpo.db-shm", "hpo-runs/s/trial/ckpt.pt",
             "runs/demo/hpo.db", ".hpo/x"]
    proc = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=REPO,
                          capture_output=True, text=True, timeout=30)
    assert proc.stdout.split() == paths


def test_a_cli_401_with_an_empty_token_says_so(monkeypatch):
    from typer.testing import CliRunner

    import hpo.cli
    from service.client import ApiError, Client

    def refuse(self, name):
        raise ApiError(401, "not_authenticated", "a bearer token is required")

    monkeypatch.setattr(Client, "study", refuse)
    monkeypatch.setenv("HPO_TOKEN", "")  # what `export HPO_TOKEN=$(failing command)` leaves
    result = CliRunner().invoke(hpo.cli.app, ["status", "some-study"])
    assert result.exit_code == 1
    assert "HPO_TOKEN is set but empty (did `hpo token create` fail?)" in result.output


def test_hpo_list_shows_the_studies_this_token_sees(monkeypatch):
    from typer.testing import CliRunner

    import hpo.cli
    from service.client import Client

    asked = []

    def studies(self, status=None, offset=0, limit=50):
        asked.append((status, offset, limit))
        return {"items": [{"name": "digits-1", "status": "RUNNING", "task": "digits",
                           "owner": "me", "n_trials": 24, "progress": {"finished": 5},
                           "created_at": "2026-12-01T06:00:00Z"}],
                "total": 1, "offset": 0, "limit": 50}

    monkeypatch.setattr(Client, "studies", studies)
    result = CliRunner().invoke(hpo.cli.app, ["list", "--status", "RUNNING"])
    assert result.exit_code == 0, result.output
    assert asked == [("RUNNING", 0, 50)]
    line = next(line for line in result.output.splitlines() if "digits-1" in line)
    row = [cell for cell in line.replace("│", " ").split() if cell]
    assert row == ["digits-1", "RUNNING", "5/24", "digits", "me", "2026-12-01", "06:00:00"]
    assert "studies 0-1 of 1" in result.output


def test_hpo_token_list_names_tokens_never_shows_them(tmp_path, monkeypatch):
    from typer.testing import CliRunner

    import hpo.cli

    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    runner = CliRunner()
    assert runner.invoke(hpo.cli.app, ["token", "list"]).exit_code == 1  # no database yet
    made = runner.invoke(hpo.cli.app, ["token", "create", "alice", "--admin"])
    assert made.exit_code == 0, made.output
    assert runner.invoke(hpo.cli.app, ["token", "create", "bob"]).exit_code == 0
    listed = runner.invoke(hpo.cli.app, ["token", "list"])
    assert listed.exit_code == 0, listed.output
    rows = [[c for c in line.replace("│", " ").split() if c] for line in listed.output.splitlines()
            if "alice" in line or "bob" in line]
    assert [row[:2] for row in rows] == [["alice", "admin"], ["bob", "member"]]
    token = made.output.strip().splitlines()[-1]
    assert token.startswith("hpo_") and token not in listed.output
