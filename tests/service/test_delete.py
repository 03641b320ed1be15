"""A study's delete on each backend: what it removes, in how many statements, and the
step-by-step path it falls back to (a writer adding rows to the Optuna study meanwhile, a
summary written since the study was marked DELETING)."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
import sqlalchemy as sa

from hpo import lease
from hpo.storage import trial_id_of
from hpo.summary import StudySummary, TrialCounts
from service import study_purge
from service.auth import resolve
from service.db import StudyRow, SummaryRow, UsageRow
from service.settings import Settings
from tests.service.conftest import bearer, record_summary, tiny_spec


@pytest.fixture
def settings(db_url, tmp_path) -> Settings:
    return Settings(database_url=db_url, results_dir=tmp_path / "results", run_dispatcher=False)


def _ended_with_trials(client, app, token: str, name: str) -> int:
    """A COMPLETED study of 3 trials (intermediate values, attributes) with its summary and
    a free driver lease; its Optuna id."""
    assert client.post("/v1/studies", json=tiny_spec(name), headers=bearer(token)
                       ).status_code == 201
    c = app.state.components
    study = optuna.load_study(study_name=name, storage=c.studies.storage)
    for value in (0.5, 0.7, 0.6):
        trial = study.ask({"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)})
        trial.report(value, 1)
        trial.set_user_attr("note", "x")
        c.studies.storage.set_trial_system_attr(trial_id_of(trial), "k", 1)
        study.tell(trial, value)
    record_summary(app, name)
    with c.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(
            status="COMPLETED"))
    engine = c.sessions.kw["bind"]
    lease.create_table(engine)
    with engine.begin() as conn:
        conn.execute(sa.insert(lease.LEASES).values(name=name, holder=None))
    return c.studies.storage.get_study_id_from_name(name)


def _left(app, optuna_id: int, name: str) -> dict[str, int]:
    """Rows of the study left anywhere: its row, summary, lease, and Optuna's rows."""
    c = app.state.components
    with c.sessions.kw["bind"].connect() as conn:
        left = {t: conn.execute(sa.text(f"SELECT count(*) FROM {t} WHERE study_id = :i"),
                                {"i": optuna_id}).scalar()
                for t in ("studies", "trials", "study_directions", "study_user_attributes",
                          "study_system_attributes")}
        left["trial_values"] = conn.execute(sa.text(
            "SELECT count(*) FROM trial_values WHERE trial_id NOT IN "
            "(SELECT trial_id FROM trials)")).scalar()
        left["row"] = conn.execute(sa.select(sa.func.count()).select_from(StudyRow).where(
            StudyRow.name == name)).scalar()
        left["summaries"] = conn.execute(sa.select(sa.func.count()).select_from(SummaryRow)
                                         ).scalar()
        left["lease"] = conn.execute(sa.select(sa.func.count()).select_from(lease.LEASES)
                                     .where(lease.LEASES.c.name == name)).scalar()
    return left


NOTHING = dict.fromkeys(("studies", "trials", "study_directions", "study_user_attributes",
                         "study_system_attributes", "trial_values", "row", "summaries",
                         "lease"), 0)


def _statements(app):
    """The SQL statements sent on the service's and Optuna's engines while counted."""
    seen: list[str] = []
    engines = [app.state.components.sessions.kw["bind"],
               app.state.components.studies.storage.engine]

    def count(conn, cursor, statement, *args):
        seen.append(statement.split(None, 1)[0].upper())

    for engine in engines:
        sa.event.listen(engine, "before_cursor_execute", count)
    return seen, lambda: [sa.event.remove(e, "before_cursor_execute", count) for e in engines]


def test_a_delete_removes_every_row_of_the_study_in_three_statements_on_postgresql(
        client, tokens, app, db_url):
    optuna_id = _ended_with_trials(client, app, tokens["alice"], "gone")
    c = app.state.components
    alice = resolve(c.sessions, tokens["alice"])
    seen, stop = _statements(app)
    c.studies.delete(alice, "gone")
    stop()
    assert _left(app, optuna_id, "gone") == NOTHING
    if db_url.startswith("postgresql"):  # the mark, the artifacts' keys, then all the rest
        assert seen == ["UPDATE", "SELECT", "WITH"]


def test_a_writer_adding_rows_meanwhile_makes_the_delete_go_step_by_step(
        client, tokens, app, monkeypatch):
    optuna_id = _ended_with_trials(client, app, tokens["alice"], "busy")
    real, calls = study_purge.remove_unused_deleting, []

    def outrun_once(sessions, name, seen, optuna_study=None):
        calls.append(optuna_study is not None)
        if optuna_study is not None:  # what a trial committed during the statement raises
            raise sa.exc.IntegrityError("DELETE", {}, Exception("foreign key"))
        return real(sessions, name, seen, optuna_study)

    monkeypatch.setattr(study_purge, "remove_unused_deleting", outrun_once)
    c = app.state.components
    c.studies.delete(resolve(c.sessions, tokens["alice"]), "busy")
    assert _left(app, optuna_id, "busy") == NOTHING
    on_pg = c.sessions.kw["bind"].dialect.name == "postgresql"
    assert calls == ([True, False] if on_pg else [False])


def test_a_summary_written_after_the_mark_moves_its_usage_and_the_study_still_goes(
        client, tokens, app):
    optuna_id = _ended_with_trials(client, app, tokens["alice"], "late")
    c = app.state.components
    with c.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == "late").values(
            status="DELETING"))
    with c.sessions() as session:
        marked_summary = session.execute(sa.select(SummaryRow.summary)).scalar_one()
    record_summary(app, "late", StudySummary(optuna_study_id=optuna_id, n_objectives=1,
                                             counts=TrialCounts(complete=3),
                                             device_seconds_finished=1.5))  # a driver's last
    owner = resolve(c.sessions, tokens["alice"]).token_id
    c.studies.purge("late", seen=(owner, marked_summary))
    assert _left(app, optuna_id, "late") == NOTHING
    with c.sessions() as session:
        assert session.execute(sa.select(UsageRow.device_seconds)).scalars().all() == [1.5]


def test_a_summary_written_while_the_delete_waits_for_its_lock_keeps_its_usage(
        client, tokens, app):
    """A driver's last summary write, committed while the delete's statement waits for the
    summary row's lock, is counted in its owner's usage (PostgreSQL: the row's DELETE read
    the statement's snapshot, removed the row and, by cascade, the new summary: 0 s)."""
    optuna_id = _ended_with_trials(client, app, tokens["alice"], "sw")
    c = app.state.components
    alice = resolve(c.sessions, tokens["alice"])
    owing = StudySummary(optuna_study_id=optuna_id, n_objectives=1,
                         counts=TrialCounts(complete=3), device_seconds_finished=7.0)
    study = sa.select(StudyRow.id).where(StudyRow.name == "sw").scalar_subquery()
    with c.sessions.kw["bind"].connect() as writer:
        held = writer.begin()
        writer.execute(sa.update(SummaryRow).where(SummaryRow.study_id == study)
                       .values(summary=owing.to_json()))
        deleting = threading.Thread(target=c.studies.delete, args=(alice, "sw"))
        deleting.start()
        time.sleep(1.5)  # the delete now waits for the summary row (PostgreSQL) or the
        held.commit()  # database (SQLite)
    deleting.join(60)
    assert _left(app, optuna_id, "sw") == NOTHING
    with c.sessions() as session:
        assert session.execute(sa.select(UsageRow.device_seconds)).scalars().all() == [7.0]
