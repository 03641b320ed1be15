"""Prometheus metrics at ``/metrics`` (prometheus-client), in the text exposition format.

HTTP, measured by :class:`HttpMetrics` (ASGI middleware) in this process:

* ``hpo_http_requests_total{route,method,status}``: answered requests, by route template
  (``/v1/studies/{name}``; ``dashboard`` for the dashboard, ``unmatched`` for no route);
* ``hpo_http_request_duration_seconds{route,method}``: a histogram of their durations.

Read from the database at each scrape (:class:`StoreCollector`; one query per table):

* ``hpo_studies{status}``: studies by status; ``hpo_queue_depth``: QUEUED studies;
* ``hpo_driver_heartbeat_age_seconds``: seconds since the oldest last heartbeat of a
  RUNNING study's driver (since it started, for one without a heartbeat; 0 when none
  runs), on this process's clock against the
  drivers' own: a driver is taken over after ``HPO_HEARTBEAT_TIMEOUT_S`` of silence, and a
  local driver silent (or deaf to a stop) for 3 x that (60 s at least) is killed;
* ``hpo_trials{state}``: the stored studies' trials by state (``complete``, ``pruned``,
  ``failed``, ``running``, ``waiting``; a gauge: deleting a study removes its trials);
* ``hpo_device_seconds_total{owner}``: device-seconds of finished trials by owner (token
  name), deleted studies' included (``hpo_owner_usage``), so it only grows.

Quotas and fair share (``service.quotas``), read at each scrape:

* ``hpo_quota_limit{owner,limit}``: each owner's set limits (``max_running_trials``,
  ``max_gpus``, ``device_seconds_per_day``, ``device_seconds_total``);
* ``hpo_owner_running_trials{owner}``, ``hpo_owner_gpus_held{owner}``,
  ``hpo_owner_device_seconds_24h{owner}``: each owner's use now (owners with a quota, a
  running trial or use in the last 24 h);
* ``hpo_studies_waiting``: QUEUED or RUNNING studies waiting for a quota (``waiting_for``).

The dispatcher (absent where the service runs none; with several API processes, the other
processes read it from the first one's status file, ``service.api_processes``):

* ``hpo_dispatcher_heartbeat_age_seconds``: since its last complete round;
* ``hpo_driver_restarts_total``: drivers started for a study that ran before (requeued at
  a shutdown, or taken over), ``hpo_study_takeovers_total``: of those, studies whose driver
  was gone.

``/metrics`` needs an admin token unless ``HPO_METRICS_OPEN=true``.
"""

from __future__ import annotations

import time
from collections import defaultdict

import sqlalchemy as sa
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.multiprocess import MultiProcessCollector
from sqlalchemy.orm import sessionmaker

from hpo.summary import StudySummary
from service import quotas
from service.api_processes import shared_metrics_dir
from service.db import VISIBLE, Status, StudyRow, SummaryRow, TokenRow, UsageRow, utcnow

