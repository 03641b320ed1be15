"""The Optuna study of a spec: created new, or opened with its stored spec compared.

The spec is kept as the study's ``hpo_spec`` user attribute (what ``hpo run``
compares at each start, and what the dashboard shows). Either way the study's metric
names are its objectives' metrics (``Study.set_metric_names``), so that the dashboard's
axes and columns read ``val_accuracy``, not "Objective 0" (issue 16.1).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import warnings
from typing import Any

import optuna
from optuna.study import StudyDirection

from hpo.errors import StudyExistsError
from hpo.space import build_sampler
from hpo.spec import StudySpec, load_stored
from hpo.storage import (
    METRIC_NAMES_ATTR,
    create_study_with_attrs,
    set_trial_user_attrs,
    trial_id_of,
)

SPEC_ATTR = "hpo_spec"
# TPE options whose default changed: left unset by a file, a stored study keeps its value
UNSET_TPE_DEFAULTS = ("n_startup_trials", "multivariate")
WARM_START_POINTS_ATTR = "hpo:warm_start_points"
"""Study system attribute: the warm-start ``[params, source]`` pairs read when the study was
created (the service's studies; see :mod:`hpo.warmstart`)."""


def open_study(spec: StudySpec, storage: optuna.storages.BaseStorage,
               compare_spec: bool = True) -> optuna.Study:
    """Create the study named by the spec, or load it if it exists with the same spec
    (:func:`open_stored_study`, without the spec it runs)."""
    return open_stored_study(spec, storage, compare_spec)[0]


def open_stored_study(spec: StudySpec, storage: optuna.storages.BaseStorage,
                      compare_spec: bool = True) -> tuple[optuna.Study, StudySpec]:
    """Create the study named by the spec, or load it if it exists with the same spec; the
    study, and the spec it runs: ``spec``, where it leaves one of TPE's
    :data:`UNSET_TPE_DEFAULTS` unset and the stored spec has a value, with that value (a
    study stored when Optuna's 10 start-up trials, or the multivariate TPE, was the
    default goes on with it when the same file is run again).

    ``compare_spec=False``: the caller vouches that ``spec`` is the study's own
    stored spec (the service's driver, which read it from the service's table,
    written by the same create as the Optuna study), so the ``hpo_spec``
    attribute is neither read back and compared nor written.

    Raises:
        StudyExistsError: a study of that name exists with a different spec.
    """
    directions = [o.direction for o in spec.objectives]
    study = optuna.create_study(storage=storage, study_name=spec.name, directions=directions,
                                sampler=build_sampler(spec), load_if_exists=True)
    given = spec
    if compare_spec:
        spec = _check_stored_spec(study, spec)
    name_metrics(study, spec)
    n_existing = len(study.get_trials(deepcopy=False))
    if n_existing or spec is not given:
        # Continuing a study: the spec's sampler again (never a silent swap to random
        # search, ray#30861), its seed moved on so that it does not replay the
        # suggestions it already made.
        study.sampler = build_sampler(spec, seed_offset=n_existing)
    return study, spec


def create_study(spec: StudySpec, storage: optuna.storages.BaseStorage) -> int:
    """Create the Optuna study of ``spec`` with its ``hpo_spec`` attribute and its metric
    names; its storage id.

    One transaction (:func:`hpo.storage.create_study_with_attrs`), for a study known to be
    new; :func:`open_study` loads or creates and compares. (The service writes the same rows
    with its study's row: :func:`new_study_rows`.)

    Raises:
        StudyExistsError: a study of that name exists (made here or anywhere else).
    """
    try:
        return create_study_with_attrs(storage, spec.name, *new_study_rows(spec))
    except optuna.exceptions.DuplicatedStudyError:
        raise StudyExistsError(f"an Optuna study named {spec.name!r} exists already") from None


def new_study_rows(spec: StudySpec, warm_start: list[tuple[dict, str]] | None = None
                   ) -> tuple[list[StudyDirection], dict, dict]:
    """What :func:`create_study` stores of ``spec``: one direction per objective, the user
    attributes (the spec, ``hpo_spec``) and the system attributes (the metric names, and
    ``warm_start``'s ``(params, source)`` points where given:
    :data:`WARM_START_POINTS_ATTR`)."""
    directions = [StudyDirection.MAXIMIZE if o.direction == "maximize"
                  else StudyDirection.MINIMIZE for o in spec.objectives]
    system_attrs: dict[str, Any] = {METRIC_NAMES_ATTR: metric_names(spec)}
    if warm_start is not None:
        system_attrs[WARM_START_POINTS_ATTR] = [[params, source]
                                                for params, source in warm_start]
    return directions, {SPEC_ATTR: spec.to_dict()}, system_attrs


def metric_names(spec: StudySpec) -> list[str]:
    """The study's metric names: each objective's metric, in the objectives' order."""
    return [o.metric for o in spec.objectives]


def name_metrics(study: optuna.Study, spec: StudySpec) -> None:
    """Set the study's metric names (:func:`metric_names`) unless they are set already."""
    names = metric_names(spec)
    if study.metric_names != names:
        with warnings.catch_warnings():  # experimental since Optuna 3.2, still in 5.0
            warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
            study.set_metric_names(names)


def _check_stored_spec(study: optuna.Study, spec: StudySpec) -> StudySpec:
    """Store ``spec`` as the study's ``hpo_spec`` attribute, or refuse one that differs; the
    spec to run (:func:`open_stored_study`)."""
    stored = study.user_attrs.get(SPEC_ATTR)
    if stored is None:
        study.set_user_attr(SPEC_ATTR, spec.to_dict())
        return spec
    was = load_stored(stored)  # as models: an older stored form still opens
    if spec.sampler.name == was.sampler.name == "tpe":
        stored_values = {key: getattr(was.sampler, key) for key in UNSET_TPE_DEFAULTS
                         if getattr(spec.sampler, key) is None
                         and getattr(was.sampler, key) is not None}
        if stored_values:
            spec = spec.model_copy(update={"sampler": spec.sampler.model_copy(
                update=stored_values)})
    if _runs_as(was) != _runs_as(spec):
        new = spec.to_dict()
        differ = sorted(k for k in {*stored, *new} if stored.get(k) != new.get(k))
        raise StudyExistsError(f"study {spec.name!r} exists with a different spec ("
                               f"{', '.join(differ)} differ): give the new spec another "
                               f"name, or delete the stored study first")
    return spec


def _runs_as(spec: StudySpec) -> StudySpec:
    """``spec`` with TPE's :data:`UNSET_TPE_DEFAULTS` as they run (a file that writes the
    default a stored study left unset is the same study)."""
    s = spec.sampler
    if s.name != "tpe":
        return spec
    return spec.model_copy(update={"sampler": s.model_copy(update={
        "n_startup_trials": s.startup_trials(spec.budget.n_trials),
        "multivariate": s.is_multivariate})})


def take_waiting(storage: optuna.storages.BaseStorage, trial: optuna.trial.FrozenTrial,
                 dists: dict[str, optuna.distributions.BaseDistribution]) -> int | None:
    """Take the WAITING ``trial`` RUNNING (Optuna ends only running trials), to end it
    unasked, with its queued point as its parameters (for REST and the dashboard: Optuna
    keeps them in the ``fixed_params`` system attribute until the trial is asked, never
    after); a value outside ``dists`` (a choice gone) is left out. Its storage id, or
    ``None`` when another process took it meanwhile."""
    trial_id = trial_id_of(trial)
    if not storage.set_trial_state_values(trial_id, optuna.trial.TrialState.RUNNING):
        return None
    for name, value in (trial.system_attrs.get("fixed_params") or {}).items():
        dist = dists.get(name)
        if dist is not None:
            with contextlib.suppress(ValueError):
                storage.set_trial_param(trial_id, name, dist.to_internal_repr(value), dist)
    return trial_id


def fail_running_trials(storage: optuna.storages.BaseStorage, name: str, reason: str,
                        devices: float, now: dt.datetime,
                        dists: dict[str, optuna.distributions.BaseDistribution] | None = None
                        ) -> list[int]:
    """End FAIL, with ``fail_reason``, every RUNNING trial of study ``name`` whose driver
    died (``kill -9``, out of memory) while the study ends with it: nothing is left to
    resume or end them; and its WAITING ones (queued points, requeued trials), which no
    driver will ask for (helper-39), with no time held and their points as parameters
    within ``dists`` (:func:`take_waiting`). Each keeps ``wall_time_s`` and
    ``device_seconds`` from its start to ``now`` (the study's end; naive local time, as
    Optuna's ``datetime_start``), ``devices`` per second held. The numbers of the trials
    ended; none for a study that is not stored.
    """
    try:
        study = optuna.load_study(study_name=name, storage=storage)
    except KeyError:
        return []
    ended = []
    waiting, running = optuna.trial.TrialState.WAITING, optuna.trial.TrialState.RUNNING
    for trial in study.get_trials(deepcopy=False, states=(running, waiting)):
        if trial.state == waiting and take_waiting(storage, trial, dists or {}) is None:
            continue  # taken by another process
        wall = max(0.0, (now - trial.datetime_start).total_seconds()) \
            if trial.datetime_start is not None and trial.state == running else 0.0
        set_trial_user_attrs(storage, trial_id_of(trial), {
            "fail_reason": reason, "wall_time_s": round(wall, 3),
            "device_seconds": round(wall * devices, 3)})
        study.tell(trial.number, state=optuna.trial.TrialState.FAIL, skip_if_finished=True)
        ended.append(trial.number)
    return ended
