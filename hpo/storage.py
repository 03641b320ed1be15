"""The Optuna storage: SQLite (embedded default) or PostgreSQL, both through ``RDBStorage``.

SQLite is opened in WAL mode with a busy timeout (``hpo.engines``, which says why).

The one module that uses Optuna's private names (``hpo.pinned``): change
``OPTUNA_VERSION`` only after checking each of them against the new Optuna.
"""

from __future__ import annotations

import functools
import json
import sqlite3
import threading
import time
from collections.abc import Mapping, Sequence

import optuna
import sqlalchemy
import sqlalchemy.dialects.postgresql
import sqlalchemy.dialects.sqlite
import sqlalchemy.event
import sqlalchemy.exc
from optuna.storages._rdb import models
from optuna.storages._rdb.storage import _create_scoped_session, _VersionManager
from optuna.study import StudyDirection
from optuna.study._multi_objective import _is_pareto_front
from optuna.study.study import _SYSTEM_ATTR_METRIC_NAMES

from hpo.engines import (
    autocommit_engine,
    database_lock,
    engine_kwargs,
    ping_when_idle,
    prepare_sqlite,
    redact,
    sqlite_path,
    sync_normal,
)
from hpo.errors import StorageError
from hpo.pinned import require
from hpo.study_sql import create_statement, one_statement, study_delete_statements

OPTUNA_VERSION = "5.0.0"

require("Optuna", optuna.__version__, OPTUNA_VERSION, __name__)

DEFAULT_STORAGE_URL = "sqlite:///hpo.db"
_alembic_scripts: dict[str, object] = {}  # alembic's ScriptDirectory by location
_alembic_scripts_lock = threading.Lock()


def _shared_alembic_script(manager: _VersionManager):
    """Optuna's alembic ``ScriptDirectory``, loaded once a process (it holds no URL): Optuna
    loads it again, executing 11 migration files (60 ms), at each schema check, two per
    ``RDBStorage`` and two in optuna-dashboard. (No upstream issue found.)"""
    config = manager._create_alembic_config()
    location = config.get_main_option("script_location")
    with _alembic_scripts_lock:
        if location not in _alembic_scripts:  # alembic: imported by Optuna's storage already
            from alembic.script import ScriptDirectory

            _alembic_scripts[location] = ScriptDirectory.from_config(config)
        return _alembic_scripts[location]


_VersionManager._create_alembic_script = _shared_alembic_script


def open_storage(url: str = DEFAULT_STORAGE_URL, pool_size: int | None = None,
                 pre_ping: bool = True) -> optuna.storages.RDBStorage:
    """An Optuna ``RDBStorage`` for ``url`` (``sqlite:///file.db``, ``postgresql+psycopg://...``).

    Args:
        pool_size: connections a server database's pool keeps (>= 1; 10 more may open at
            once); ``None``: SQLAlchemy's default (5). A process with more threads using the
            storage at once (the API) needs one per thread, or its checkouts open new
            connections.
        pre_ping: check a pooled connection at every checkout (``pool_pre_ping``: a round
            trip each), as a study driver needs (a record write that failed once would
            fail a trial). False: only one idle for a while (:func:`ping_when_idle`), for
            the API, where a request that meets a connection lost meanwhile fails once.

    Raises:
        StorageError: bad URL, unreachable database, or schema problems.
    """
    from alembic.util.exc import CommandError  # as Optuna's storage does, on first use

    try:
        path = sqlite_path(url)
        if path is None and sqlalchemy.make_url(url).get_backend_name() == "sqlite":
            raise StorageError(
                f"cannot open storage {redact(url)}: an in-memory SQLite database is one per "
                "connection, so the study's driver and its trials would each see an empty "
                "one: name a file, e.g. sqlite:///hpo.db")
        kwargs = engine_kwargs(url, pre_ping=pre_ping)
        if path is None and pool_size is not None:
            kwargs.update(pool_size=pool_size, max_overflow=10)
        with database_lock(url, "optuna", OPTUNA_LOCK_KEY):
            if path is not None:
                prepare_sqlite(path)  # a new file's switch to WAL: "database is locked" if raced
            storage = optuna.storages.RDBStorage(url, engine_kwargs=kwargs)
        if path is not None:
            sync_normal(storage.engine)
        elif not pre_ping:
            ping_when_idle(storage.engine)
        return storage
    except StorageError:
        raise
    except (sqlalchemy.exc.SQLAlchemyError, sqlite3.Error, ValueError, OSError,
            ImportError,  # the URL's database driver is not installed
            RuntimeError,  # Optuna's schema check: a schema of another Optuna version
            CommandError) as e:  # a damaged alembic_version table
        raise StorageError(f"cannot open storage {redact(url)}: {one_line(e)}") from e


