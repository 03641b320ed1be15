"""optuna-dashboard's in-process caches, which it keys by study id alone, kept to the study
the id names now; and its trial serializer and cache reads (:func:`serialize_trial`,
:func:`cached_trials`). The one module that reads optuna-dashboard's private names.

On SQLite, Optuna's ``studies.study_id`` is an ``INTEGER PRIMARY KEY`` without
``AUTOINCREMENT``: once the study with the highest id is deleted, the next study created
gets its id again (optuna#5872's review; PostgreSQL's sequence never reuses one).
optuna-dashboard 0.21 caches by that id, for the life of the process, what it computed of
a study: its trials (refetched after 2-10 s), the union and intersection of its search
spaces and its user attributes' names (never refetched: a cursor over the trials), and its
parameter importances (until the number of COMPLETE trials changes). Its own delete
clears none of them (optuna-dashboard#503, closed as stale). So a member who created a
study right after another owner deleted theirs was shown, under the reused id, the
deleted study's parameters, ranges, attribute names and importances, or a 500 while the
cached trials were not those of the study (the breaker's finding).

:class:`StudyIdentities` remembers, per process, which study each id named when the
dashboard last served it (its name and the service's creation time), and forgets the
dashboard's caches of an id that names another study now, before the request runs. Each
API process checks for itself, so a study deleted and created through another process is
seen too.
"""

from __future__ import annotations

import datetime as dt

import bottle
import optuna_dashboard
import sqlalchemy as sa
from optuna.trial import FrozenTrial
from optuna_dashboard import _importance, _serializer, _storage
from sqlalchemy.orm import sessionmaker
from starlette.concurrency import run_in_threadpool

from hpo.pinned import require
from service import optuna_sql
from service.db import StudyRow

DASHBOARD_VERSION = "0.21.0"  # the optuna-dashboard whose private names are read here
require("optuna-dashboard", optuna_dashboard.__version__, DASHBOARD_VERSION, __name__)

Identity = tuple[str, dt.datetime | None]  # the Optuna study's name, the service's created_at


def serialize_trial(study_id: int, trial: FrozenTrial, study_system_attrs: dict) -> dict:
    """``trial`` as optuna-dashboard's ``/api/studies/ID`` answer holds it
    (``_serializer.serialize_frozen_trial``): the service's rewrite of that answer's best
    trials (``service.dashboard_answers.feasible_study``) serializes a best trial the
    answer did not carry."""
    return _serializer.serialize_frozen_trial(study_id, trial, study_system_attrs)


def cached_trials(bottle_app: bottle.Bottle, storage, study_id: int) -> list[FrozenTrial]:
    """The study's trials as optuna-dashboard's app ``bottle_app`` serves them now: from its
    cache (refetched after 2-10 s, ``_storage.get_trials``), so that a rewrite of its answer
    reads the trials the answer was made of, without loading the study again."""
    return _storage.get_trials(bottle_app._inmemory_cache, storage, study_id)


def forget_study(bottle_app: bottle.Bottle, study_id: int) -> None:
    """Drop what optuna-dashboard's app ``bottle_app`` cached of the study ``study_id``."""
    cache = bottle_app._inmemory_cache  # optuna_dashboard._inmemory_cache.InMemoryCache
    with cache._cached_extra_study_property_cache_lock:
        cache._cached_extra_study_property_cache.pop(study_id, None)
    with cache._trials_cache_lock:
        cache._trials_cache.pop(study_id, None)
        cache._trials_last_fetched_at.pop(study_id, None)
    prefix = f"{study_id}:"  # "{study_id}:{objective_id}", one cache per process
    with _importance.param_importance_cache_lock:
        for key in [k for k in _importance.param_importance_cache if k.startswith(prefix)]:
            del _importance.param_importance_cache[key]


class StudyIdentities:
    """Which study each id named when the dashboard last served it, in this process.

    Args:
        bottle_app: optuna-dashboard's app, whose caches :meth:`check` clears.
        sessions: the service's database sessions (Optuna's tables are in the same one).
    """

    def __init__(self, bottle_app: bottle.Bottle, sessions: sessionmaker) -> None:
        self.bottle_app, self.sessions = bottle_app, sessions
        self._seen: dict[int, Identity | None] = {}

    async def check(self, study_id: int) -> None:
        """Before the dashboard serves ``study_id``: where the id names another study than
        it did when last served here (or is seen for the first time), forget what the
        dashboard cached of it."""
        identity = await run_in_threadpool(self._identity, study_id)
        if study_id in self._seen and self._seen[study_id] == identity:
            return
        forget_study(self.bottle_app, study_id)
        self._seen[study_id] = identity

    def _identity(self, study_id: int) -> Identity | None:
        studies = optuna_sql.studies
        with self.sessions() as session:
            row = session.execute(
                sa.select(studies.c.study_name, StudyRow.created_at)
                .select_from(studies.outerjoin(StudyRow, StudyRow.name == studies.c.study_name))
                .where(studies.c.study_id == study_id)).first()
        return None if row is None else (row[0], row[1])
