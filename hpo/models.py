"""The final models of a study's best trials, kept as Optuna artifacts (issue 16, ray#28528).

When a trial ends COMPLETE, its driver (:class:`~hpo.record.StudyRecord`, before it
tells Optuna: Optuna refuses attributes on finished trials) builds the trial's
model file from its final checkpoint (``trainers.model_file``: the weights its
evaluations used, i.e. the EMA weights when it kept an EMA, with the task, its
options and the ``TrainConfig``; ``origin`` holds the study, the trial's number,
params and values) and uploads it with ``optuna.artifacts.upload_artifact`` to a
``FileSystemArtifactStore`` as ``<study>-trial<N>.pt``. The Optuna dashboard,
given the same store, lists and downloads it; the service streams it
(``GET /v1/studies/{name}/trials/{number}/model``).

Retention: the study keeps the models of its best ``keep_models`` COMPLETE trials
(feasible ones, with spec ``constraints``: an infeasible trial is never ranked)
(the spec's field, default 3; 0 keeps none). After each COMPLETE trial the
others' models are deleted (the file, then its meta), and a trial outside the
best ``keep_models`` gets no model at all. "Best": single objective, by value in
the objective's direction, ties to the older trial (lower number);
multi-objective, by non-dominated sorting (Optuna's own Pareto test): the trials
of the first front, then those of the next front, and so on, ties inside a front
to the older trial. So with ``keep_models >= 1`` the lowest-numbered trial of the
Pareto front always keeps its model.

A model that cannot be kept (no checkpoint, an unreadable one, a full disk) is
logged and the trial ends as it would have: keeping a model never fails a trial.
"""

from __future__ import annotations

import contextlib
import logging
import math
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import optuna
from optuna.artifacts import FileSystemArtifactStore, get_all_artifact_meta, upload_artifact
from optuna.artifacts.exceptions import ArtifactNotFound
from optuna.trial import FrozenTrial, TrialState

from hpo.pareto import nondomination_ranks
from hpo.spec import FSDP_SCRATCH_DIR, StudySpec
from hpo.storage import delete_trial_system_attrs, system_attr_keys, trial_id_of

log = logging.getLogger(__name__)

ARTIFACTS_ATTR_PREFIX = "artifacts:"  # optuna.artifacts._upload.ARTIFACTS_ATTR_PREFIX
MODEL_MIMETYPE = "application/octet-stream"


def model_filename(study: str, number: int) -> str:
    """The file name of trial ``number``'s model: ``<study>-trial<number>.pt``."""
    return f"{study}-trial{number}.pt"


