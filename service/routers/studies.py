"""``/v1/studies``: create, list, read, stop and delete studies; read their trials."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response, status
from starlette.concurrency import run_in_threadpool

from hpo.errors import SpecError
from hpo.spec import parse_text
from service.db import Status
from service.deps import Reader, StudiesDep, Writer
from service.errors import MalformedBody, UnsupportedMediaType
from service.schemas import ErrorBody, Page, StudyOut, StudySummary, TrialOut

router = APIRouter(prefix="/v1/studies", tags=["studies"])

JSON_TYPES = {"application/json"}
YAML_TYPES = {"application/yaml", "application/x-yaml", "text/yaml", "text/x-yaml"}
ERRORS = {code: {"model": ErrorBody} for code in (400, 401, 404, 409, 413, 415, 422)}
Limit = Annotated[int, Query(ge=1, le=500, description="page size")]
Offset = Annotated[int, Query(ge=0, le=2**31 - 1, description="items to skip")]
TrialNumber = Annotated[int, Path(ge=0, le=2**31 - 1, description="the trial's number")]


async def read_spec_body(request: Request) -> Any:
    """The body as data: JSON, or YAML with a YAML content type.

    Raises:
        UnsupportedMediaType: neither JSON nor YAML.
        MalformedBody: not well-formed JSON/YAML, or not UTF-8.
    """
    # media types are case-insensitive (RFC 9110); none given: JSON
    media = (request.headers.get("content-type") or "application/json").split(";")[0]
    media = media.strip().lower()
    if media not in JSON_TYPES | YAML_TYPES:
        raise UnsupportedMediaType(f"send the spec as application/json or application/yaml, "
                                   f"not {media}")
    body = await request.body()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedBody("the body is not UTF-8 text") from None
    try:  # hpo's own parser: duplicate keys, YAML aliases and runaway nesting are refused
        return parse_text(text, json_only=media in JSON_TYPES)
    except SpecError as e:
        raise MalformedBody(f"the body is {e.errors[0]['msg']}") from None


@router.post("", status_code=status.HTTP_201_CREATED, response_model=StudyOut, responses=ERRORS,
             openapi_extra={"requestBody": {"required": True, "content": {
                 "application/json": {"schema": {"type": "object"}},
                 "application/yaml": {"schema": {"type": "string"}}}}})
async def create_study(request: Request, who: Writer, studies: StudiesDep,
                       response: Response) -> StudyOut:
    """Validate and store a study spec, create its Optuna study and queue it."""
    data = await read_spec_body(request)
    view = await run_in_threadpool(studies.create, data, who)
    response.headers["Location"] = f"/v1/studies/{view.row.name}"
    return StudyOut.of(view)


@router.get("", response_model=Page[StudySummary], responses=ERRORS)
def list_studies(who: Reader, studies: StudiesDep, status: Status | None = None,
                 offset: Offset = 0, limit: Limit = 50) -> Page[StudySummary]:
    """The studies this token may see, newest first, optionally of one status."""
    views, total = studies.list(who, status, offset, limit)
    return Page[StudySummary](items=[StudySummary.of(v) for v in views], total=total,
                              offset=offset, limit=limit)


@router.get("/{name}", response_model=StudyOut, responses=ERRORS)
def get_study(name: str, who: Reader, studies: StudiesDep) -> StudyOut:
    """A study: status, spec, trial counts by state, best trial, progress, device-seconds."""
    return StudyOut.of(studies.view(who, name))


@router.get("/{name}/trials", response_model=Page[TrialOut], responses=ERRORS)
def list_trials(name: str, who: Reader, studies: StudiesDep, offset: Offset = 0,
                limit: Limit = 50, intermediate: bool = False) -> Page[TrialOut]:
    """A page of the study's trials by number; ``intermediate=true`` adds their curves."""
    trials, total = studies.trials(who, name, offset, limit, intermediate=intermediate)
    return Page[TrialOut](items=[TrialOut.of(t, intermediate) for t in trials], total=total,
                          offset=offset, limit=limit)


@router.get("/{name}/trials/{number}", response_model=TrialOut, responses=ERRORS)
def get_trial(name: str, number: TrialNumber, who: Reader, studies: StudiesDep) -> TrialOut:
    """One trial with its intermediate values."""
    return TrialOut.of(studies.trial(who, name, number), intermediate=True)


@router.post("/{name}/stop", status_code=status.HTTP_202_ACCEPTED, response_model=StudyOut,
             responses=ERRORS)
def stop_study(name: str, who: Writer, studies: StudiesDep) -> StudyOut:
    """Stop a study: QUEUED ends STOPPED now, RUNNING ends its trials within seconds."""
    return StudyOut.of(studies.stop(who, name))


@router.delete("/{name}", status_code=status.HTTP_204_NO_CONTENT, responses=ERRORS)
def delete_study(name: str, who: Writer, studies: StudiesDep) -> Response:
    """Delete a study that is not running, with its trials and result files."""
    studies.delete(who, name)
    return Response(status_code=status.HTTP_204_NO_CONTENT)