# what the lock of the Optuna tables' creation is called (hpo.engines.database_lock):
# "hpoo", beside the service's migrations' "hpom" (service.migrate)
OPTUNA_LOCK_KEY = 0x68706F6F


def one_line(e: BaseException) -> str:
    """What ``e`` says, on one line, for a message: a SQLAlchemy error as its database
    driver's error (``(sqlite3.OperationalError) table trials already exists``), without the
    statement and the link SQLAlchemy adds on lines of their own; the line breaks of the rest
    (PostgreSQL's DETAIL and HINT) become spaces."""
    orig = getattr(e, "orig", None) if isinstance(e, sqlalchemy.exc.StatementError) else None
    text = str(e) if orig is None else f"({type(orig).__module__}.{type(orig).__name__}) {orig}"
    return " ".join(text.split())


def preload() -> None:
    """Do now the one-time work of a process's first ``RDBStorage``: importing alembic and
    loading Optuna's schema migrations (about 1 s on 2 cores; once: ``_shared_alembic_script``),
    on a storage in memory that is then closed. A warm driver calls it while it waits."""
    optuna.storages.RDBStorage("sqlite:///:memory:").engine.dispose()


def trial_id_of(trial: optuna.Trial) -> int:
    """The storage id of a live ``trial`` (what ``BaseStorage`` methods take): Optuna
    keeps it private, and reading it back by number would cost a query."""
    return trial._trial_id


def set_trial_user_attrs(storage: optuna.storages.BaseStorage, trial_id: int,
                         attrs: dict[str, object]) -> None:
    """Write several user attributes of one trial in a single transaction and statement.

    Optuna has no bulk setter (optuna#5665 proposed ``set_trial_user_attrs`` and
    was closed unmerged): each ``set_trial_user_attr`` is its own transaction
    with its own read of the trial, and the attributes a finished trial gets cost a
    driver more than the trial's own bookkeeping. On SQLite and PostgreSQL this reads
    the trial once and writes every key with one multi-row upsert, the statement
    Optuna's ``RDBStorage`` uses for one key (same table, same JSON encoding); other
    databases get Optuna's per-key upsert inside one session, any other storage one
    call per key.

    An empty ``attrs`` writes nothing and checks nothing.

    Raises:
        optuna.exceptions.UpdateFinishedTrialError: the trial has already ended.
        KeyError: no trial has id ``trial_id``.
    """
    if not attrs:
        return
    if not isinstance(storage, optuna.storages.RDBStorage):
        for key, value in attrs.items():
            storage.set_trial_user_attr(trial_id, key, value)
        return
    table = models.TrialUserAttributeModel
    insert = _UPSERT_DIALECTS.get(storage.engine.name)
    if storage.engine.name == "sqlite" and sqlite3.sqlite_version_info < (3, 24, 0):
        insert = None  # no upsert before SQLite 3.24 (Optuna's own guard)
    with _create_scoped_session(storage.scoped_session, True) as session:
        if insert is None:
            for key, value in attrs.items():
                storage._set_trial_attr_without_commit(session, table, trial_id, key, value)
            return
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
        storage.check_trial_is_updatable(trial_id, trial.state)
        rows = [{"trial_id": trial_id, "key": key, "value_json": json.dumps(value)}
                for key, value in attrs.items()]
        for start in range(0, len(rows), UPSERT_ROWS):  # PostgreSQL: <= 65535 parameters
            statement = insert(table).values(rows[start:start + UPSERT_ROWS])
            session.execute(statement.on_conflict_do_update(
                index_elements=[table.trial_id, table.key],
                set_={"value_json": statement.excluded.value_json}))