def artifact_store(path: str | Path) -> FileSystemArtifactStore:
    """The file-system artifact store at ``path`` (created if missing): one flat directory of
    artifacts named by their ids, shared by every study of a storage."""
    path = Path(path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    return FileSystemArtifactStore(path)


def study_dir_clash(results_dir: str | Path, name: str, artifact_dir: str | Path) -> str | None:
    """Why study ``name`` cannot keep its result files in ``<results_dir>/<name>``: that
    folder would be one every study shares, hold it, or lie inside it: the model store
    ``artifact_dir`` (its default, ``<results_dir>/artifacts``, is the folder of a study
    named ``artifacts``, and deleting that study's result files would delete every study's
    kept models) or the FSDP trials' scratch (:data:`hpo.spec.FSDP_SCRATCH_DIR`); None when
    clear. Paths compare without case (``Artifacts`` is the store on a case-insensitive file
    system, and the study's folder does not exist yet to ask the file system). The reason
    names no server path: it may be a REST answer.
    """
    def folded(path: str | Path) -> Path:
        return Path(str(Path(path).resolve()).casefold())

    study, store = folded(Path(results_dir) / name), folded(artifact_dir)
    for shared, what in ((store, "the folder of the kept models (the artifact directory)"),
                         (folded(Path(results_dir) / FSDP_SCRATCH_DIR),
                          "the FSDP trials' shared scratch folder")):
        if shared.is_relative_to(study):  # the folder itself, or one inside it
            return f"{name!r} names {what} among the results; choose another name"
    if study.is_relative_to(store):
        return "the artifact directory holds the results directory: a study's result " \
               "files would lie among the kept models (set HPO_ARTIFACT_DIR apart)"
    return None


def rank(trials: Iterable[tuple[int, Sequence[float]]], directions: Sequence[str]) -> list[int]:
    """Trial numbers, best first (see the module doc for the order).

    Args:
        trials: ``(number, values)`` of COMPLETE trials, one value per objective.
        directions: ``"minimize"`` or ``"maximize"`` per objective.
    """
    trials = sorted(trials, key=lambda t: t[0])
    signs = np.array([1.0 if d == "minimize" else -1.0 for d in directions])
    if len(directions) == 1:
        return [n for n, _ in sorted(trials, key=lambda t: (signs[0] * t[1][0], t[0]))]
    losses = np.array([[v if math.isfinite(v) else np.inf for v in vals]
                       for _, vals in trials], dtype=float).reshape(len(trials), len(signs)) * signs
    losses[np.isnan(losses)] = np.inf
    fronts = nondomination_ranks(losses)
    return [n for _, n in sorted(zip(fronts.tolist(), (n for n, _ in trials), strict=True))]


def model_meta(storage: optuna.storages.BaseStorage, trial: FrozenTrial,
               study: str) -> dict[str, Any] | None:
    """The artifact meta (``artifact_id``, ``filename``, ...) of ``trial``'s kept model, or None."""
    wanted = model_filename(study, trial.number)
    for meta in get_all_artifact_meta(trial, storage=storage):
        if meta.filename == wanted:
            return {"artifact_id": meta.artifact_id, "filename": meta.filename,
                    "mimetype": meta.mimetype}
    return None


def delete_study_artifacts(storage: optuna.storages.BaseStorage, study: int | str,
                           store: FileSystemArtifactStore) -> int:
    """Remove the files of every artifact of a study (by id or name) and of its trials
    (before the study is deleted: its meta goes with it); a file already gone is skipped.
    Returns how many files were removed.

    The artifacts are found by their meta's keys alone (:func:`hpo.storage.system_attr_keys`:
    one SELECT on ``RDBStorage``), not by reading every trial in full.

    Raises:
        KeyError: no study has that id or name.
    """
    return remove_artifact_files(store, system_attr_keys(storage, study,
                                                         ARTIFACTS_ATTR_PREFIX)[1])


def remove_artifact_files(store: FileSystemArtifactStore, keys: list[str]) -> int:
    """Remove the files of the artifacts whose meta keys (``ARTIFACTS_ATTR_PREFIX`` and the
    artifact id) are ``keys``; a file already gone is skipped. Returns how many were."""
    removed = 0
    for key in keys:
        with contextlib.suppress(ArtifactNotFound):
            store.remove(key[len(ARTIFACTS_ATTR_PREFIX):])
            removed += 1
    return removed


class ModelKeeper:
    """Keeps the final models of one study's best ``spec.keep_models`` COMPLETE trials.

    Args:
        spec: the study's spec (name, objectives, ``keep_models``).
        store: where the model files go (:func:`artifact_store`).

    One driver runs a study at a time; the keeper reads the study's COMPLETE trials
    once (at its first COMPLETE trial, so a resumed study's earlier models count)
    and follows them in memory from there on.
    """

    def __init__(self, spec: StudySpec, store: FileSystemArtifactStore) -> None:
        self.study = spec.name
        self.directions: list[str] = []
        self.keep = spec.keep_models
        self.store = store
        self.complete: dict[int, list[float]] | None = None  # number -> values
        self.held: dict[int, tuple[int, str]] = {}  # number -> (trial id, artifact id)

    def trial_complete(self, storage: optuna.storages.BaseStorage, study_id: int,
                       trial_id: int, number: int, values: Sequence[float],
                       checkpoint: str | None) -> None:
        """Trial ``number`` (id ``trial_id``) of the study ``study_id`` is about to be told
        COMPLETE with ``values`` (one per objective): keep its model, from the checkpoint
        directory ``checkpoint``, if it is among the best, and delete the models that no
        longer are. The trial is read from the storage only to keep its model. Never
        raises."""
        try:
            self._trial_complete(storage, study_id, trial_id, number, list(values), checkpoint)
        except Exception:  # noqa: BLE001 - keeping a model never fails the trial
            log.exception("the model of trial id %s was not kept", trial_id,
                          extra={"study": self.study})

    def _trial_complete(self, storage, study_id: int, trial_id: int, number: int,
                        values: list[float], checkpoint: str | None) -> None:
        if self.complete is None:
            self._load(storage, study_id)
        self.complete[number] = values
        best = set(rank(self.complete.items(), self.directions)[:self.keep])
        if number in best:
            if checkpoint:
                self._upload(storage, storage.get_trial(trial_id), values, checkpoint)
            else:
                log.warning("trial %d has no checkpoint: no model kept", number,
                            extra={"study": self.study})
        for other in [n for n in self.held if n not in best]:
            self._remove(storage, other)

    def _load(self, storage, study_id: int) -> None:
        self.directions = [d.name.lower() for d in storage.get_study_directions(study_id)]
        self.complete = {}
        for t in storage.get_all_trials(study_id, deepcopy=False, states=(TrialState.COMPLETE,)):
            if not all(c <= 0.0 for c in t.constraints.values()):
                continue  # infeasible (spec constraints): never among the best, as in process
            self.complete[t.number] = list(t.values)
            meta = model_meta(storage, t, self.study)
            if meta is not None:
                self.held[t.number] = (trial_id_of(t), meta["artifact_id"])

    def _upload(self, storage, trial: FrozenTrial, values: list[float],
                checkpoint: str) -> None:
        from trainers.model_file import model_from_checkpoint, save_model_file

        origin = {"study": self.study, "trial": trial.number, "params": dict(trial.params),
                  "values": values}
        model = model_from_checkpoint(checkpoint, origin)
        with tempfile.TemporaryDirectory(prefix="hpo-model-") as tmp:
            path = save_model_file(model, Path(tmp) / model_filename(self.study, trial.number))
            artifact_id = upload_artifact(artifact_store=self.store, file_path=str(path),
                                          study_or_trial=trial, storage=storage,
                                          mimetype=MODEL_MIMETYPE)
        self.held[trial.number] = (trial_id_of(trial), artifact_id)
        log.info("trial %d: model kept (%s)", trial.number, model["weights_kind"],
                 extra={"study": self.study, "trial": trial.number})

    def _remove(self, storage, number: int) -> None:
        trial_id, artifact_id = self.held.pop(number)
        with contextlib.suppress(ArtifactNotFound):
            self.store.remove(artifact_id)
        delete_trial_system_attrs(storage, trial_id, [ARTIFACTS_ATTR_PREFIX + artifact_id])
        log.info("trial %d: model deleted (not among the best %d)", number, self.keep,
                 extra={"study": self.study, "trial": number})
