"""``/v1/studies``: create, list, read, stop and delete studies; read their trials."""

from __future__ import annotations

import re
from typing import Annotated, Any

from fastapi import APIRouter, Depends, Path, Query, Request, Response, status

from hpo.errors import SpecError
from hpo.spec import NAME_PATTERN, parse_text
from service.api_errors import documented as errors
from service.auth import Principal
from service.db import Status, VisibleStatus
from service.deps import ReadCall, WriteCall
from service.errors import MalformedBody, StudyNotFound, UnsupportedMediaType
from service.openapi import spec_body
from service.schemas import Page, StudyOut, StudySummary, TrialOut

router = APIRouter(prefix="/v1/studies", tags=["studies"])

JSON_TYPES = {"application/json"}
YAML_TYPES = {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"}
READ = errors(401, 404, 503)  # every route with a token and a study name
WRITE = errors(401, 403, 404, 408, 409, 413, 503)  # 403: a viewer; 408, 413: any body
Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="items to skip")]
TrialNumber = Annotated[int, Path(ge=0, le=2**31 - 1, description="the trial's number")]


async def study_name(name: Annotated[str, Path(description="the study's name")]) -> str:
    """The ``{name}`` of the address; one no study can have (a NUL byte, a slash, ...) answers
    404 at once, never reaching the database (PostgreSQL refuses NUL in text). ``async``:
    no I/O, so no hand-over to the thread pool."""
    if not re.fullmatch(NAME_PATTERN, name):
        raise StudyNotFound(f"no study named {name!r}")
    return name


StudyName = Annotated[str, Depends(study_name)]


def spec_media(request: Request) -> str:
    """The body's media type, JSON or YAML (case-insensitive, RFC 9110; none given: JSON).

    Raises:
        UnsupportedMediaType: neither JSON nor YAML.
    """
    media = (request.headers.get("content-type") or "application/json").split(";")[0]
    media = media.strip().lower()
    if media not in JSON_TYPES | YAML_TYPES:
        raise UnsupportedMediaType(f"send the spec as application/json or application/yaml, "
                                   f"not {media}")
    return media


def parse_spec_body(body: bytes, media: str) -> Any:
    """The body as data, by its media type (:func:`spec_media`).

    Raises:
        MalformedBody: not well-formed JSON/YAML, or not UTF-8.
    """
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedBody("the body is not UTF-8 text") from None
    try:  # hpo's own parser: duplicate keys, YAML aliases and runaway nesting are refused
        return parse_text(text, json_only=media in JSON_TYPES)
    except SpecError as e:
        raise MalformedBody(f"the body is {e.errors[0]['msg']}") from None


@router.post("", status_code=status.HTTP_201_CREATED, response_model=StudyOut,
             responses=errors(400, 401, 403, 408, 409, 413, 415, 422, 503),
             openapi_extra={"requestBody": spec_body()})
async def create_study(request: Request, call: WriteCall, response: Response) -> StudyOut:
    """Validate and store a study spec, create its Optuna study and queue it."""
    # The body's bytes are already here: service.middleware.BodyLimit has read all of it
    # (at most max_body_bytes, within body_timeout_s) before any route runs. Nothing of it is
    # parsed before the token is resolved; the token, the parse and the create take one
    # hand-over to the thread pool (two, token then create, made a create wait twice for a
    # thread: a fifth of its time under bench/load.py). The answers keep their order: the
    # token's (401, 403), the media type's (415), the body's (400), the spec's (422).
    body = await request.body()

    def create(who: Principal) -> StudyOut:
        data = parse_spec_body(body, spec_media(request))
        return StudyOut.of(call.studies.create(data, who, call.auditor(who)))

    out = await call.run(create)
    response.headers["Location"] = f"/v1/studies/{out.name}"
    return out


# Each route below does its work in one hand-over to the thread pool (service.deps.Call).


@router.get("", response_model=Page[StudySummary], responses=errors(401, 422, 503))
async def list_studies(call: ReadCall, status: VisibleStatus | None = None, offset: Offset = 0,
                       limit: Limit = 50) -> Page[StudySummary]:
    """The studies this token may see, newest first, optionally of one status."""
    def page(who: Principal) -> Page[StudySummary]:
        views, total = call.studies.list(who, status and Status(status), offset, limit)
        return Page[StudySummary](items=[StudySummary.of(v) for v in views], total=total,
                                  offset=offset, limit=limit)
    return await call.run(page)


@router.get("/{name}", response_model=StudyOut, responses=READ)
async def get_study(name: StudyName, call: ReadCall) -> StudyOut:
    """A study: status, spec, trial counts by state, best trial, progress, device-seconds."""
    return await call.run(lambda who: StudyOut.of(call.studies.view(who, name)))


@router.get("/{name}/trials", response_model=Page[TrialOut], responses={**READ, **errors(422)})
async def list_trials(name: StudyName, call: ReadCall, offset: Offset = 0, limit: Limit = 50,
                      intermediate: bool = False) -> Page[TrialOut]:
    """A page of the study's trials by number; ``intermediate=true`` adds their curves."""
    def page(who: Principal) -> Page[TrialOut]:
        trials, total = call.studies.trials(who, name, offset, limit,
                                            intermediate=intermediate)
        return Page[TrialOut](items=[TrialOut.of(t, intermediate) for t in trials],
                              total=total, offset=offset, limit=limit)
    return await call.run(page)


@router.get("/{name}/trials/{number}", response_model=TrialOut,
            responses={**READ, **errors(422)})
async def get_trial(name: StudyName, number: TrialNumber, call: ReadCall) -> TrialOut:
    """One trial with its intermediate values."""
    return await call.run(lambda who: TrialOut.of(call.studies.trial(who, name, number),
                                                  intermediate=True))


@router.post("/{name}/stop", status_code=status.HTTP_202_ACCEPTED, response_model=StudyOut,
             responses=WRITE)
async def stop_study(name: StudyName, call: WriteCall) -> StudyOut:
    """Stop a study: QUEUED ends STOPPED now, RUNNING ends its trials within seconds."""
    def stop(who: Principal) -> StudyOut:
        return StudyOut.of(call.studies.stop(who, name, call.auditor(who)))
    return await call.run(stop)


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=WRITE)
async def delete_study(name: StudyName, call: WriteCall) -> Response:
    """Delete a study that is not running, with its trials and result files."""
    def delete(who: Principal) -> None:
        call.studies.delete(who, name, call.auditor(who))
    await call.run(delete)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