def drop_intermediate_values_after(storage: optuna.storages.BaseStorage, trial_id: int,
                                   step: int) -> None:
    """Remove a RUNNING trial's intermediate values at steps above ``step``.

    Optuna has no API to remove an intermediate value. A trial resumed from a checkpoint
    older than its last report (``checkpoint_interval_s``) reports those steps again; until
    then the stored curve must not run past the step it is at (an Optuna pruner reads
    ``last_step``), and it must not if the trial then ends sooner. On ``RDBStorage`` one
    DELETE on Optuna's ``trial_intermediate_values`` table; other storages keep them.

    Raises:
        optuna.exceptions.UpdateFinishedTrialError: the trial has already ended.
        KeyError: no trial has id ``trial_id``.
    """
    if not isinstance(storage, optuna.storages.RDBStorage):
        return
    table = models.TrialIntermediateValueModel
    with _create_scoped_session(storage.scoped_session, True) as session:
        trial = models.TrialModel.find_or_raise_by_id(trial_id, session)
        storage.check_trial_is_updatable(trial_id, trial.state)
        session.execute(sqlalchemy.delete(table).where(table.trial_id == trial_id,
                                                       table.step > step))


UPSERT_ROWS = 1000
_UPSERT_DIALECTS = {"sqlite": sqlalchemy.dialects.sqlite.insert,
                    "postgresql": sqlalchemy.dialects.postgresql.insert}


METRIC_NAMES_ATTR = _SYSTEM_ATTR_METRIC_NAMES
"""The study system attribute holding the objectives' names, as ``Study.set_metric_names``
writes it (the dashboard's axes and columns read them; :attr:`optuna.Study.metric_names`
reads it back): a JSON list of strings, one per objective. Optuna keeps its key private."""


def create_study_with_attrs(storage: optuna.storages.BaseStorage, name: str,
                            directions: Sequence[StudyDirection],
                            user_attrs: Mapping[str, object],
                            system_attrs: Mapping[str, object]) -> int:
    """Create the study ``name`` with one direction per objective and its user and system
    attributes, all in one transaction; the new study's storage id.

    Optuna's API takes a transaction per call: ``create_new_study`` (the study and its
    directions, then a second transaction reading the id back by name), then each
    ``set_study_user_attr`` / ``set_study_system_attr`` (a read of the study and of the
    attribute, then the insert). The service's create (one user attribute, the metric
    names) cost so 4 transactions and 10 statements on SQLite, 9 on PostgreSQL. On
    ``RDBStorage``: one statement on PostgreSQL, else one transaction of 4
    (:func:`insert_study`), values JSON-encoded as Optuna encodes them. Other storages
    (in-memory, journal): the public calls.

    Args:
        directions: one per objective, in order.
        user_attrs, system_attrs: JSON-serializable values by key.

    Raises:
        optuna.exceptions.DuplicatedStudyError: a study named ``name`` exists (made
            before, or meanwhile by another process); nothing is written.
    """
    if not isinstance(storage, optuna.storages.RDBStorage):
        study_id = storage.create_new_study(list(directions), name)
        for key, value in user_attrs.items():
            storage.set_study_user_attr(study_id, key, value)
        for key, value in system_attrs.items():
            storage.set_study_system_attr(study_id, key, value)
        return study_id
    try:  # an IntegrityError is the name's unique constraint, as in create_new_study
        if storage.engine.dialect.name == "postgresql":
            # one statement, so atomic without a transaction of its own: 1 round trip
            with autocommit_engine(storage.engine).connect() as conn:
                return conn.execute(*create_study_statement(name, directions, user_attrs,
                                                            system_attrs)).scalar_one()
        with storage.engine.begin() as conn:
            return insert_study(conn, name, directions, user_attrs, system_attrs)
    except sqlalchemy.exc.IntegrityError:
        raise optuna.exceptions.DuplicatedStudyError(
            f"a study named {name!r} exists already") from None


