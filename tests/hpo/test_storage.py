"""Storage: SQLite in WAL mode with a busy timeout; PostgreSQL through the same code."""

from __future__ import annotations

import multiprocessing as mp
import sqlite3
import traceback

import optuna
import pytest

from hpo.errors import StorageError
from hpo.storage import open_storage, redact, sqlite_path


def test_sqlite_is_opened_in_wal_mode_with_a_busy_timeout(tmp_path):
    url = f"sqlite:///{tmp_path / 'sub' / 'x.db'}"
    storage = open_storage(url)
    con = sqlite3.connect(sqlite_path(url))
    assert con.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    with storage.engine.connect() as c:
        timeout_ms = c.exec_driver_sql("PRAGMA busy_timeout").fetchone()[0]
    assert timeout_ms >= 30_000


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