disable_created_metrics()  # no *_created series: they double every counter's series count
# a client may send any method name: others are one label, so labels stay bounded
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS"})
TRIAL_STATES = ("complete", "pruned", "failed", "running", "waiting")
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class Metrics:
    """The service's registry: HTTP metrics, the store's and the dispatcher's.

    Args:
        sessions: a session factory on the service's engine.
        dispatcher: this process's dispatcher, its published status
            (``service.api_processes.DispatcherStatus``), or ``None``.
    """

    def __init__(self, sessions: sessionmaker, dispatcher=None) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        # several API processes (service.api_processes): each writes its HTTP counts to the
        # shared directory and a scrape adds up every process's (prometheus-client's
        # multiprocess mode); one process: its own registry holds them
        shared = shared_metrics_dir()
        own = None if shared else self.registry
        self.requests = Counter("hpo_http_requests", "HTTP requests answered",
                                ["route", "method", "status"], registry=own)
        self.latency = Histogram("hpo_http_request_duration_seconds",
                                 "time to answer an HTTP request, in seconds",
                                 ["route", "method"], buckets=LATENCY_BUCKETS, registry=own)
        if shared:
            MultiProcessCollector(self.registry, path=shared)
        self.registry.register(StoreCollector(sessions, dispatcher))

    def exposition(self) -> tuple[bytes, str]:
        """The text format and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST


class StoreCollector:
    """Reads the studies, their summaries and usage at each scrape (see module doc)."""

    def __init__(self, sessions: sessionmaker, dispatcher=None) -> None:
        self.sessions = sessions
        self.dispatcher = dispatcher

    def describe(self):
        return []  # collected at scrape time only: no database query at registration

    def collect(self):
        with self.sessions() as session:
            by_status = dict(session.execute(
                sa.select(StudyRow.status, sa.func.count()).group_by(StudyRow.status)).all())
            summaries = session.execute(
                sa.select(TokenRow.name, SummaryRow.summary)
                .join(StudyRow, StudyRow.id == SummaryRow.study_id)
                .outerjoin(TokenRow, TokenRow.id == StudyRow.owner_id)
                .where(StudyRow.status.in_(VISIBLE))).all()
            retired = session.execute(sa.select(TokenRow.name, UsageRow.device_seconds)
                                      .join(TokenRow, TokenRow.id == UsageRow.owner_id)).all()
            owners = quotas.owners_report(session)
            # a RUNNING study without a heartbeat (the dispatcher takes it for stale):
            # since it started
            oldest_beat = session.execute(sa.select(sa.func.min(sa.func.coalesce(
                StudyRow.heartbeat_at, StudyRow.started_at, StudyRow.created_at))).where(
                StudyRow.status == Status.RUNNING)).scalar_one()
            waiting = session.execute(sa.select(sa.func.count()).select_from(StudyRow).where(
                StudyRow.waiting_for.is_not(None),
                StudyRow.status.in_([Status.QUEUED, Status.RUNNING]))).scalar_one()
        studies = GaugeMetricFamily("hpo_studies", "studies by status", labels=["status"])
        for status in VISIBLE:
            studies.add_metric([status], by_status.get(status, 0))
        yield studies
        yield GaugeMetricFamily("hpo_queue_depth", "QUEUED studies",
                                value=by_status.get(Status.QUEUED, 0))
        yield GaugeMetricFamily(
            "hpo_driver_heartbeat_age_seconds", "seconds since the oldest last heartbeat "
            "of a RUNNING study's driver (0 when none runs)",
            value=0.0 if oldest_beat is None
            else max(0.0, (utcnow() - oldest_beat).total_seconds()))
        trials = dict.fromkeys(TRIAL_STATES, 0)
        used: dict[str, float] = defaultdict(float)
        for owner, text in summaries:
            summary = StudySummary.from_json(text)
            for state in TRIAL_STATES:
                trials[state] += getattr(summary.counts, state)
            used[owner or "(none)"] += summary.device_seconds_finished
        for owner, seconds in retired:
            used[owner] += seconds
        gauge = GaugeMetricFamily("hpo_trials", "trials of the stored studies by state",
                                  labels=["state"])
        for state, n in trials.items():
            gauge.add_metric([state], n)
        yield gauge
        counter = CounterMetricFamily("hpo_device_seconds", "device-seconds of finished "
                                      "trials by owner, deleted studies included",
                                      labels=["owner"])
        for owner in sorted(used):
            counter.add_metric([owner], used[owner])
        yield counter
        yield from _quota_metrics(owners, waiting)
        yield from self._dispatcher()

    def _dispatcher(self):
        d = self.dispatcher
        if d is None:
            return
        if d.last_round_at is not None:
            yield GaugeMetricFamily("hpo_dispatcher_heartbeat_age_seconds",
                                    "seconds since the dispatcher's last complete round",
                                    value=time.monotonic() - d.last_round_at)
        yield CounterMetricFamily("hpo_driver_restarts", "drivers started for a study that "
                                  "ran before (requeued or taken over)", value=d.restarts)
        yield CounterMetricFamily("hpo_study_takeovers", "studies taken over from a driver "
                                  "that was gone", value=d.takeovers)


def _quota_metrics(owners: dict[str, quotas.OwnerQuota], waiting: int):
    limit = GaugeMetricFamily("hpo_quota_limit", "owners' quota limits", labels=["owner",
                                                                             "limit"])
    running = GaugeMetricFamily("hpo_owner_running_trials", "trials running now, by owner",
                                labels=["owner"])
    gpus = GaugeMetricFamily("hpo_owner_gpus_held", "GPUs held by running trials, by owner",
                             labels=["owner"])
    day = GaugeMetricFamily("hpo_owner_device_seconds_24h", "device-seconds in the last "
                            "24 h (running trials so far included), by owner", labels=["owner"])
    for owner in sorted(owners):
        q = owners[owner]
        for name in quotas.LIMITS:
            value = getattr(q.limits, name)
            if value is not None:
                limit.add_metric([owner, name], value)
        running.add_metric([owner], q.use.running_trials)
        gpus.add_metric([owner], q.use.gpus)
        day.add_metric([owner], q.use.device_seconds_24h)
    yield from (limit, running, gpus, day)
    yield GaugeMetricFamily("hpo_studies_waiting", "QUEUED or RUNNING studies waiting for a "
                            "quota", value=waiting)


class HttpMetrics:
    """ASGI middleware counting answers and their durations by route template (read from
    the route the router matched, ``scope["route"]``).

    An answer is counted just before its last body message is sent, so that a scrape made
    after a client got its answer counts it (counted after the send, a scrape from the
    same client could beat the count); an answer the app never completed counts once, as
    it ends (status 500 if it never started one)."""

    def __init__(self, app, metrics: Metrics) -> None:
        self.app = app
        self.metrics = metrics

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        status = 500
        start = time.perf_counter()
        counted = False

        def count() -> None:
            nonlocal counted
            counted = True
            method = scope["method"] if scope["method"] in METHODS else "other"
            label = _route_label(scope)
            self.metrics.requests.labels(label, method, str(status)).inc()
            self.metrics.latency.labels(label, method).observe(time.perf_counter() - start)

        async def watch(message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            elif (message["type"] == "http.response.body" and not message.get("more_body")
                  and not counted):
                count()
            await send(message)

        try:
            await self.app(scope, receive, watch)
        finally:
            if not counted:
                count()


def _route_label(scope) -> str:
    """The route template a request matched, ``dashboard`` or ``unmatched``."""
    route = scope.get("route")
    if route is not None:
        return route.path or "dashboard"
    if scope.get("endpoint") is not None:  # Starlette's Mount sets no route: the
        return "dashboard"  # dashboard, mounted at /, is the app's only mount
    return "unmatched"