def insert_study(conn: sqlalchemy.Connection, name: str, directions: Sequence[StudyDirection],
                 user_attrs: Mapping[str, object], system_attrs: Mapping[str, object]) -> int:
    """Insert the Optuna study ``name`` as :func:`create_study_with_attrs` does, in the
    caller's transaction on ``conn`` (to the storage's database), by Core statements: its
    id. Raises ``sqlalchemy.exc.IntegrityError`` when the name is taken."""
    studies = models.StudyModel.__table__
    study_id = conn.execute(sqlalchemy.insert(studies).values(study_name=name)
                            .returning(studies.c.study_id)).scalar_one()
    for model, values in _study_rows(directions, user_attrs, system_attrs).items():
        if values:
            conn.execute(sqlalchemy.insert(model.__table__),
                         [{"study_id": study_id, **v} for v in values])
    return study_id


def _study_rows(directions: Sequence[StudyDirection], user_attrs: Mapping[str, object],
                system_attrs: Mapping[str, object]) -> dict[type, list[dict]]:
    """A new study's rows by Optuna model, values JSON-encoded as Optuna encodes them."""
    return {models.StudyDirectionModel: [{"objective": i, "direction": d}
                                         for i, d in enumerate(directions)],
            models.StudyUserAttributeModel: [{"key": k, "value_json": json.dumps(v)}
                                             for k, v in user_attrs.items()],
            models.StudySystemAttributeModel: [{"key": k, "value_json": json.dumps(v)}
                                               for k, v in system_attrs.items()]}


def create_study_statement(name: str, directions: Sequence[StudyDirection],
                           user_attrs: Mapping[str, object], system_attrs: Mapping[str, object]
                           ) -> tuple[sqlalchemy.Select, dict[str, object]]:
    """PostgreSQL: the one statement creating the Optuna study ``name`` as
    :func:`create_study_with_attrs` does (selecting its id), and its parameters. One object
    per shape (:func:`hpo.study_sql.create_statement`); a caller may add its own ``WITH``
    (parameters not named after Optuna's tables). Run, it raises
    ``sqlalchemy.exc.IntegrityError`` when the name is taken, writing nothing."""
    tables = {model.__table__.name: values
              for model, values in _study_rows(directions, user_attrs, system_attrs).items()
              if values}
    params: dict[str, object] = {"new_study_name": name}
    for table, values in tables.items():
        for i, value in enumerate(values):
            params.update({f"{table}_{i}_{k}": v for k, v in value.items()})
    shape = tuple((table, len(values), tuple(values[0])) for table, values in tables.items())
    return create_statement(models.BaseModel.metadata, shape), params


