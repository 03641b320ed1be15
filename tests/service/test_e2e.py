"""End to end: a real ``python -m service.server`` process on a real Ray (and PostgreSQL when
it answers), driven over HTTP and by the ``hpo`` client commands; the Optuna record checked."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import httpx
import optuna
import pytest
from optuna.trial import TrialState
from typer.testing import CliRunner

from hpo.cli import app as hpo_app
from hpo.storage import open_storage
from service.auth import create_token
from service.db import build_engine, create_tables, session_factory
from tests.service.conftest import bearer, tiny_spec, wait_for


def _admin_token(database_url: str) -> str:
    engine = build_engine(database_url)
    create_tables(engine)
    token = create_token(session_factory(engine), "e2e-admin", admin=True)
    engine.dispose()
    return token


def _study(server, token: str, name: str) -> dict:
    r = httpx.get(f"{server.url}/v1/studies/{name}", headers=bearer(token), timeout=30)
    assert r.status_code == 200, r.text
    return r.json()


def _warm_driver(server) -> str:
    return httpx.get(f"{server.url}/readyz").json()["checks"]["warm_driver"]


def _ended(server, token: str, name: str):
    study = _study(server, token, name)
    return study if study["status"] in ("COMPLETED", "STOPPED", "FAILED") else None


def test_a_study_submitted_over_http_runs_on_ray_into_the_optuna_record(
        server_process, pg_url, tmp_path):
    server = server_process(pg_url)
    token = _admin_token(pg_url)
    server.start()
    # the warm driver imports, joins the Ray cluster, and says so; it then runs the study
    wait_for(lambda: _warm_driver(server) == "ready", what="the warm driver to be ready")
    r = httpx.post(f"{server.url}/v1/studies", json=tiny_spec("e2e", n_trials=3),
                   headers=bearer(token), timeout=60)
    assert r.status_code == 201, r.text
    study = wait_for(lambda: _ended(server, token, "e2e"), what="study e2e to end")
    assert study["status"] == "COMPLETED", study["error"]
    assert study["counts"]["complete"] + study["counts"]["pruned"] == 3
    assert study["progress"]["fraction"] == 1.0 and study["device_seconds"] > 0
    assert 0.0 < study["best_trial"]["value"] <= 1.0
    record = optuna.load_study(study_name="e2e", storage=open_storage(pg_url))
    assert len(record.trials) == 3
    for trial in record.trials:
        assert trial.state in (TrialState.COMPLETE, TrialState.PRUNED)
        assert trial.intermediate_values and trial.user_attrs["ray_trial_id"]
        assert trial.user_attrs["device_seconds"] > 0
    assert record.best_trial.number == study["best_trial"]["number"]
    # the metrics after this small study (issue 14.2), parsed by prometheus-client
    from tests.service.test_metrics import samples

    values = samples(httpx.get(f"{server.url}/metrics", headers=bearer(token)).text)
    assert values[("hpo_studies", (("status", "COMPLETED"),))] == 1
    assert values[("hpo_queue_depth", ())] == 0
    assert sum(values[("hpo_trials", (("state", s),))] for s in ("complete", "pruned")) == 3
    assert values[("hpo_trials", (("state", "running"),))] == 0
    assert values[("hpo_device_seconds_total", (("owner", "e2e-admin"),))] == pytest.approx(
        sum(t.user_attrs["device_seconds"] for t in record.trials), rel=1e-9)
    assert values[("hpo_driver_restarts_total", ())] == 0
    assert values[("hpo_study_takeovers_total", ())] == 0
    assert values[("hpo_dispatcher_heartbeat_age_seconds", ())] >= 0
    assert values[("hpo_http_requests_total", (("method", "POST"), ("route", "/v1/studies"),
                                               ("status", "201")))] == 1
    trials = httpx.get(f"{server.url}/v1/studies/e2e/trials?intermediate=true",
                       headers=bearer(token)).json()
    assert [t["number"] for t in trials["items"]] == [0, 1, 2]
    assert all(t["intermediate_values"] for t in trials["items"])
    wait_for(lambda: _warm_driver(server) != "none", what="a new warm driver once idle")
    assert server.stop() == 0  # SIGTERM: a clean shutdown
    assert "Application shutdown complete" in server.log()


def test_the_client_commands_submit_wait_status_trials_best(server_process, sqlite_url,
                                                            tmp_path):
    server = server_process(sqlite_url)
    token = _admin_token(sqlite_url)
    server.start()
    spec_path = tmp_path / "cli.yaml"
    import yaml

    spec_path.write_text(yaml.safe_dump(tiny_spec("cli", n_trials=2)))
    runner = CliRunner()
    env = {"HPO_URL": server.url, "HPO_TOKEN": token}
    result = runner.invoke(hpo_app, ["submit", str(spec_path), "--wait"], env=env)
    assert result.exit_code == 0, result.output
    assert "best trial #" in result.stdout and "val_accuracy =" in result.stdout
    status = runner.invoke(hpo_app, ["status", "cli"], env=env)
    assert status.exit_code == 0 and "COMPLETED" in status.stdout and "2/2" in status.stdout
    trials = runner.invoke(hpo_app, ["trials", "cli"], env=env)
    assert trials.exit_code == 0 and "trials 0-2 of 2" in trials.output
    best = runner.invoke(hpo_app, ["best", "cli"], env=env)
    assert best.exit_code == 0 and "lr =" in best.stdout
    stop = runner.invoke(hpo_app, ["stop", "cli"], env=env)
    assert stop.exit_code == 1 and "already ended" in stop.output
    again = runner.invoke(hpo_app, ["submit", str(spec_path)], env=env)
    assert again.exit_code == 1 and "409 conflict" in again.output
    spec_path.write_text(yaml.safe_dump(tiny_spec("bad", budget={"n_trials": 0})))
    bad = runner.invoke(hpo_app, ["submit", str(spec_path)], env=env)
    assert bad.exit_code == 2 and "budget.n_trials" in bad.output
    denied = runner.invoke(hpo_app, ["status", "cli"], env={**env, "HPO_TOKEN": "hpo_x"})
    assert denied.exit_code == 1 and "401" in denied.output
    # budget.stop_when (issue 18.3): any COMPLETE trial reaches val_accuracy >= 0, so the
    # study ends COMPLETED after its first trial, saying which rule fired
    spec_path.write_text(yaml.safe_dump(tiny_spec("early", n_trials=3, budget={
        "n_trials": 3, "stop_when": {"target": 0.0}})))
    early = runner.invoke(hpo_app, ["submit", str(spec_path), "--wait"], env=env)
    assert early.exit_code == 0, early.output
    assert "stopped before its budget: stop_when.target: trial 0's" in early.output
    study = _study(server, token, "early")
    assert study["status"] == "COMPLETED" and study["counts"]["complete"] == 1
    reason = study["stop_reason"]
    assert reason.startswith("stop_when.target: trial 0's val_accuracy ") and reason.endswith(
        " reached the target 0 (when 1 trial had finished)")
    status = runner.invoke(hpo_app, ["status", "early"], env=env)
    assert "stopped early" in status.stdout and "stop_when.target" in status.stdout


def _long_spec(name: str, n_trials: int) -> dict:
    return tiny_spec(name, n_trials=n_trials, config={"max_epochs": 40, "micro_batch_size": 64,
                                                      "width": 16})


def test_stop_ends_running_trials_within_seconds_as_stopped_by_the_user(server_process,
                                                                         sqlite_url):
    server = server_process(sqlite_url)
    token = _admin_token(sqlite_url)
    server.start()
    httpx.post(f"{server.url}/v1/studies", json=_long_spec("stopme", 20), headers=bearer(token))
    wait_for(lambda: _study(server, token, "stopme")["counts"]["running"] > 0,
             what="a running trial")
    r = httpx.post(f"{server.url}/v1/studies/stopme/stop", headers=bearer(token))
    assert r.status_code == 202 and r.json()["stop_requested"]
    study = wait_for(lambda: _ended(server, token, "stopme"), what="the stop")
    assert study["status"] == "STOPPED" and study["counts"]["running"] == 0
    record = optuna.load_study(study_name="stopme", storage=open_storage(sqlite_url))
    stopped = [t for t in record.trials if t.user_attrs.get("stopped_by") == "user"]
    assert stopped and all(t.state == TrialState.PRUNED for t in stopped)
    assert len(record.trials) < 20


def test_dashboard_pages_and_api_answer_while_a_study_runs_on_sqlite(server_process,
                                                                     sqlite_url, tmp_path):
    server = server_process(sqlite_url)
    token = _admin_token(sqlite_url)
    server.start()
    httpx.post(f"{server.url}/v1/studies", json=tiny_spec("busy", n_trials=6),
               headers=bearer(token))
    h = bearer(token)
    wait_for(lambda: _study(server, token, "busy")["status"] == "RUNNING", what="RUNNING")
    sid = open_storage(sqlite_url).get_study_id_from_name("busy")
    answered = 0
    with httpx.Client(base_url=server.url, headers=h, timeout=60) as http:
        while _study(server, token, "busy")["status"] == "RUNNING":
            for path in ("/dashboard", f"/dashboard/studies/{sid}", "/api/studies",
                         f"/api/studies/{sid}", f"/api/studies/{sid}/param_importances",
                         "/v1/studies/busy", "/v1/studies/busy/trials?intermediate=true"):
                r = http.get(path)
                assert r.status_code == 200, (path, r.status_code, r.text[:300])
                answered += 1
            # a round every half second: back to back, the reads (param_importances fits
            # a forest) took the study's 2 cores, and the test 270 s in CI instead of 60
            time.sleep(0.5)
    assert answered >= 7
    assert _study(server, token, "busy")["status"] == "COMPLETED"
    logs = server.log() + "".join(p.read_text(errors="replace")
                                  for p in (tmp_path / "results").rglob("service-driver.log"))
    assert "database is locked" not in logs


def test_sigkill_of_the_server_mid_study_then_restart_completes_it_exactly(server_process,
                                                                            sqlite_url):
    n_trials = 6
    server, token = _serve_a_running_study(server_process, sqlite_url, "survivor", n_trials,
                                           max_epochs=6)
    driver_pid = wait_for(lambda: _row(sqlite_url, "survivor", "worker_pid"),
                          what="driver pid")
    os.kill(server.proc.pid, signal.SIGKILL)
    server.proc.wait()
    wait_for(lambda: not _alive(driver_pid), timeout_s=30, what="the driver to die with it")
    server.start()
    study = wait_for(lambda: _ended(server, token, "survivor"), what="the resumed study")
    assert study["status"] == "COMPLETED", study["error"]
    assert study["attempts"] == 2
    assert study["progress"]["finished"] == n_trials and study["counts"]["running"] == 0
    record = optuna.load_study(study_name="survivor", storage=open_storage(sqlite_url))
    assert not [t for t in record.trials if t.state == TrialState.RUNNING]
    # the killed driver's trials were resumed, or ended FAIL and run again ("requeued")
    counted = [t for t in record.trials if t.state.is_finished() and
               not t.user_attrs.get("requeued")]
    assert len(counted) == n_trials
    requeued = [t for t in record.trials if t.user_attrs.get("requeued")]
    rerun = {t.user_attrs.get("requeued_from") for t in record.trials} - {None}
    assert {t.number for t in requeued} == rerun
    assert study["counts"]["requeued"] == len(requeued)


def _serve_a_running_study(server_process, database_url: str, name: str, n_trials: int,
                           max_epochs: int):
    """A started server and an admin token, once a study of ``name`` has a running trial."""
    server = server_process(database_url)
    token = _admin_token(database_url)
    server.start()
    spec = tiny_spec(name, n_trials=n_trials,
                     config={"max_epochs": max_epochs, "micro_batch_size": 64, "width": 16})
    httpx.post(f"{server.url}/v1/studies", json=spec, headers=bearer(token))
    wait_for(lambda: _study(server, token, name)["counts"]["running"] > 0,
             what="a running trial")
    return server, token


def _row(database_url: str, name: str, column: str):
    """One column of the study's row in the service's table, read straight from the database."""
    import sqlalchemy as sa

    from service.db import StudyRow

    engine = build_engine(database_url)
    with engine.connect() as conn:
        value = conn.execute(sa.select(getattr(StudyRow, column))
                             .where(StudyRow.name == name)).scalar()
    engine.dispose()
    return value


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] != "Z"


def test_a_study_needing_resources_no_node_has_fails_naming_the_field(server_process,
                                                                      sqlite_url):
    server = server_process(sqlite_url)
    token = _admin_token(sqlite_url)
    server.start()
    r = httpx.post(f"{server.url}/v1/studies", headers=bearer(token),
                   json=tiny_spec("greedy", resources={"cpus": 1, "gpus": 1}))
    assert r.status_code == 201  # the cluster is known to the driver, not to the API
    study = wait_for(lambda: _ended(server, token, "greedy"), what="the study to fail")
    assert study["status"] == "FAILED"
    assert "resources.gpus" in study["error"] and study["counts"]["running"] == 0


def test_ctrl_c_requeues_a_running_study_and_the_next_start_finishes_it(server_process,
                                                                        sqlite_url):
    # Ctrl-C signals the whole process group: the drivers and the local Ray live in
    # their own sessions, so only `hpo serve` hears it and stops them in order
    n_trials = 4
    server, token = _serve_a_running_study(server_process, sqlite_url, "requeued", n_trials,
                                           max_epochs=8)
    assert server.stop(ctrl_c=True) == 0
    assert _row(sqlite_url, "requeued", "status") == "QUEUED"
    record = optuna.load_study(study_name="requeued", storage=open_storage(sqlite_url))
    assert not [t for t in record.trials if t.user_attrs.get("stopped_by") == "user"]
    server.start()
    study = wait_for(lambda: _ended(server, token, "requeued"), what="the requeued study")
    assert study["status"] == "COMPLETED", study["error"]
    assert study["progress"]["finished"] == n_trials and study["counts"]["running"] == 0


def test_upgrade_while_running_sigterm_migrate_restart_finishes_exactly(server_process,
                                                                         sqlite_url):
    """Issue 14.6: SIGTERM a server with a running study, bring its tables to the schema the
    next version needs (here: back to the oldest revision, then ``hpo db upgrade``), start
    again: the study ends with exactly ``n_trials`` counted, none lost or run twice."""
    from alembic import command

    from service import migrate

    n_trials = 4
    server, token = _serve_a_running_study(server_process, sqlite_url, "upgraded", n_trials,
                                           max_epochs=8)
    assert server.stop() == 0  # SIGTERM: the study goes back to the queue, resumable
    assert _row(sqlite_url, "upgraded", "status") == "QUEUED"
    engine = build_engine(sqlite_url)
    # the tables as the version before migrations left them (on a connection without
    # SQLite's foreign-key enforcement, as migrations run: its table rebuilds need that)
    with migrate._connection(engine) as conn, conn.begin():
        command.downgrade(migrate._config(conn), migrate.BASELINE)
    assert migrate.current(engine) == migrate.BASELINE
    server.env["HPO_AUTO_MIGRATE"] = "false"
    with pytest.raises(RuntimeError, match="run `hpo db upgrade`"):
        server.start()  # refused: the tables are outdated
    upgraded = subprocess.run([sys.executable, "-m", "hpo", "db", "upgrade"], env=server.env,
                              capture_output=True, text=True, timeout=120)
    assert upgraded.returncode == 0, upgraded.stderr
    assert migrate.current(engine) == migrate.head()
    engine.dispose()
    server.start()
    study = wait_for(lambda: _ended(server, token, "upgraded"), what="the upgraded study")
    assert study["status"] == "COMPLETED", study["error"]
    assert study["progress"]["finished"] == n_trials and study["counts"]["running"] == 0
    record = optuna.load_study(study_name="upgraded", storage=open_storage(sqlite_url))
    counted = [t for t in record.trials if t.state.is_finished()
               and not t.user_attrs.get("requeued")]
    assert len(counted) == n_trials
    assert not [t for t in record.trials if t.state == TrialState.RUNNING]
    assert sorted(t.number for t in record.trials) == list(range(len(record.trials)))
