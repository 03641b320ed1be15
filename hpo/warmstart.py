"""Warm start: points to evaluate first, given in the spec or taken from earlier studies.

An earlier study's top trials are its best COMPLETE ones, feasible ones only where it
had constraints (as its best trial). The points are enqueued in the new study
(Optuna's ``enqueue_trial``) before its first trial is asked, each with a
``warm_start`` user attribute naming its source (``points[2]`` or
``study:NAME#17``); the study keeps the list of its sources in its ``warm_start``
user attribute.

The service reads an earlier study's points when the study is created, where it checks
that the owner may read that study, and stores them with the new Optuna study
(:data:`hpo.study.WARM_START_POINTS_ATTR`); its driver enqueues those and never looks the
name up again, which could by then name another owner's study (deleted and made again
under that name).
"""

from __future__ import annotations

import logging
from typing import Any

import optuna
from optuna.trial import TrialState

from hpo.errors import SpecError
from hpo.record import SPEC_ATTR, StudyRecord
from hpo.spec import POPULATION_SCHEDULERS, StudySpec, WarmStartStudy
from hpo.study import WARM_START_POINTS_ATTR
from hpo.validation import in_distribution

log = logging.getLogger(__name__)


def warm_start_points(spec: StudySpec, storage: optuna.storages.BaseStorage
                      ) -> list[tuple[dict[str, Any], str]]:
    """The ``(params, source)`` pairs to enqueue, in spec order.

    Parameters of an earlier study that the new search space lacks, or whose
    values fall outside it, are dropped (the sampler fills them in).

    Raises:
        SpecError: a named study is missing, is a PBT study (its trials changed
            their hyperparameters while training), or has several objectives.
    """
    points = []
    for i, entry in enumerate(spec.warm_start):
        if not isinstance(entry, WarmStartStudy):
            points.append((dict(entry.params), f"points[{i}]"))
            continue
        source = _source_study(entry.study, storage, f"warm_start.{i}.study")
        complete = [t for t in source.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if all(c <= 0.0 for c in t.constraints.values())]  # feasible only
        best_first = sorted(complete, key=lambda t: t.value,
                            reverse=source.direction == optuna.study.StudyDirection.MAXIMIZE)
        for t in best_first[:entry.top_k]:
            params = {k: v for k, v in t.params.items()
                      if k in spec.search_space and in_distribution(spec.search_space[k], v)}
            points.append((params, f"study:{entry.study}#{t.number}"))
    return points


def _source_study(name: str, storage, loc: str) -> optuna.Study:
    if name not in {s.study_name for s in storage.get_all_studies()}:
        raise SpecError.at(loc, f"no study named {name!r} in this storage")
    study = optuna.load_study(study_name=name, storage=storage)
    if len(study.directions) > 1:
        raise SpecError.at(loc, f"study {name!r} has several objectives; its top trials are "
                                "not defined")
    scheduler = study.user_attrs.get(SPEC_ATTR, {}).get("scheduler", {}).get("name")
    if scheduler in POPULATION_SCHEDULERS:
        raise SpecError.at(loc, f"study {name!r} is a PBT study: its trials changed their "
                                "hyperparameters while training")
    return study


def enqueue_warm_start(record: StudyRecord, *, look_up: bool = True) -> int:
    """Enqueue the spec's warm-start points in a study that has no trial yet; return how many.

    The points stored at the study's creation (:data:`hpo.study.WARM_START_POINTS_ATTR`)
    if any; else, with ``look_up``, the spec's points read now (``hpo run``'s own study);
    else only the spec's own ``params`` points (a service's study made before the points
    were stored: an earlier study is not looked up by a name that may now be another
    owner's).
    """
    if not record.spec.warm_start or record.study.get_trials(deepcopy=False):
        return 0
    stored = record.storage.get_study_system_attrs(record.study_id).get(WARM_START_POINTS_ATTR)
    if stored is not None:
        points = [(dict(params), source) for params, source in stored]
    elif look_up:
        points = warm_start_points(record.spec, record.storage)
    else:
        points = [(dict(e.params), f"points[{i}]") for i, e in enumerate(record.spec.warm_start)
                  if not isinstance(e, WarmStartStudy)]
        skipped = [e.study for e in record.spec.warm_start if isinstance(e, WarmStartStudy)]
        if skipped:
            log.warning("study %s: warm start from %s skipped: its points were not stored when "
                        "the study was created (by an earlier version); only its own points "
                        "are tried first", record.spec.name, ", ".join(skipped))
    for params, source in points:
        record.study.enqueue_trial(params, user_attrs={"warm_start": source})
    record.study.set_user_attr("warm_start", [source for _, source in points])
    if record.listener is not None:  # WAITING until asked: the summary counts them
        for trial in record.study.get_trials(deepcopy=False, states=(TrialState.WAITING,)):
            record.listener.trial_changed(trial)
    return len(points)