def delete_study(storage: optuna.storages.BaseStorage, study_id: int) -> None:
    """Delete a study with all its rows: directions, attributes, trials and every row of them.

    Optuna's ``RDBStorage.delete_study`` is an ORM cascade with a SELECT per relationship of
    the study and of each trial: 18 statements for a study of one trial, 72 for ten. Here
    one transaction of one set-based DELETE per table of Optuna's ORM metadata, children
    first (:func:`hpo.study_sql.study_delete_statements`, which falls back to Optuna's for
    tables it does not cover): 11 statements whatever the study's size; on PostgreSQL one
    statement, each DELETE a data-modifying ``WITH`` (foreign keys are checked at its end).
    Other storages: their ``delete_study``.

    A row a concurrent writer commits between two of the DELETEs (a trial after the
    trials' DELETE: PostgreSQL's READ COMMITTED sees it at the study's DELETE), or on
    PostgreSQL while the one statement runs, violates a foreign key and rolls the
    transaction back; it is tried again, ``DELETE_TRIES`` times in all.

    Raises:
        KeyError: no study has id ``study_id`` (nothing is deleted).
        hpo.errors.StorageError: rows kept being added while it deleted (nothing is
            deleted).
    """
    statements = study_delete_statements(models.BaseModel.metadata)
    if not isinstance(storage, optuna.storages.RDBStorage) or statements is None:
        storage.delete_study(study_id)
        return
    one = storage.engine.dialect.name == "postgresql"
    for attempt in range(DELETE_TRIES):
        try:
            if one:  # atomic as one statement: no transaction of its own
                with autocommit_engine(storage.engine).connect() as conn:
                    result = conn.execute(one_statement(statements), {"study_id": study_id})
            else:
                with _create_scoped_session(storage.scoped_session) as session:
                    for statement in statements:
                        result = session.execute(statement, {"study_id": study_id})
            if result.rowcount == 0:  # the last statement deletes the study itself
                raise KeyError(f"no study with study_id {study_id} exists")
            return
        except sqlalchemy.exc.IntegrityError:
            if attempt == DELETE_TRIES - 1:
                raise StorageError(f"study {study_id} was not deleted: rows were added to "
                                   "it while it was being deleted; try again") from None
            time.sleep(0.05 * (attempt + 1))


DELETE_TRIES = 3


def delete_study_parts(storage: optuna.storages.BaseStorage,
                       ) -> tuple[sqlalchemy.Delete, ...] | None:
    """:func:`delete_study`'s DELETEs on PostgreSQL, bound by ``study_id``, for a caller's
    statement that deletes more in one round trip (a concurrent writer's row: an
    ``IntegrityError``, nothing done); None where :func:`delete_study` must run instead."""
    if not (isinstance(storage, optuna.storages.RDBStorage)
            and storage.engine.dialect.name == "postgresql"):
        return None
    return study_delete_statements(models.BaseModel.metadata)


def system_attr_keys(storage: optuna.storages.BaseStorage, study: int | str,
                     prefix: str) -> tuple[int, list[str]]:
    """The study's id and the keys starting with ``prefix`` of its system attributes, then
    of its trials' (artifact metas: ``hpo.models``).

    Args:
        study: the study's id, or its name.

    Optuna's API reads every trial in full for its system attributes (``get_all_trials``:
    its params, values, intermediate values and attributes too). On ``RDBStorage`` one
    SELECT reads the keys only, the study's found by id or by name in the same statement;
    other storages get the public calls.

    Raises:
        KeyError: no study has that id or name.
    """
    if not isinstance(storage, optuna.storages.RDBStorage):
        study_id = study if isinstance(study, int) else storage.get_study_id_from_name(study)
        keys = list(storage.get_study_system_attrs(study_id))
        for trial in storage.get_all_trials(study_id, deepcopy=False):
            keys.extend(trial.system_attrs)
        return study_id, [key for key in keys if key.startswith(prefix)]
    by_name = not isinstance(study, int)
    with autocommit_engine(storage.engine).connect() as conn:  # reads only
        found = conn.execute(_attr_key_statement(prefix, by_name), {"study": study}).all()
    if not found:
        raise KeyError(f"no study with study_{'name' if by_name else 'id'} {study!r} exists")
    keys = [key for _, key in found if key is not None]
    return found[0][0], [key for key in keys if key.startswith(prefix)]  # SQLite's LIKE: any case


