"""``hpo serve``'s start-up: a results directory it cannot use, a host that is not this
machine's, and SIGINT/SIGTERM before it serves (the operations tester's findings)."""

from __future__ import annotations

import contextlib
import errno
import os
import subprocess
import sys
import textwrap

import pytest
from typer.testing import CliRunner

from service import server as server_module
from service.errors import SettingsError
from service.settings import Settings


def test_a_host_that_is_not_this_machines_names_the_host_option():
    """HPO_HOST=8.8.8.8 said "choose another with --port or HPO_PORT" (EADDRNOTAVAIL)."""
    with pytest.raises(SettingsError) as caught:
        server_module.listen("192.0.2.1", 0)  # TEST-NET-1: no machine's own address
    assert str(caught.value) == ("cannot bind host '192.0.2.1' (Cannot assign requested "
                                 "address): set --host or HPO_HOST to an address of this "
                                 "machine")


def _no_ray(*_args, **_kwargs):
    raise AssertionError("the local Ray head was started although HPO_RESULTS_DIR is unusable")


@pytest.mark.parametrize("inside", ["", "sub"])  # the file itself, a folder under it
def test_a_results_dir_that_is_a_file_is_refused_before_the_database_and_ray(
        inside, tmp_path, monkeypatch):
    """Before, a study was claimed and every round failed on its folder (NotADirectoryError),
    the study RUNNING for ever while /readyz said ready."""
    monkeypatch.setattr(server_module, "LocalRay", _no_ray)
    (tmp_path / "afile").touch()
    results = tmp_path / "afile" / inside if inside else tmp_path / "afile"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}", port=0,
                        results_dir=results)
    with pytest.raises(SettingsError) as caught:
        server_module.serve(settings)
    assert str(caught.value) == (f"HPO_RESULTS_DIR '{results}' cannot be used as a "
                                 f"directory: Not a directory")
    assert not (tmp_path / "hpo.db").exists()  # refused before the schema was prepared


def test_a_results_dir_without_write_permission_is_refused(tmp_path, monkeypatch):
    results = tmp_path / "ro"
    results.mkdir(mode=0o555)
    if os.geteuid() == 0:  # root writes anywhere: mkdtemp's refusal stands in for the bits
        def refused(*_args, **_kwargs):
            raise PermissionError(errno.EACCES, os.strerror(errno.EACCES), str(results / "x"))

        monkeypatch.setattr("service.health.tempfile.mkdtemp", refused)
    with pytest.raises(SettingsError) as caught:
        server_module.check_results_dir(Settings(results_dir=results))
    assert str(caught.value) == (f"HPO_RESULTS_DIR '{results}' cannot be used as a "
                                 f"directory: Permission denied")


def test_a_usable_results_dir_is_made_and_left_empty(tmp_path):
    results = tmp_path / "new" / "runs"
    server_module.check_results_dir(Settings(results_dir=results))
    assert results.is_dir() and list(results.iterdir()) == []


def test_an_artifact_dir_that_is_a_file_is_refused_too(tmp_path):
    """HPO_ARTIFACT_DIR (the kept models), where set, is checked at start as
    HPO_RESULTS_DIR is; before, nothing looked at it until a model was to be kept."""
    (tmp_path / "models").touch()
    with pytest.raises(SettingsError) as caught:
        server_module.check_results_dir(Settings(results_dir=tmp_path / "runs",
                                                 artifact_dir=tmp_path / "models"))
    assert str(caught.value) == (f"HPO_ARTIFACT_DIR '{tmp_path / 'models'}' cannot be used "
                                 f"as a directory: Not a directory")
    server_module.check_results_dir(Settings(results_dir=tmp_path / "runs",
                                             artifact_dir=tmp_path / "kept"))
    assert (tmp_path / "kept").is_dir() and list((tmp_path / "kept").iterdir()) == []


