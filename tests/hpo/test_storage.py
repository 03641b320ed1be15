"""Storage: SQLite in WAL mode with a busy timeout; PostgreSQL through the same code."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import traceback

import optuna
import pytest

from hpo.engines import redact, sqlite_path
from hpo.errors import StorageError
from hpo.storage import open_storage, set_trial_user_attrs, trial_id_of


def test_sqlite_is_opened_in_wal_mode_with_a_busy_timeout(tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'x.db'}"
    storage = open_storage(url)
    con = sqlite3.connect(sqlite_path(url))
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with storage.engine.connect() as c:
        timeout_ms = c.exec_driver_sql("PRAGMA busy_timeout").fetchone()[0]
    assert timeout_ms >= 30_000


@pytest.mark.parametrize("late_write", ["trial", "intermediate_value"])
def test_a_write_that_raced_its_study_s_delete_leaves_no_row_for_the_next_study(
        tmp_path, late_write):
    """SQLite enforced no foreign key: a driver's write that passed Optuna's existence
    check just before the study was deleted was kept as an orphan row, and SQLite gives
    the deleted study's (and trial's) id to the next one made, so the orphan then showed
    in another study, perhaps another owner's. The write is now refused, as on
    PostgreSQL; the delete itself (children first) still works."""
    import sqlalchemy as sa

    storage = open_storage(f"sqlite:///{tmp_path / 'x.db'}")
    old = optuna.create_study(study_name="old", storage=storage)
    old.tell(old.ask(), 1.0)
    study_id, trial_id = old._study_id, old.trials[0]._trial_id
    optuna.delete_study(study_name="old", storage=storage)
    # the racing writer's statement, after its existence check passed
    late = {"trial": ("INSERT INTO trials (number, study_id, state) "
                      f"VALUES (1, {study_id}, 'RUNNING')"),
            "intermediate_value": (
                "INSERT INTO trial_intermediate_values (trial_id, step, intermediate_value, "
                f"intermediate_value_type) VALUES ({trial_id}, 0, 0.5, 'FINITE')")}[late_write]
    with pytest.raises(sa.exc.IntegrityError, match="FOREIGN KEY"), \
            storage.engine.begin() as conn:
        conn.exec_driver_sql(late)
    new = optuna.create_study(study_name="new", storage=storage)
    assert new._study_id == study_id  # SQLite reuses the id
    new.tell(new.ask(), 2.0)
    assert [(t.number, t.value, t.intermediate_values) for t in new.trials] == [(0, 2.0, {})]


def _writer(url: str, name: str, n: int, errors) -> None:
    try:
        study = optuna.load_study(study_name=name, storage=open_storage(url))
        for _ in range(n):
            trial = study.ask()
            x = trial.suggest_float("x", 0, 1)
            for step in range(3):
                trial.report(x * step, step)
            study.tell(trial, x)
    except Exception:  # noqa: BLE001 - reported to the parent
        errors.put(traceback.format_exc())


def _reader(url: str, name: str, n: int, errors) -> None:
    try:
        storage = open_storage(url)
        study_id = storage.get_study_id_from_name(name)
        for _ in range(n):
            storage.get_all_trials(study_id)  # what a dashboard does on every refresh
    except Exception:  # noqa: BLE001
        errors.put(traceback.format_exc())


@pytest.mark.slow  # 7 s here (2 idle cores)
def test_four_writers_and_a_dashboard_reader_never_hit_database_is_locked(tmp_path):
    # optuna#820, optuna-dashboard#545
    url = f"sqlite:///{tmp_path / 'busy.db'}"
    optuna.create_study(study_name="busy", storage=open_storage(url))
    ctx = mp.get_context("spawn")
    errors = ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(url, "busy", 25, errors)) for _ in range(4)]
    procs.append(ctx.Process(target=_reader, args=(url, "busy", 150, errors)))
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=240)
    found = []
    while not errors.empty():
        found.append(errors.get())
    assert not found, found[0]
    assert all(p.exitcode == 0 for p in procs)
    study = optuna.load_study(study_name="busy", storage=open_storage(url))
    assert len(study.trials) == 100
    assert all(len(t.intermediate_values) == 3 for t in study.trials)


def test_postgresql_storage_round_trip(pg_url, unique_name):
    storage = open_storage(pg_url)
    study = optuna.create_study(study_name=unique_name, storage=storage)
    trial = study.ask()
    trial.report(float("nan"), 1)
    trial.report(float("inf"), 2)
    study.tell(trial, 1.5)
    again = optuna.load_study(study_name=unique_name, storage=open_storage(pg_url))
    t = again.trials[0]
    assert t.value == 1.5 and t.intermediate_values[2] == float("inf")
    assert t.intermediate_values[1] != t.intermediate_values[1]  # NaN survives


def test_unreachable_database_is_a_storage_error_without_the_password():
    with pytest.raises(StorageError) as info:
        open_storage("postgresql+psycopg://user:s3cret@127.0.0.1:1/none?connect_timeout=2")
    assert "s3cret" not in str(info.value)
    assert "***" in redact("postgresql+psycopg://user:s3cret@host/db")
    with pytest.raises(StorageError):
        open_storage("notadb://x")


ATTRS = {"checkpoint": "/runs/a/checkpoint_000001", "wall_time_s": 1.25, "samples": 1437,
         "stopped_by": None, "nested": {"old": {"lr": 0.1}, "new": [1, 2.5, "x"]}, "flag": True}


def _bulk_matches_per_key(storage, name: str) -> None:
    study = optuna.create_study(study_name=name, storage=storage)
    bulk, one_by_one = study.ask(), study.ask()
    for trial in (bulk, one_by_one):
        trial.set_user_attr("checkpoint", "/runs/old")  # overwritten below
        trial.set_user_attr("ray_trial_id", "abc_00001")  # kept
    set_trial_user_attrs(storage, trial_id_of(bulk), ATTRS)
    for key, value in ATTRS.items():
        storage.set_trial_user_attr(trial_id_of(one_by_one), key, value)
    got = storage.get_trial(trial_id_of(bulk)).user_attrs
    assert got == storage.get_trial(trial_id_of(one_by_one)).user_attrs
    assert got == {**ATTRS, "ray_trial_id": "abc_00001"}
    study.tell(bulk, 1.0)
    with pytest.raises(optuna.exceptions.UpdateFinishedTrialError):
        set_trial_user_attrs(storage, trial_id_of(bulk), {"late": 1})
    assert "late" not in storage.get_trial(trial_id_of(bulk)).user_attrs
    with pytest.raises(KeyError):
        set_trial_user_attrs(storage, 10**9, {"x": 1})
    many = {f"k{i}": i for i in range(25_000)}  # more rows than one statement may carry
    trial = study.ask()
    set_trial_user_attrs(storage, trial_id_of(trial), many)
    assert storage.get_trial(trial_id_of(trial)).user_attrs == many


def test_bulk_user_attributes_match_optunas_own_setter_on_sqlite(tmp_path):
    _bulk_matches_per_key(open_storage(f"sqlite:///{tmp_path / 'a.db'}"), "bulk")


@pytest.mark.slow  # 5.5 s here (2 idle cores)
def test_bulk_user_attributes_match_optunas_own_setter_on_postgresql(pg_url, unique_name):
    _bulk_matches_per_key(open_storage(pg_url), unique_name)


def test_bulk_user_attributes_on_other_storages_go_key_by_key():
    storage = optuna.storages.InMemoryStorage()
    study = optuna.create_study(storage=storage)
    trial = study.ask()
    set_trial_user_attrs(storage, trial_id_of(trial), ATTRS)
    assert storage.get_trial(trial_id_of(trial)).user_attrs == ATTRS


def test_optunas_migrations_load_once_a_process_and_still_stamp_and_check(tmp_path,
                                                                           monkeypatch):
    import alembic.script
    import sqlalchemy as sa

    open_storage(f"sqlite:///{tmp_path / 'first.db'}")  # loads them, if nothing did before
    loads = []
    real = alembic.script.ScriptDirectory.from_config
    monkeypatch.setattr(alembic.script.ScriptDirectory, "from_config",
                        classmethod(lambda cls, config: loads.append(1) or real(config)))
    storages = [open_storage(f"sqlite:///{tmp_path / f'{i}.db'}") for i in range(3)]
    head = storages[0].get_head_version()
    assert loads == []
    assert storages[0].get_all_versions()[0] == head
    for storage in storages:  # each new database stamped at Optuna's head, and checked
        with storage.engine.connect() as conn:
            assert conn.execute(sa.text("SELECT version_num FROM alembic_version")).scalar() \
                == head
        assert storage.get_current_version() == head
    with storages[0].engine.begin() as conn:  # an unknown revision is still refused
        conn.execute(sa.text("UPDATE alembic_version SET version_num = 'v0.0.0.z'"))
    with pytest.raises(StorageError, match="no longer compatible"):
        open_storage(f"sqlite:///{tmp_path / '0.db'}")


def test_a_damaged_alembic_version_table_is_a_storage_error(tmp_path):
    import sqlalchemy as sa

    url = f"sqlite:///{tmp_path / 'two-heads.db'}"
    open_storage(url).engine.dispose()
    with sa.create_engine(url).begin() as conn:  # a second version row: two "heads"
        conn.execute(sa.text("INSERT INTO alembic_version VALUES ('v3.0.0.d')"))
    with pytest.raises(StorageError, match="cannot open storage .*more than one head"):
        open_storage(url)


@pytest.mark.parametrize("url, shown", [
    ("postgresql+psycopg://user:s3cret@host:5432/db", "postgresql+psycopg://***@host:5432/db"),
    # an '@' of the password not written %40: URL parsers took the rest for the host
    ("postgresql+psycopg://postgres:p@ss/w#rd@127.0.0.1:5432/brk_ops",
     "postgresql+psycopg://***@127.0.0.1:5432/brk_ops"),
    ("postgresql+psycopg://u:a:b@c@h/db", "postgresql+psycopg://***@h/db"),
    ("postgresql+psycopg://u@h/db?password=s3cret&sslmode=require",
     "postgresql+psycopg://***@h/db?password=***&sslmode=require"),
    ("u:s3cret@h/db", "***@h/db"),  # no scheme: not a URL that parses, hidden all the same
    ("sqlite:///runs/hpo.db", "sqlite:///runs/hpo.db"),
    ("nonsense", "nonsense"),
])
def test_redact_hides_all_of_the_user_information_whatever_it_holds(url, shown):
    assert redact(url) == shown


@pytest.mark.parametrize("url", ["sqlite://", "sqlite:///:memory:", "sqlite:///"])
def test_an_in_memory_sqlite_storage_is_refused_naming_why(url):
    """``hpo run --storage sqlite://`` ran every trial against its own empty database: all
    FAILED, "no complete trial"."""
    with pytest.raises(StorageError) as info:
        open_storage(url)
    assert str(info.value) == (
        f"cannot open storage {url}: an in-memory SQLite database is one per connection, so "
        "the study's driver and its trials would each see an empty one: name a file, e.g. "
        "sqlite:///hpo.db")
