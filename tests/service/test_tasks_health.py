"""``/v1/tasks``, ``/healthz`` and ``/readyz``."""

from __future__ import annotations

import dataclasses
import socket

import pytest

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


def _listed(client, tokens, monkeypatch, get_task) -> dict:
    from service.routers import tasks

    monkeypatch.setattr(tasks.trainers, "get_task", get_task)
    tasks.describe_tasks.cache_clear()
    try:
        r = client.get("/v1/tasks", headers=bearer(tokens["bob"]))
    finally:
        tasks.describe_tasks.cache_clear()
    assert r.status_code == 200, r.text
    return r.json()


def test_a_broken_task_is_listed_with_one_line_and_no_server_path(client, tokens, monkeypatch):
    def broken(name):
        raise ImportError("cannot import name 'Net' from 'mytask' "
                          "(/opt/hpo/.venv/lib/python3.11/site-packages/mytask/__init__.py)")

    body = _listed(client, tokens, monkeypatch, broken)
    assert {t["error"] for t in body["tasks"]} == {
        "ImportError: cannot import name 'Net' from 'mytask' (<path>)"}


IMPORT_FAILURES = {  # what an installed task's module may raise when imported
    "syntax": (SyntaxError("'(' was never closed", ("/opt/t/mytask.py", 3, 5, "x = (", 3, 6)),
               "SyntaxError: '(' was never closed (mytask.py, line 3)"),
    "runtime": (RuntimeError("CUDA driver missing at /usr/lib/x"),
                "RuntimeError: CUDA driver missing at <path>"),
    "key": (KeyError("HOME"), "KeyError: 'HOME'"),
    "os": (FileNotFoundError(2, "No such file", "/srv/data/vocab.txt"),
           "FileNotFoundError: [Errno 2] No such file: '<path>'"),
    "value": (ValueError("bad default"), "ValueError: bad default"),
}


@pytest.mark.parametrize("kind", sorted(IMPORT_FAILURES))
def test_any_import_error_of_one_task_lists_it_with_its_error_and_the_others_intact(
        client, tokens, monkeypatch, kind):
    exc, expected = IMPORT_FAILURES[kind]
    real = trainers.get_task

    def get_task(name):
        if name == "digits":
            raise exc
        return real(name)

    body = _listed(client, tokens, monkeypatch, get_task)
    listed = {t["name"]: t for t in body["tasks"]}
    assert listed["digits"] == {"name": "digits", "objective": None, "metrics": {},
                                "options": [], "error": expected}
    assert listed["charlm"]["error"] is None and listed["charlm"]["options"]


class _BadOptions:  # not a dataclass: describing its fields raises TypeError
    pass


@dataclasses.dataclass(kw_only=True)
class _UnsupportedOptions:  # an annotation the schema does not support: KeyError
    shape: list = dataclasses.field(default_factory=list)


@pytest.mark.parametrize(("options", "expected"), [
    (_BadOptions, "TypeError: must be called with a dataclass type or instance"),
    (_UnsupportedOptions, "KeyError: <class 'list'>"),
])
def test_a_task_whose_options_schema_fails_is_listed_with_its_error(
        client, tokens, monkeypatch, options, expected):
    real = trainers.get_task
    broken = type("Broken", (real("digits"),), {"Options": options})
    body = _listed(client, tokens, monkeypatch,
                   lambda name: broken if name == "digits" else real(name))
    listed = {t["name"]: t for t in body["tasks"]}
    assert listed["digits"]["error"] == expected and listed["digits"]["options"] == []
    assert listed["charlm"]["error"] is None


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
