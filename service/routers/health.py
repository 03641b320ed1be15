"""``/healthz`` (the process answers) and ``/readyz`` (database, Ray and dispatcher answer)."""

from __future__ import annotations

from fastapi import APIRouter
from fastapi.responses import JSONResponse

from service.deps import ComponentsDep
from service.schemas import Health

router = APIRouter(tags=["health"])


@router.get("/healthz", response_model=Health)
def healthz() -> Health:
    """Liveness: 200 whenever the process serves requests."""
    return Health(status="ok")


@router.get("/readyz", response_model=Health, responses={503: {"model": Health}})
def readyz(c: ComponentsDep) -> JSONResponse:
    """Readiness: 200 when every check is ok (or not configured), else 503."""
    checks = c.readiness.checks()
    ready = all(not v.startswith("error") for v in checks.values())
    body = Health(status="ready" if ready else "not ready", checks=checks)
    return JSONResponse(body.model_dump(), status_code=200 if ready else 503)
