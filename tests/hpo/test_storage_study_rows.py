"""A study's rows written and deleted set-based (``hpo.storage.create_study_with_attrs``,
``delete_study``): what Optuna's public API reads back is what its own calls give, in
fewer statements, on SQLite and PostgreSQL."""

from __future__ import annotations

import threading

import optuna
import pytest
import sqlalchemy
from optuna.study import StudyDirection
from optuna.trial import TrialState

import hpo.errors
import hpo.storage
from hpo.storage import (
    METRIC_NAMES_ATTR,
    create_study_with_attrs,
    delete_study,
    open_storage,
    orm_models,
    study_delete_statements,
    trial_id_of,
)

DIRECTIONS = [StudyDirection.MINIMIZE, StudyDirection.MAXIMIZE]
USER_ATTRS = {"hpo_spec": {"name": "s", "lr": [1e-3, 0.5], "none": None, "t": "é ✓"},
              "n": 3}
SYSTEM_ATTRS = {METRIC_NAMES_ATTR: ["val_loss", "val_accuracy"], "flag": True}


def _create_by_public_calls(storage, name: str) -> int:
    study_id = storage.create_new_study(DIRECTIONS, name)
    for key, value in USER_ATTRS.items():
        storage.set_study_user_attr(study_id, key, value)
    for key, value in SYSTEM_ATTRS.items():
        storage.set_study_system_attr(study_id, key, value)
    return study_id


def _stored_json(storage, study_id: int) -> dict[str, list]:
    """The study's attribute rows as stored: (key, value_json), by table."""
    models = orm_models()
    out = {}
    with storage.engine.connect() as conn:
        for model in (models.StudyUserAttributeModel, models.StudySystemAttributeModel):
            rows = conn.execute(sqlalchemy.select(model.key, model.value_json)
                                .where(model.study_id == study_id).order_by(model.key))
            out[model.__tablename__] = [tuple(r) for r in rows]
    return out


def _read_back(storage, name: str) -> tuple:
    study = optuna.load_study(study_name=name, storage=storage)
    system_attrs = storage.get_study_system_attrs(storage.get_study_id_from_name(name))
    return study.directions, study.user_attrs, system_attrs, study.metric_names


def test_one_transaction_create_reads_back_as_optunas_own_calls(db_url, unique_name):
    storage = open_storage(db_url)
    public_id = _create_by_public_calls(storage, unique_name + "-public")
    study_id = create_study_with_attrs(storage, unique_name, DIRECTIONS, USER_ATTRS,
                                       SYSTEM_ATTRS)
    assert study_id == storage.get_study_id_from_name(unique_name)
    got = _read_back(storage, unique_name)
    assert got == _read_back(storage, unique_name + "-public")
    assert got == (DIRECTIONS, USER_ATTRS, SYSTEM_ATTRS, ["val_loss", "val_accuracy"])
    assert _stored_json(storage, study_id) == _stored_json(storage, public_id)


def test_a_duplicate_name_raises_and_leaves_the_first_study_unchanged(db_url, unique_name):
    storage = open_storage(db_url)
    create_study_with_attrs(storage, unique_name, DIRECTIONS, USER_ATTRS, SYSTEM_ATTRS)
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):
        create_study_with_attrs(storage, unique_name, [StudyDirection.MAXIMIZE],
                                {"hpo_spec": "other", "new": 1}, {METRIC_NAMES_ATTR: ["x"]})
    assert _read_back(storage, unique_name) == (DIRECTIONS, USER_ATTRS, SYSTEM_ATTRS,
                                                ["val_loss", "val_accuracy"])
    assert [s.study_name for s in storage.get_all_studies()].count(unique_name) == 1


class _Counter:
    """SQL statements and commits on ``engine``, from now on."""

    def __init__(self, engine: sqlalchemy.Engine) -> None:
        self.statements = self.commits = 0
        sqlalchemy.event.listen(engine, "before_cursor_execute", self._statement)
        sqlalchemy.event.listen(engine, "commit", self._commit)

    def _statement(self, *args) -> None:
        self.statements += 1

    def _commit(self, conn) -> None:
        self.commits += 1

    def take(self) -> tuple[int, int]:
        got = self.statements, self.commits
        self.statements = self.commits = 0
        return got


# Optuna's create_new_study (2 transactions) then one set_study_*_attr per attribute (2
# SELECTs and an INSERT each); SQLite inserts the directions one by one, PostgreSQL with one
# statement
PUBLIC_CREATE = {"sqlite": (10, 4), "postgresql": (9, 4)}