def test_python_m_service_server_exits_2_on_an_unusable_results_dir(tmp_path):
    (tmp_path / "afile").touch()
    env = {**os.environ, "HPO_RESULTS_DIR": str(tmp_path / "afile"),
           "HPO_DATABASE_URL": f"sqlite:///{tmp_path / 'hpo.db'}"}
    proc = subprocess.run([sys.executable, "-m", "service.server", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert (proc.returncode, proc.stderr.splitlines()) == (2, [
        f"error: HPO_RESULTS_DIR '{tmp_path / 'afile'}' cannot be used as a directory: "
        f"Not a directory"]), proc.stdout + proc.stderr


def test_hpo_serve_refuses_an_unusable_results_dir_with_one_line_and_exit_2(
        tmp_path, monkeypatch):
    import hpo.cli

    monkeypatch.setattr(server_module, "LocalRay", _no_ray)
    (tmp_path / "afile").touch()
    monkeypatch.setenv("HPO_RESULTS_DIR", str(tmp_path / "afile"))
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    result = CliRunner().invoke(hpo.cli.app, ["serve", "--port", "0"])
    assert (result.exit_code, " ".join(result.output.split())) == (
        2, f"error: HPO_RESULTS_DIR '{tmp_path / 'afile'}' cannot be used as a directory: "
           f"Not a directory")


# A child process runs serve() with a stand-in Ray head (no Ray) that, once its input ends,
# leaves a mark and exits: as service.ray_head shuts Ray down at the end of its input.
_SERVE_INTERRUPTED = textwrap.dedent("""
    import logging, os, signal, sys, time, types
    from pathlib import Path
    from service import server
    from service.settings import Settings

    stage, sig, tmp = sys.argv[1], getattr(signal, sys.argv[2]), Path(sys.argv[3])
    if not hasattr(server, "RAY_HEAD"):  # never a real Ray here
        sys.exit("service.server has no RAY_HEAD to put a stand-in Ray head in")
    logging.basicConfig(level=logging.INFO, format="%(name)s: %(message)s", stream=sys.stdout)
    starts = ("os.kill(os.getppid(), %d)" % sig if stage == "ray" else
              "print('{\\"address\\": \\"127.0.0.1:6379\\"}', flush=True)")
    server.RAY_HEAD = [sys.executable, "-c", f"import os, sys; {starts}; sys.stdin.read(); "
                       f"open({str(tmp / 'head-stopped')!r}, 'w').close()"]

    def create_app(settings):  # stage "app": the signal comes while the app is built
        os.kill(os.getpid(), sig)
        time.sleep(60)
        raise AssertionError("the signal did not stop the start-up")

    sys.modules["service.app"] = types.SimpleNamespace(create_app=create_app)  # no imports
    before = signal.getsignal(sig)
    server.serve(Settings(database_url=f"sqlite:///{tmp / 'hpo.db'}", port=0,
                          results_dir=tmp / "results"))
    print("serve returned; the Ray head had stopped:", (tmp / "head-stopped").exists())
    print("the handler found is back:", signal.getsignal(sig) == before)
""")


@pytest.mark.parametrize(("stage", "sig"), [("ray", "SIGTERM"), ("app", "SIGINT"),
                                            ("app", "SIGTERM")])
def test_a_signal_during_start_up_stops_the_local_ray_head_and_exits_0_saying_so(
        stage, sig, tmp_path):
    """Before, SIGTERM while Ray started ended ``hpo serve`` at once (exit 143, no log line)
    and Ray's agents ran on without it: the handlers were installed only once uvicorn ran."""
    proc = subprocess.run([sys.executable, "-c", _SERVE_INTERRUPTED, stage, sig,
                           str(tmp_path)], capture_output=True, text=True, timeout=120)
    lines = proc.stdout.splitlines()
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert lines[-3:] == [
        f"service.server: {sig} during start-up: what had started is stopped",
        "serve returned; the Ray head had stopped: True",
        "the handler found is back: True"], proc.stdout + proc.stderr
    assert ("service.server: stopping the local Ray head, which was starting" in lines) == (
        stage == "ray")


@pytest.mark.parametrize("broken", ["a file", "no write permission"])
def test_readyz_says_not_ready_when_the_results_dir_becomes_unusable_after_start(
        broken, tmp_path, monkeypatch):
    """``hpo serve`` checks HPO_RESULTS_DIR once, at start; before, a folder that became
    unusable later (removed and replaced by a file, made read-only, a mount gone) left every
    study failing while /readyz said ready. Its answer names no path (it needs no token)."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    results = tmp_path / "results"
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}", results_dir=results,
                        run_dispatcher=True, dispatch_interval_s=600)
    with TestClient(create_app(settings)) as client:
        results.mkdir(exist_ok=True)
        assert client.get("/readyz").json()["checks"]["results_dir"] == "ok"
        if broken == "a file":
            results.rmdir()
            results.touch()
            expected = "error: ENOTDIR"
        else:
            def refused(*_args, **_kwargs):  # what a read-only folder does (root ignores bits)
                raise PermissionError(errno.EACCES, os.strerror(errno.EACCES))

            monkeypatch.setattr("service.health.tempfile.mkdtemp", refused)
            expected = "error: EACCES"
        answer = client.get("/readyz")
    assert (answer.status_code, answer.json()["status"]) == (503, "not ready")
    assert answer.json()["checks"]["results_dir"] == expected
    assert str(tmp_path) not in answer.text


def test_readyz_leaves_the_results_dir_out_where_no_dispatcher_runs(tmp_path):
    """An API process without a dispatcher (HPO_API_PROCESSES > 1's others) writes no
    study folder: its readiness does not depend on one."""
    from fastapi.testclient import TestClient

    from service.app import create_app

    (tmp_path / "afile").touch()
    settings = Settings(database_url=f"sqlite:///{tmp_path / 'hpo.db'}",
                        results_dir=tmp_path / "afile", run_dispatcher=False)
    with TestClient(create_app(settings)) as client:
        assert "results_dir" not in client.get("/readyz").json()["checks"]


@pytest.mark.parametrize("host", ["192.0.2.1", "no-such-host.invalid"])
def test_hpo_serve_exits_2_for_a_host_that_is_not_this_machines_as_for_any_bad_setting(
        host, tmp_path, monkeypatch):
    """A bad --host / HPO_HOST is a bad setting, exit 2 as the others (it was 1, as a port
    in use, which a second try may find free)."""
    import hpo.cli

    monkeypatch.setattr(server_module, "LocalRay", _no_ray)
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{tmp_path / 'hpo.db'}")
    result = CliRunner().invoke(hpo.cli.app, ["serve", "--host", host, "--port", "0"])
    assert result.exit_code == 2
    assert " ".join(result.output.split()).startswith(f"error: cannot bind host '{host}' (")
    with socket_taken() as port:  # a port in use stays exit 1
        result = CliRunner().invoke(hpo.cli.app, ["serve", "--host", "127.0.0.1", "--port",
                                                  str(port)])
    assert result.exit_code == 1
    assert " ".join(result.output.split()) == (
        f"error: port {port} on 127.0.0.1 is in use (another server?): choose another with "
        f"--port or HPO_PORT")


@contextlib.contextmanager
def socket_taken():
    import socket

    with socket.create_server(("127.0.0.1", 0)) as s:
        yield s.getsockname()[1]
