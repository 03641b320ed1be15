"""``/v1/studies/{name}/model`` and ``/v1/studies/{name}/trials/{number}/model``: download the
final model a trial keeps (``hpo.models``; ``trainers.model_file`` describes the file).

Owners and scoping are the study's: another owner's study answers 404, a viewer may read.
A trial without a kept model (not COMPLETE, or not among the study's best ``keep_models``)
answers 404 saying so. The file streams as ``application/octet-stream`` named
``<study>-trial<N>.pt``; no answer names a server path.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fastapi import APIRouter
from fastapi.responses import StreamingResponse
from optuna.artifacts import FileSystemArtifactStore
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.trial import FrozenTrial
from starlette.concurrency import run_in_threadpool

from hpo.models import model_meta
from service.api_errors import documented as errors
from service.auth import Principal
from service.db import ENDED
from service.deps import ComponentsDep, Reader, StudiesDep
from service.errors import TrialNotFound
from service.routers.studies import StudyName, TrialNumber
from service.studies import StudyService

router = APIRouter(prefix="/v1/studies", tags=["models"])

CHUNK_BYTES = 1 << 20
MODEL_FILE = {200: {"description": "the model file (torch.save'd dict; see `python -m trainers "
                                   "evaluate`)",
                    "content": {"application/octet-stream": {
                        "schema": {"type": "string", "format": "binary"}}}},
              **errors(401, 404, 422, 503)}


def _no_model(studies: StudyService, who: Principal, name: str, what: str) -> TrialNotFound:
    keep = studies.view(who, name).row.spec.get("keep_models", 3)
    return TrialNotFound(f"{what} of study {name!r} has no kept model: a study keeps the final "
                         f"models of its best {keep} COMPLETE trials (spec field keep_models)")


def _no_best(studies: StudyService, who: Principal, name: str) -> str:
    """Why ``name`` has no best trial: none COMPLETE (and feasible, where the study has
    constraints), ``yet`` while it may still get one."""
    row = studies.view(who, name).row
    feasible = " and feasible" if row.spec.get("constraints") else ""
    yet = "" if row.status in ENDED else " yet"
    return f"study {name!r} has no COMPLETE{feasible} trial{yet}, so no model"


def _trial_model(studies: StudyService, who: Principal, name: str,
                 number: int | None) -> tuple[FrozenTrial, dict[str, Any]]:
    """The trial (``None``: the best one with a model) and its model's artifact meta.

    Raises:
        StudyNotFound: no such study for ``who``.
        TrialNotFound: no such trial, or it keeps no model.
    """
    if number is None:  # the best trial; several objectives: the Pareto front's oldest
        numbers = sorted(t.number for t in studies.view(who, name).best)
        for n in numbers:
            trial = studies.trial(who, name, n)
            meta = model_meta(studies.storage, trial, name)
            if meta is not None:
                return trial, meta
        if not numbers:
            raise TrialNotFound(_no_best(studies, who, name))
        raise _no_model(studies, who, name, "the best trial")
    trial = studies.trial(who, name, number)
    meta = model_meta(studies.storage, trial, name)
    if meta is None and trial.user_attrs.get("feasible") is False:
        raise TrialNotFound(f"trial {number} of study {name!r} has no kept model: it breaks "
                            "the study's constraints, and an infeasible trial keeps none")
    if meta is None:
        raise _no_model(studies, who, name, f"trial {number}")
    return trial, meta


def _stream(c, name: str, trial: FrozenTrial, meta: dict[str, Any]) -> StreamingResponse:
    store = FileSystemArtifactStore(Path(c.settings.artifacts_path).resolve())
    try:
        reader = store.open_reader(meta["artifact_id"])
    except ArtifactNotFound:
        raise TrialNotFound(f"the model of trial {trial.number} of study {name!r} is gone "
                            "from the artifact store") from None

    def chunks() -> Iterator[bytes]:
        with reader:
            while chunk := reader.read(CHUNK_BYTES):
                yield chunk

    filename = f"{name}-trial{trial.number}.pt"
    return StreamingResponse(chunks(), media_type="application/octet-stream",
                             headers={"Content-Disposition": f'attachment; filename="{filename}"'})


@router.get("/{name}/model", response_class=StreamingResponse, responses=MODEL_FILE)
async def best_model(name: StudyName, who: Reader, studies: StudiesDep,
                     c: ComponentsDep) -> StreamingResponse:
    """The best trial's final model (several objectives: the oldest trial of the Pareto front
    that keeps one)."""
    trial, meta = await run_in_threadpool(_trial_model, studies, who, name, None)
    return await run_in_threadpool(_stream, c, name, trial, meta)


@router.get("/{name}/trials/{number}/model", response_class=StreamingResponse,
            responses=MODEL_FILE)
async def trial_model(name: StudyName, number: TrialNumber, who: Reader, studies: StudiesDep,
                      c: ComponentsDep) -> StreamingResponse:
    """Trial ``number``'s final model, if the study keeps it (its best ``keep_models``)."""
    trial, meta = await run_in_threadpool(_trial_model, studies, who, name, number)
    return await run_in_threadpool(_stream, c, name, trial, meta)