def test_one_transaction_create_takes_4_statements_instead_of_9_or_10(db_url, unique_name):
    storage = open_storage(db_url)
    counter = _Counter(storage.engine)
    user, system = {"hpo_spec": USER_ATTRS["hpo_spec"]}, {METRIC_NAMES_ATTR: ["a", "b"]}
    study_id = storage.create_new_study(DIRECTIONS, unique_name + "-public")
    storage.set_study_user_attr(study_id, "hpo_spec", user["hpo_spec"])
    storage.set_study_system_attr(study_id, METRIC_NAMES_ATTR, ["a", "b"])
    assert counter.take() == PUBLIC_CREATE[storage.engine.dialect.name]
    create_study_with_attrs(storage, unique_name, DIRECTIONS, user, system)
    # the study, its directions, user and system attributes: 4 statements in a transaction,
    # on PostgreSQL one statement in autocommit (each INSERT a data-modifying WITH)
    assert counter.take() == {"sqlite": (4, 1), "postgresql": (1, 0)}[
        storage.engine.dialect.name]
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):
        create_study_with_attrs(storage, unique_name, DIRECTIONS, user, system)
    assert counter.take() == (1, 0)  # the study's INSERT fails; rolled back


def test_other_storages_create_through_the_public_calls():
    storage = optuna.storages.InMemoryStorage()
    create_study_with_attrs(storage, "mem", DIRECTIONS, USER_ATTRS, SYSTEM_ATTRS)
    assert _read_back(storage, "mem") == (DIRECTIONS, USER_ATTRS, SYSTEM_ATTRS,
                                          ["val_loss", "val_accuracy"])
    with pytest.raises(optuna.exceptions.DuplicatedStudyError):
        create_study_with_attrs(storage, "mem", DIRECTIONS, {}, {})


# -- delete --------------------------------------------------------------------------


def _populate(storage, name: str) -> int:
    """A study with rows in every Optuna table: attributes, and trials COMPLETE, PRUNED,
    FAIL and RUNNING (with a heartbeat) with params, values, intermediate values and
    attributes."""
    study = optuna.create_study(study_name=name, storage=storage)
    study_id = storage.get_study_id_from_name(name)
    study.set_user_attr("owner", name)
    storage.set_study_system_attr(study_id, METRIC_NAMES_ATTR, ["val_loss"])
    for number, state in enumerate([TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL,
                                    TrialState.COMPLETE, TrialState.RUNNING]):
        trial = study.ask()
        trial.suggest_float("lr", 1e-3, 1.0, log=True)
        trial.suggest_categorical("opt", ["adam", "sgd"])
        for step in range(3):
            trial.report(number + step / 10, step)
        trial.set_user_attr("checkpoint", f"/runs/{name}/{number}")
        storage.set_trial_system_attr(trial_id_of(trial), "ray_trial_id", f"r{number}")
        if state == TrialState.RUNNING:
            if isinstance(storage, optuna.storages.RDBStorage):  # the only one with them
                storage.record_heartbeat(trial_id_of(trial))
        else:
            study.tell(trial, float(number) if state == TrialState.COMPLETE else None,
                       state=state)
    return study_id


def _rows_of(storage, study_id: int, trial_ids: list[int]) -> dict[str, int]:
    """How many rows each of Optuna's tables holds for the study and its trials."""
    counts = {}
    with storage.engine.connect() as conn:
        for table in orm_models().BaseModel.metadata.sorted_tables:
            if "study_id" in table.c:
                where = table.c.study_id == study_id
            elif "trial_id" in table.c:
                where = table.c.trial_id.in_(trial_ids)
            else:
                continue  # version_info
            counts[table.name] = conn.execute(
                sqlalchemy.select(sqlalchemy.func.count()).select_from(table).where(where)
            ).scalar_one()
    return counts


def _snapshot(storage, study_id: int) -> tuple:
    return (storage.get_study_name_from_id(study_id), storage.get_study_directions(study_id),
            storage.get_study_user_attrs(study_id), storage.get_study_system_attrs(study_id),
            storage.get_all_trials(study_id))


def test_set_based_delete_removes_every_row_of_the_study_and_none_of_another(db_url,
                                                                           unique_name):
    storage = open_storage(db_url)
    gone, kept = _populate(storage, unique_name), _populate(storage, unique_name + "-kept")
    gone_trials = [t._trial_id for t in storage.get_all_trials(gone)]
    before = _rows_of(storage, gone, gone_trials)
    assert set(before) == {t.name for t in orm_models().BaseModel.metadata.sorted_tables
                           if t.name != "version_info"}
    assert all(before.values()), before  # the test reaches every table, heartbeats too
    kept_before = _snapshot(storage, kept)
    counter = _Counter(storage.engine)
    delete_study(storage, gone)
    # one DELETE per table, whatever the study's size; on PostgreSQL one statement of them,
    # in autocommit (no COMMIT to send)
    assert counter.take() == {"sqlite": (11, 1), "postgresql": (1, 0)}[
        storage.engine.dialect.name]
    assert _rows_of(storage, gone, gone_trials) == dict.fromkeys(before, 0)
    assert _snapshot(storage, kept) == kept_before
    assert optuna.load_study(study_name=unique_name + "-kept",
                             storage=storage).trials == kept_before[-1]
    with pytest.raises(KeyError):
        storage.get_study_id_from_name(unique_name)


def test_deleting_an_unknown_study_raises_key_error(db_url):
    storage = open_storage(db_url)
    with pytest.raises(KeyError):
        delete_study(storage, 10**9)


