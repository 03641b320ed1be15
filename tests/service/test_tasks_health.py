"""``/v1/tasks``, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import socket

import trainers
from service.health import Readiness, gcs_endpoint
from tests.service.conftest import bearer


def test_tasks_lists_every_registered_task_with_metrics_and_options(client, tokens):
    body = client.get("/v1/tasks", headers=bearer(tokens["bob"])).json()
    names = [t["name"] for t in body["tasks"]]
    assert names == trainers.list_tasks()
    digits = next(t for t in body["tasks"] if t["name"] == "digits")
    assert digits["metrics"]["val_accuracy"] == "maximize"
    assert digits["objective"] == trainers.get_task("digits").objective
    assert {o["name"] for o in digits["options"]} == {
        f.name for f in trainers.get_task("digits").fields()}
    fields = {f["name"]: f for f in body["training_fields"]}
    assert fields["lr"]["kind"] == "float"
    assert fields["precision"]["kind"] == "choice" and "bf16" in fields["precision"]["choices"]


def test_a_broken_task_is_listed_with_one_line_and_no_server_path(client, tokens, monkeypatch):
    from service.routers import tasks

    def broken(name):
        raise ImportError("cannot import name 'Net' from 'mytask' "
                          "(/opt/hpo/.venv/lib/python3.11/site-packages/mytask/__init__.py)")

    monkeypatch.setattr(tasks.trainers, "get_task", broken)
    tasks.describe_tasks.cache_clear()
    try:
        body = client.get("/v1/tasks", headers=bearer(tokens["bob"])).json()
    finally:
        tasks.describe_tasks.cache_clear()
    assert {t["error"] for t in body["tasks"]} == {
        "ImportError: cannot import name 'Net' from 'mytask' (<path>)"}


def test_healthz_answers_without_a_token(client):
    assert client.get("/healthz").json() == {"status": "ok", "checks": {}}


def test_readyz_checks_the_database_and_ray(client, app):
    body = client.get("/readyz").json()
    assert body == {"status": "ready", "checks": {"database": "ok", "ray": "not configured"}}


def test_readyz_answers_503_when_ray_does_not_answer(app):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # bound, never listening: connections are refused
        readiness = Readiness(app.state.components.studies.storage.engine, f"127.0.0.1:{port}")
        checks = readiness.checks()
    assert checks["database"] == "ok" and checks["ray"].startswith("error")
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        ok = Readiness(app.state.components.studies.storage.engine,
                       f"127.0.0.1:{listener.getsockname()[1]}")
        assert ok.checks()["ray"] == "ok"


def test_gcs_endpoint_parses_ray_addresses():
    assert gcs_endpoint("10.0.0.1:6379") == ("10.0.0.1", 6379)
    assert gcs_endpoint("ray://head:10001") == ("head", 10001)
    assert gcs_endpoint("[::1]:6379") == ("::1", 6379)
    assert gcs_endpoint("auto") is None and gcs_endpoint(None) is None
    assert gcs_endpoint("head") is None
