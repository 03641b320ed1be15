"""``GET /metrics``: Prometheus' text format (:mod:`service.metrics`), for an admin token
unless ``HPO_METRICS_OPEN=true``."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import Response

from service.auth import bearer, resolve
from service.deps import ComponentsDep
from service.errors import Forbidden

router = APIRouter()


@router.get("/metrics", include_in_schema=False)
def metrics(request: Request, c: ComponentsDep) -> Response:
    """The service's metrics.

    Raises:
        NotAuthenticated: (401) no token or an unknown one, unless the metrics are open.
        Forbidden: (403) a token that is not an admin's.
    """
    if not c.settings.metrics_open:
        who = resolve(c.sessions, bearer(request.headers.get("authorization")))
        if not who.is_admin:
            raise Forbidden("the metrics need an admin token (or HPO_METRICS_OPEN=true)")
    body, content_type = request.app.state.metrics.exposition()
    return Response(body, media_type=content_type)