def test_other_storages_and_unhandled_tables_delete_through_optuna(sqlite_url, monkeypatch):
    memory = optuna.storages.InMemoryStorage()
    study_id = _populate(memory, "mem")
    delete_study(memory, study_id)
    assert memory.get_all_studies() == []
    storage = open_storage(sqlite_url)
    study_id = _populate(storage, "rdb")
    calls = []
    monkeypatch.setattr(hpo.storage, "study_delete_statements", lambda metadata: None)
    monkeypatch.setattr(storage, "delete_study", lambda i: calls.append(i))
    delete_study(storage, study_id)
    assert calls == [study_id]


def _copy_with(table_columns: dict[str, list]) -> sqlalchemy.MetaData:
    """Optuna's metadata with more tables, as a later Optuna might add."""
    metadata = sqlalchemy.MetaData()
    for table in orm_models().BaseModel.metadata.sorted_tables:
        table.to_metadata(metadata)
    for name, columns in table_columns.items():
        sqlalchemy.Table(name, metadata,
                         sqlalchemy.Column("id", sqlalchemy.Integer, primary_key=True),
                         *columns)
    return metadata


def test_a_table_added_later_is_deleted_before_what_it_references():
    metadata = _copy_with({"trial_notes": [sqlalchemy.Column(
        "trial_id", sqlalchemy.ForeignKey("trials.trial_id"))]})
    sql = [str(s).split(" WHERE")[0] for s in study_delete_statements(metadata)]
    assert "DELETE FROM trial_notes" in sql
    assert sql.index("DELETE FROM trial_notes") < sql.index("DELETE FROM trials")
    assert sql[-1] == "DELETE FROM studies"
    assert len(sql) == 12


def test_a_table_referencing_a_study_through_another_table_falls_back():
    metadata = _copy_with({"param_notes": [sqlalchemy.Column(
        "param_id", sqlalchemy.ForeignKey("trial_params.param_id"))]})
    assert study_delete_statements(metadata) is None
    unrelated = _copy_with({"notes": [sqlalchemy.Column(
        "version", sqlalchemy.ForeignKey("version_info.version_info_id"))]})
    assert len(study_delete_statements(unrelated)) == 11


def _trial_added_after_the_trials_delete(storage, study_id: int, times: int) -> list[int]:
    """Each of the first ``times`` deletes is raced by a trial of the study that another
    connection commits: a concurrent writer. Where the DELETEs are statements of their own,
    it is committed after the DELETE of ``trials``, before the study's own DELETE. On
    PostgreSQL, where they are one statement, it is inserted before that statement starts
    (so the statement's snapshot misses it) and committed 0.3 s later, while the statement
    waits for the lock the insert's foreign key holds on the study's row. The number of
    trials so added, one per entry."""
    added: list[int] = []
    writer = optuna.storages.RDBStorage(storage.url)  # its own engine and sessions
    trials = orm_models().TrialModel.__table__

    def after(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("DELETE FROM TRIALS") and len(added) < times:
            added.append(writer.create_new_trial(study_id))

    def before(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("WITH") and len(added) < times:
            racing = writer.engine.connect()
            racing.execute(sqlalchemy.insert(trials).values(
                number=1000 + len(added), study_id=study_id, state="RUNNING"))
            threading.Timer(0.3, lambda: (racing.commit(), racing.close())).start()
            added.append(1000 + len(added))

    sqlalchemy.event.listen(storage.engine, "after_cursor_execute", after)
    sqlalchemy.event.listen(storage.engine, "before_cursor_execute", before)
    return added


def test_a_trial_committed_during_the_delete_is_deleted_too(pg_url, unique_name):
    """PostgreSQL: a trial committed between the trials' DELETE and the study's violated the
    foreign key and failed the delete (a 500 through the API); the delete is tried again."""
    storage = open_storage(pg_url)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], unique_name)
    storage.create_new_trial(study_id)
    added = _trial_added_after_the_trials_delete(storage, study_id, times=1)
    delete_study(storage, study_id)
    assert len(added) == 1
    with storage.engine.connect() as conn:
        left = conn.execute(sqlalchemy.select(sqlalchemy.func.count()).select_from(
            orm_models().TrialModel).where(orm_models().TrialModel.study_id == study_id))
        assert left.scalar_one() == 0
    with pytest.raises(KeyError):
        storage.get_study_id_from_name(unique_name)


def test_a_delete_outrun_by_writers_every_time_deletes_nothing_and_says_so(pg_url,
                                                                        unique_name):
    storage = open_storage(pg_url)
    study_id = storage.create_new_study([StudyDirection.MINIMIZE], unique_name)
    storage.create_new_trial(study_id)
    added = _trial_added_after_the_trials_delete(storage, study_id, times=hpo.storage.DELETE_TRIES)
    with pytest.raises(hpo.errors.StorageError, match="rows were added to it while it was "
                                                      "being deleted; try again"):
        delete_study(storage, study_id)
    assert len(added) == hpo.storage.DELETE_TRIES
    assert len(storage.get_all_trials(study_id)) == 1 + hpo.storage.DELETE_TRIES
    assert storage.get_study_id_from_name(unique_name) == study_id