@functools.lru_cache(maxsize=8)
def _attr_key_statement(prefix: str, by_name: bool) -> sqlalchemy.CompoundSelect:
    """:func:`system_attr_keys`' SELECT for ``prefix``, bound by ``study`` (the study's id, or
    its name when ``by_name``; built once: building it cost more than running it): rows of
    (study id, key), first one per study attribute key with the prefix (one with key None
    when the study has none, so that a study without keys is told from no study), then
    the trials' keys, in the order written."""
    studies, study_attrs = models.StudyModel, models.StudySystemAttributeModel
    trials, trial_attrs = models.TrialModel, models.TrialSystemAttributeModel
    study = (studies.study_name if by_name else studies.study_id) == sqlalchemy.bindparam("study")
    of_study = (sqlalchemy.select(studies.study_id, study_attrs.key,
                                  sqlalchemy.literal(0).label("part"),
                                  sqlalchemy.literal(0).label("trial"),
                                  study_attrs.study_system_attribute_id.label("attr"))
                .outerjoin(study_attrs, sqlalchemy.and_(
                    study_attrs.study_id == studies.study_id,
                    study_attrs.key.startswith(prefix, autoescape=True)))
                .where(study))
    of_trials = (sqlalchemy.select(studies.study_id, trial_attrs.key, sqlalchemy.literal(1),
                                   trials.trial_id, trial_attrs.trial_system_attribute_id)
                 .select_from(trial_attrs)
                 .join(trials, trials.trial_id == trial_attrs.trial_id)
                 .join(studies, studies.study_id == trials.study_id)
                 .where(study, trial_attrs.key.startswith(prefix, autoescape=True)))
    both = sqlalchemy.union_all(of_study, of_trials).subquery()
    return sqlalchemy.select(both.c.study_id, both.c.key).order_by(
        both.c.part, both.c.trial, both.c.attr)


def pareto_front_mask(losses):
    """Which rows of ``losses`` no other row dominates (all objectives minimized).

    Optuna's own non-dominated sort, the one ``Study.best_trials`` uses, over values
    already read (the service reads them set-based); Optuna keeps it private.

    Args:
        losses: float array of shape ``(n_trials, n_objectives)``, finite or ``inf``.

    Returns:
        bool array of shape ``(n_trials,)``; rows equal to a front row are on the front too.
    """
    return _is_pareto_front(losses, assume_unique_lexsorted=False)


def orm_models():
    """Optuna's ORM models of ``RDBStorage`` (private: ``optuna.storages._rdb.models``), for
    a bench that writes thousands of trials in one transaction (``bench/read_scaling.py``);
    the product writes through Optuna's storage API only."""
    from optuna.storages._rdb import models

    return models


def delete_trial_system_attrs(storage: optuna.storages.BaseStorage, trial_id: int,
                              keys: list[str]) -> None:
    """Remove system attributes of a trial, finished or not (an artifact's meta, ``hpo.models``).

    Optuna has no public way to remove an attribute, and refuses any write to a
    finished trial (``UpdateFinishedTrialError``); its artifacts have no delete
    either, and none is planned (optuna#5501, the FAQ's "how to remove artifacts":
    ``artifact_store.remove`` only, the meta stays): an artifact's meta is the trial system
    attribute ``artifacts:<id>`` (``optuna.artifacts._upload.ARTIFACTS_ATTR_PREFIX``)
    and stays listed by ``get_all_artifact_meta`` and the dashboard until removed. On
    ``RDBStorage`` this deletes the rows of Optuna's private ORM model
    ``TrialSystemAttributeModel``; other storages are not supported.

    Raises:
        TypeError: ``storage`` is not an ``RDBStorage``.
    """
    if not keys:
        return
    if not isinstance(storage, optuna.storages.RDBStorage):
        raise TypeError(f"cannot remove trial attributes from a {type(storage).__name__}")
    table = models.TrialSystemAttributeModel
    with _create_scoped_session(storage.scoped_session, True) as session:
        session.execute(sqlalchemy.delete(table).where(table.trial_id == trial_id,
                                                       table.key.in_(list(keys))))
