"""The app factory: ``create_app(settings)`` builds the REST API, the dashboard and the dispatcher.

Nothing is built at import time. The database engine, the Optuna storage and
the tables are made here; the dispatcher (when ``settings.run_dispatcher``)
starts and stops with the app's lifespan. Routes are registered before the
dashboard, which is mounted at ``/`` and answers every other path; a method that an
API route's path does not take answers 405 (:class:`service.middleware.MethodGuard`).
"""

from __future__ import annotations

import contextlib
import logging

import anyio.to_thread
from fastapi import FastAPI
from fastapi.responses import JSONResponse

from hpo import lease
from hpo.storage import open_storage
from service import api_errors, migrate
from service.api_processes import DispatcherStatus
from service.dashboard import build_dashboard
from service.db import build_engine, session_factory
from service.deps import Components
from service.health import Readiness
from service.logs import RequestId
from service.metrics import HttpMetrics, Metrics
from service.middleware import BodyLimit, MethodGuard, SecurityHeaders
from service.openapi import install_openapi
from service.routers import audit, health, metrics, models, studies, tasks, tokens
from service.settings import Settings
from service.studies import StudyService

log = logging.getLogger(__name__)
ANY_METHOD = ["GET", "HEAD", "POST", "PUT", "PATCH", "DELETE", "OPTIONS", "TRACE", "CONNECT"]


def create_app(settings: Settings | None = None,
               dispatcher_status: DispatcherStatus | None = None) -> FastAPI:
    """The service as an ASGI app.

    Args:
        settings: default ``Settings.from_env()``.
        dispatcher_status: in an API process that runs no dispatcher, the state another
            process publishes of its own (``service.api_processes``), for ``/readyz`` and
            ``/metrics``; ignored where ``settings.run_dispatcher``.

    Raises:
        hpo.errors.StorageError: the database cannot be opened.
        service.errors.SettingsError: a bad environment variable (default settings only).
        service.migrate.SchemaOutdated: the service's tables need ``hpo db upgrade``.
    """
    settings = settings or Settings.from_env()
    engine_pool, storage_pool = settings.api_pool_sizes
    engine = build_engine(settings.database_url, pool_size=engine_pool)
    migrate.prepare(engine, auto=settings.migrate_on_start)
    lease.create_table(engine)  # drivers make it too; made here, deletes need not look for it
    # checked as the service's engine is (a request may fail once, a record write may not)
    storage = open_storage(settings.database_url, pool_size=storage_pool, pre_ping=False)
    sessions = session_factory(engine)
    study_service = StudyService(settings, sessions, storage)
    dispatcher = None
    if settings.run_dispatcher:
        from service.dispatcher import Dispatcher

        dispatcher = Dispatcher(settings, sessions, study_service)
        study_service.on_queued = dispatcher.wake
    # what /readyz and /metrics say of the dispatcher: this process's, or the one another
    # API process runs (its published status, service.api_processes)
    seen = dispatcher or dispatcher_status
    readiness = Readiness(engine, settings.ray_address,
                          seen.alive if seen is not None else None,
                          seen.warm_driver if seen is not None
                          and settings.warm_drivers else None,
                          settings.results_dir if dispatcher is not None else None)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        # the event loop's thread pool, which runs the synchronous routes: as many threads
        # as the pools above keep connections (anyio's default is 40)
        anyio.to_thread.current_default_thread_limiter().total_tokens = settings.api_threads
        if dispatcher is not None:
            dispatcher.start()
        try:
            yield
        finally:
            if dispatcher is not None:
                dispatcher.shutdown()
            storage.engine.dispose()
            engine.dispose()

    app = FastAPI(title="hpo-service", version="0.1.0", lifespan=lifespan,
                  description="Hyperparameter optimization of PyTorch training: Optuna studies "
                              "on Ray Tune. The Optuna dashboard is at /dashboard.")
    app.state.components = Components(settings, sessions, study_service, readiness)
    app.state.dispatcher = dispatcher
    api_errors.install(app)
    app.state.metrics = Metrics(sessions, seen)
    routers = (health.router, studies.router, models.router, tasks.router, metrics.router,
               tokens.router, audit.router)
    for router in routers:
        app.include_router(router)
    install_openapi(app)
    # the paths that answer 405 to other methods (not the dashboard): the routers' and /docs'
    api_routes = [*app.router.routes, *(route for r in routers for route in r.routes)]

    @app.api_route("/v1/{rest:path}", include_in_schema=False, methods=ANY_METHOD)
    def unknown_api_path(rest: str) -> JSONResponse:
        # without it, an unknown /v1 path falls through to the dashboard's HTML 404
        return api_errors.error_response(404, "not_found", f"no such API path: /v1/{rest}")

    app.mount("/", build_dashboard(storage, sessions, settings))
    app.add_middleware(BodyLimit, max_bytes=settings.max_body_bytes,
                       timeout_s=settings.body_timeout_s)
    app.add_middleware(MethodGuard, routes=api_routes)
    app.add_middleware(SecurityHeaders)
    app.add_middleware(HttpMetrics, metrics=app.state.metrics)
    app.add_middleware(RequestId)  # outermost: every log line of a request carries its id
    return app
