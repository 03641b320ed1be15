"""Prometheus metrics at /metrics (issue 14.2): admin only unless open; every value checked
by parsing the output with prometheus-client's own parser."""

from __future__ import annotations

import asyncio
import datetime as dt

import pytest
import sqlalchemy as sa
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

from hpo import lease
from hpo.summary import StudySummary, TrialCounts
from service.app import create_app
from service.db import StudyRow, TokenRow, UsageRow
from service.metrics import HttpMetrics, Metrics
from service.settings import Settings
from service.summaries import remove_unused_deleting
from tests.service.conftest import bearer, record_summary, tiny_spec

BACKENDS = pytest.mark.parametrize("settings", ["sqlite", "postgresql"], indirect=True)


@pytest.fixture
def settings(request, sqlite_url, tmp_path) -> Settings:
    """conftest's settings, on PostgreSQL (a schema of the test's own) for a test that asks
    with ``BACKENDS``: a delete there takes a path of its own (one statement)."""
    on_pg = getattr(request, "param", "sqlite") == "postgresql"
    return Settings(database_url=request.getfixturevalue("pg_url") if on_pg else sqlite_url,
                    results_dir=tmp_path / "results", run_dispatcher=False)


def samples(text: str) -> dict[tuple[str, tuple], float]:
    """``{(sample name, sorted labels): value}`` of an exposition."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def test_metrics_need_an_admin_token_unless_open(client, tokens, settings):
    assert client.get("/metrics").status_code == 401
    refused = client.get("/metrics", headers=bearer(tokens["alice"]))
    assert refused.status_code == 403
    assert refused.json()["error"]["message"] == ("the metrics need an admin token (or "
                                                  "HPO_METRICS_OPEN=true)")
    answer = client.get("/metrics", headers=bearer(tokens["admin"]))
    assert answer.status_code == 200
    assert answer.headers["content-type"].startswith("text/plain; version=")
    with TestClient(create_app(settings.replace(metrics_open=True))) as open_client:
        assert open_client.get("/metrics").status_code == 200


def _summarize(client, name: str, counts: TrialCounts, seconds: float) -> None:
    record_summary(client.app, name, StudySummary(
        optuna_study_id=None, n_objectives=1, counts=counts, device_seconds_finished=seconds))


def _set_status(client, name: str, status: str) -> None:
    with client.app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(status=status))


def test_metrics_count_studies_trials_usage_and_requests(client, tokens):
    admin, alice, bob = (bearer(tokens[k]) for k in ("admin", "alice", "bob"))
    for name, who in (("a1", alice), ("a2", alice), ("b1", bob)):
        assert client.post("/v1/studies", json=tiny_spec(name), headers=who).status_code == 201
    _summarize(client, "a1", TrialCounts(complete=3, pruned=1, running=2), 12.5)
    _summarize(client, "a2", TrialCounts(complete=1, failed=2, waiting=1), 2.0)
    _summarize(client, "b1", TrialCounts(pruned=4), 7.25)
    _set_status(client, "a1", "RUNNING")
    _set_status(client, "a2", "COMPLETED")
    assert client.delete("/v1/studies/a2", headers=alice).status_code == 204  # usage stays
    assert client.get("/v1/studies/nope", headers=alice).status_code == 404
    assert client.get("/dashboard/login").status_code == 200  # the dashboard's mount
    values = samples(client.get("/metrics", headers=admin).text)
    assert {status: values[("hpo_studies", (("status", status),))] for status in
            ("QUEUED", "RUNNING", "COMPLETED", "STOPPED", "FAILED")} == {
        "QUEUED": 1, "RUNNING": 1, "COMPLETED": 0, "STOPPED": 0, "FAILED": 0}
    assert values[("hpo_queue_depth", ())] == 1
    assert {state: values[("hpo_trials", (("state", state),))] for state in
            ("complete", "pruned", "failed", "running", "waiting")} == {
        "complete": 3, "pruned": 5, "failed": 0, "running": 2, "waiting": 0}
    assert values[("hpo_device_seconds_total", (("owner", "alice"),))] == 14.5
    assert values[("hpo_device_seconds_total", (("owner", "bob"),))] == 7.25
    posts = ("hpo_http_requests_total", (("method", "POST"), ("route", "/v1/studies"),
                                         ("status", "201")))
    assert values[posts] == 3
    missing = ("hpo_http_requests_total", (("method", "GET"), ("route", "/v1/studies/{name}"),
                                           ("status", "404")))
    assert values[missing] == 1
    dashboard = ("hpo_http_requests_total", (("method", "GET"), ("route", "dashboard"),
                                             ("status", "200")))
    assert values[dashboard] == 1
    durations = ("hpo_http_request_duration_seconds_count",
                 (("method", "POST"), ("route", "/v1/studies")))
    assert values[durations] == 3


@pytest.mark.parametrize("path", ["/v1/studies", "/healthz"])
def test_no_metric_name_breaks_prometheus_conventions(client, tokens, path):
    client.get(path, headers=bearer(tokens["alice"]))
    text = client.get("/metrics", headers=bearer(tokens["admin"])).text
    for family in text_string_to_metric_families(text):
        assert family.name.startswith("hpo_"), family.name
        if family.type == "counter":
            assert all(s.name.endswith("_total") for s in family.samples)
        if "duration" in family.name or "age" in family.name:
            assert family.name.endswith("_seconds"), family.name


@BACKENDS
def test_deleting_a_study_removes_its_free_driver_lease_only(client, tokens):
    """A deleted study leaves no row in hpo_leases behind, unless a live holder keeps it."""
    from hpo import lease

    engine = client.app.state.components.sessions.kw["bind"]
    alice = bearer(tokens["alice"])
    lease.create_table(engine)
    for name in ("freed", "held"):
        assert client.post("/v1/studies", json=tiny_spec(name), headers=alice).status_code == 201
        assert lease.acquire(engine, name, "driver-1", host="elsewhere", pid=1)
    assert lease.release(engine, "freed", "driver-1")
    for name in ("freed", "held"):
        assert client.delete(f"/v1/studies/{name}", headers=alice).status_code == 204
    assert lease.read(engine, "freed") is None
    assert lease.read(engine, "held").holder == "driver-1"


def test_unknown_methods_share_one_label(client, tokens):
    for i in range(20):
        client.request(f"WEIRD{i}", "/healthz")
    values = samples(client.get("/metrics", headers=bearer(tokens["admin"])).text)
    counted = {dict(labels)["method"]: value for (name, labels), value in values.items()
               if name == "hpo_http_requests_total"}
    assert counted == {"other": 20}  # this scrape is counted after it answers


@BACKENDS
def test_deleting_studies_adds_their_finished_device_seconds_and_nothing_for_none(client,
                                                                                   tokens):
    # a deleted study's device-seconds move into its owner's usage row; one that never ran
    # adds no row (concurrent deletes of one owner's unstarted studies share no row lock)
    admin, alice, bob = (bearer(tokens[k]) for k in ("admin", "alice", "bob"))
    for name, who in (("ran", alice), ("idle", bob), ("idle2", alice)):
        assert client.post("/v1/studies", json=tiny_spec(name), headers=who).status_code == 201
    _summarize(client, "ran", TrialCounts(complete=2), 3.5)
    for name, who in (("ran", alice), ("idle", bob), ("idle2", alice)):
        _set_status(client, name, "COMPLETED")
        assert client.delete(f"/v1/studies/{name}", headers=who).status_code == 204
    with client.app.state.components.sessions() as session:
        usage = session.execute(sa.select(TokenRow.name, UsageRow.device_seconds).join(
            TokenRow, TokenRow.id == UsageRow.owner_id)).all()
    assert sorted(usage) == [("alice", 3.5)]
    values = samples(client.get("/metrics", headers=admin).text)
    assert values[("hpo_device_seconds_total", (("owner", "alice"),))] == 3.5
    assert ("hpo_device_seconds_total", (("owner", "bob"),)) not in values


@BACKENDS
def test_device_seconds_a_summary_got_after_its_study_was_marked_deleting_are_kept(client,
                                                                                    tokens):
    # the one-statement removal of a study that had none when marked (PostgreSQL) removes
    # nothing if its summary changed since, and the transaction's path then adds them
    alice = bearer(tokens["alice"])
    assert client.post("/v1/studies", json=tiny_spec("late"), headers=alice).status_code == 201
    _set_status(client, "late", "DELETING")
    _summarize(client, "late", TrialCounts(complete=1), 2.25)
    sessions = client.app.state.components.sessions
    lease.create_table(sessions.kw["bind"])
    assert remove_unused_deleting(sessions, "late", None) is False  # seen: no summary
    with sessions() as session:
        assert session.execute(sa.select(StudyRow.status).where(
            StudyRow.name == "late")).scalar_one() == "DELETING"
    client.app.state.components.studies.purge("late", seen=(None, None))  # marked: no summary
    with sessions() as session:
        assert session.execute(sa.select(StudyRow).where(StudyRow.name == "late")).first() is None
        assert session.execute(sa.select(UsageRow.device_seconds)).scalars().all() == [2.25]


def _http_scope(path: str) -> dict:
    return {"type": "http", "method": "GET", "path": path, "headers": [],
            "query_string": b""}


def _http_samples(metrics: Metrics) -> dict[tuple[str, tuple], float]:
    """The HTTP counters' samples (the store's collector needs a database: not read)."""
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for collector in (metrics.requests, metrics.latency)
            for family in collector.collect() for s in family.samples}


@pytest.mark.parametrize("chunks", [1, 3])
def test_an_answer_is_counted_before_its_last_body_message_is_sent(chunks):
    """A scrape made once a client has its answer counts it: the count is made before the
    answer's last body message goes out, for one-message and streamed answers alike."""
    metrics = Metrics(sessions=None)
    key = ("hpo_http_requests_total", (("method", "GET"), ("route", "unmatched"),
                                       ("status", "200")))

    async def app(scope, receive, send):
        await send({"type": "http.response.start", "status": 200, "headers": []})
        for i in range(chunks):
            await send({"type": "http.response.body", "body": b"x",
                        "more_body": i < chunks - 1})

    seen = []

    async def send(message):
        if message["type"] == "http.response.body":
            seen.append((message.get("more_body", False),
                         _http_samples(metrics).get(key)))

    asyncio.run(HttpMetrics(app, metrics)(_http_scope("/x"), None, send))
    assert seen == [(True, None)] * (chunks - 1) + [(False, 1.0)]


