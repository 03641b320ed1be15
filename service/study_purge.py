"""The end of a study's delete: its kept models (artifact files), Optuna study, result files
and row, in that order (files first: a crash between leaves the DELETING row, which the
dispatcher finishes: at its start, :meth:`service.dispatcher.Dispatcher.
recover_interrupted_writes`, and once past its grace while it runs)."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import optuna
import sqlalchemy.exc
from optuna.artifacts import FileSystemArtifactStore
from sqlalchemy.orm import sessionmaker

from hpo import lease
from hpo.models import ARTIFACTS_ATTR_PREFIX, remove_artifact_files, study_dir_clash
from hpo.storage import delete_study, delete_study_parts, system_attr_keys
from service.settings import Settings
from service.summaries import adds_usage, remove_deleting, remove_unused_deleting


def purge(settings: Settings, sessions: sessionmaker, storage: optuna.storages.BaseStorage,
          name: str, seen: tuple[int | None, str | None] | None = None) -> None:
    """Remove the DELETING study ``name``'s artifact files, Optuna study, result files and
    row. ``seen``: its owner's id and summary JSON when it was marked DELETING (None: not
    known). Where that summary owed its owner no usage (:func:`service.summaries.
    adds_usage`), the Optuna study and the row go in one statement on PostgreSQL
    (:func:`service.summaries.remove_unused_deleting`); else, or when a writer added rows
    to the Optuna study meanwhile, one after the other.

    Raises:
        hpo.errors.StorageError: rows kept being added to the Optuna study (the row stays
            DELETING, hidden from reads and deletes; the dispatcher finishes it once it is
            older than its grace: :meth:`service.dispatcher.Dispatcher.finish_stale_deletes`).
    """
    study_id = _remove_artifact_files(settings, storage, name)
    results = (Path(settings.results_dir) / name).resolve()
    if results.parent == Path(settings.results_dir).resolve() and results.is_dir() and \
            study_dir_clash(settings.results_dir, name, settings.artifacts_path) is None:
        shutil.rmtree(results, ignore_errors=True)  # never the model store (made before)
    unused = seen is not None and not adds_usage(*seen)
    parts = delete_study_parts(storage) if unused and study_id is not None else None
    if parts is not None:
        with contextlib.suppress(sqlalchemy.exc.IntegrityError):  # rows added: step by step
            if remove_unused_deleting(sessions, name, seen[1], (parts, study_id)):
                return
            study_id = unused = None  # its Optuna study went; its row owes usage now
    _delete_study(storage, study_id)
    if not unused or not remove_unused_deleting(sessions, name, seen[1]):
        with sessions.begin() as session:
            lease.forget(session.connection(), name)  # its driver lease, if free
            remove_deleting(session, name)  # with its summary, into its owner's usage


def delete_optuna_study(storage: optuna.storages.BaseStorage, name: str,
                        settings: Settings) -> None:
    """Delete the Optuna study ``name`` (if any) with its trials, set-based
    (:func:`hpo.storage.delete_study`), after its artifacts' files."""
    _delete_study(storage, _remove_artifact_files(settings, storage, name))


def _delete_study(storage: optuna.storages.BaseStorage, study_id: int | None) -> None:
    if study_id is not None:
        with contextlib.suppress(KeyError):  # deleted meanwhile
            delete_study(storage, study_id)


def _remove_artifact_files(settings: Settings, storage: optuna.storages.BaseStorage,
                           name: str) -> int | None:
    """Remove the files of the Optuna study ``name``'s artifacts (their meta goes with the
    study) and return its id (None: no such study); one SELECT reads both."""
    store = FileSystemArtifactStore(Path(settings.artifacts_path).resolve())
    try:
        study_id, keys = system_attr_keys(storage, name, ARTIFACTS_ATTR_PREFIX)
    except KeyError:
        return None
    remove_artifact_files(store, keys)
    return study_id