def test_an_app_that_raises_before_answering_counts_one_500():
    metrics = Metrics(sessions=None)

    async def app(scope, receive, send):
        raise RuntimeError("boom")

    async def send(message):
        raise AssertionError("nothing is sent")

    with pytest.raises(RuntimeError):
        asyncio.run(HttpMetrics(app, metrics)(_http_scope("/x"), None, send))
    values = _http_samples(metrics)
    assert values[("hpo_http_requests_total", (("method", "GET"), ("route", "unmatched"),
                                               ("status", "500")))] == 1.0
    assert values[("hpo_http_request_duration_seconds_count",
                   (("method", "GET"), ("route", "unmatched")))] == 1.0


@BACKENDS
def test_the_driver_heartbeat_age_is_the_oldest_running_studys(client, tokens, settings):
    admin, alice = bearer(tokens["admin"]), bearer(tokens["alice"])

    def age() -> float:
        return samples(client.get("/metrics", headers=admin).text)[
            ("hpo_driver_heartbeat_age_seconds", ())]

    assert age() == 0  # no study runs
    now = dt.datetime.now(dt.UTC)
    for name, silent_s, status in (("fresh", 2, "RUNNING"), ("silent", 95, "RUNNING"),
                                   ("ended", 4000, "COMPLETED"), ("queued", None, "QUEUED")):
        assert client.post("/v1/studies", json=tiny_spec(name), headers=alice).status_code == 201
        with client.app.state.components.sessions.begin() as session:
            session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(
                status=status, heartbeat_at=None if silent_s is None
                else now - dt.timedelta(seconds=silent_s)))
    assert 95 <= age() < 95 + 30  # the silent driver's, not the ended study's
    _set_status(client, "silent", "STOPPED")
    assert 2 <= age() < 2 + 30
    with client.app.state.components.sessions.begin() as session:  # no heartbeat at all
        session.execute(sa.update(StudyRow).where(StudyRow.name == "queued").values(
            status="RUNNING", started_at=now - dt.timedelta(seconds=300)))
    assert 300 <= age() < 300 + 30
