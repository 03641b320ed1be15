"""Reads of studies from the service's own table: the summary the driver keeps (issue 13.5).

The driver's part is played here without Ray: a claim in the study's row, and
``hpo.record.StudyRecord`` (or Optuna directly) with the tracker of
``service.summaries.summary_tracker`` as its listener, flushed where a test reads.
"""

from __future__ import annotations

import contextlib
import re

import optuna
import pytest
import sqlalchemy as sa
from optuna.trial import TrialState

from hpo.record import StudyRecord
from hpo.spec import StudySpec, load_stored
from hpo.summary import SummaryTracker
from service.db import Status, StudyRow, SummaryRow
from service.summaries import store_summary, summary_tracker, summary_writer
from tests.service.conftest import bearer, forget_summary, tiny_spec

X = {"lr": optuna.distributions.FloatDistribution(1e-3, 0.1, log=True)}
# a statement on one of Optuna's tables (the service's own carry the hpo_ prefix)
OPTUNA_TABLE = re.compile(r"\b(FROM|JOIN|INTO|UPDATE)\s+\"?(studies|study_\w+|trials|trial_\w+|"
                          r"version_info|alembic_version)\b", re.IGNORECASE)


def _claim(app, name: str, claim: str = "driver-1") -> None:
    """Mark the study RUNNING under ``claim``, as the dispatcher does for its driver."""
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == name).values(
            status=Status.RUNNING, claimed_by=claim))


def _spec(app, name: str) -> StudySpec:
    with app.state.components.sessions() as session:
        stored = session.execute(sa.select(StudyRow.spec).where(StudyRow.name == name)
                                 ).scalar_one()
    return load_stored(stored)


def _drive(app, name: str, claim: str = "driver-1") -> SummaryTracker:
    """The tracker a driver of ``name`` starts with (its first summary written at once)."""
    _claim(app, name, claim)
    c = app.state.components
    return summary_tracker(c.settings.database_url, c.sessions, _spec(app, name), claim)


def _summary_rows(app) -> int:
    with app.state.components.sessions() as session:
        return session.execute(sa.select(sa.func.count()).select_from(SummaryRow)).scalar_one()


@contextlib.contextmanager
def statements():
    """The SQL text of every statement any engine of the process sends meanwhile."""
    seen: list[str] = []

    def note(conn, cursor, statement, *args) -> None:
        seen.append(statement)

    sa.event.listen(sa.Engine, "before_cursor_execute", note)
    try:
        yield seen
    finally:
        sa.event.remove(sa.Engine, "before_cursor_execute", note)


def test_the_view_follows_the_record_through_every_state_and_a_requeue(client, tokens, app):
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("rec", n_trials=4), headers=h)
    tracker = _drive(app, "rec")
    spec = _spec(app, "rec")
    storage = app.state.components.studies.storage

    def counts() -> dict:
        tracker.flush()
        return client.get("/v1/studies/rec", headers=h).json()["counts"]

    record = StudyRecord(spec, storage, listener=tracker)
    for ray_id in "abcd":
        record.ask(ray_id)
    assert counts() == {"complete": 0, "pruned": 0, "failed": 0, "running": 4, "waiting": 0,
                        "requeued": 0}
    record.result("a", {"val_accuracy": 0.9, "step": 5, "planned_updates": 5})
    assert record.complete_or_prune("a", "asha") == TrialState.COMPLETE
    record.result("b", {"val_accuracy": 0.5, "step": 2, "planned_updates": 5})
    record.note_stop("b", "asha")
    assert record.complete_or_prune("b", "asha") == TrialState.PRUNED
    record.fail("c", "RuntimeError: boom")
    assert counts() == {"complete": 1, "pruned": 1, "failed": 1, "running": 1, "waiting": 0,
                        "requeued": 0}
    # the driver is lost with "d" RUNNING; the next one requeues it (no checkpoint)
    tracker = _drive(app, "rec", claim="driver-2")
    again = StudyRecord(spec, storage, listener=tracker)
    (orphan,) = again.orphans()
    again.requeue(orphan, "the driver stopped")
    tracker.flush()
    body = client.get("/v1/studies/rec", headers=h).json()
    assert body["counts"] == {"complete": 1, "pruned": 1, "failed": 2, "running": 0,
                              "waiting": 1, "requeued": 1}
    assert body["progress"] == {"finished": 3, "n_trials": 4, "fraction": 0.75}
    assert body["best_trial"]["number"] == 0 and body["best_trial"]["value"] == 0.9
    assert body["device_seconds"] == round(sum(
        t.user_attrs.get("device_seconds", 0.0) for t in record.study.trials), 3)


def _finish(study: optuna.Study, tracker: SummaryTracker, n: int, objectives: int) -> None:
    """``n`` trials of every state, told to the tracker as a record would."""
    states = [TrialState.COMPLETE] * 3 + [TrialState.PRUNED, TrialState.FAIL]
    for i in range(n):
        trial = study.ask(X)
        tracker.trial_changed(study.trials[trial.number])
        trial.set_user_attr("device_seconds", 0.25 * i)
        state = states[i % 5]
        values = [((7 * i) % 11) / 10, ((5 * i) % 13) / 10][:objectives]
        study.tell(trial, values if state == TrialState.COMPLETE else None, state=state)
        tracker.trial_changed(study.trials[trial.number])
    tracker.flush()


@pytest.mark.parametrize("objectives", [1, 2])
def test_the_view_answers_what_optunas_public_api_computes(client, tokens, app, objectives):
    h = bearer(tokens["alice"])
    objective = ({"metric": "val_accuracy"} if objectives == 1 else
                 [{"metric": "val_accuracy"}, {"metric": "val_loss"}])
    client.post("/v1/studies", json=tiny_spec("pub", n_trials=30, objective=objective),
                headers=h)
    tracker = _drive(app, "pub")
    study = optuna.load_study(study_name="pub", storage=app.state.components.studies.storage)
    _finish(study, tracker, 25, objectives)
    body = client.get("/v1/studies/pub", headers=h).json()
    states = [t.state for t in study.trials]
    assert body["counts"] == {
        "complete": states.count(TrialState.COMPLETE), "pruned": states.count(TrialState.PRUNED),
        "failed": states.count(TrialState.FAIL), "running": 0, "waiting": 0, "requeued": 0}
    best = [study.best_trial] if objectives == 1 else study.best_trials
    assert [t["number"] for t in body["best_trials"]] == [t.number for t in best]
    assert [t["values"] for t in body["best_trials"]] == [t.values for t in best]
    assert (body["best_trial"] is None) == (objectives == 2)
    assert body["progress"]["finished"] == 25
    assert body["device_seconds"] == 75.0 == sum(t.user_attrs["device_seconds"]
                                                 for t in study.trials)


def test_a_pareto_front_of_one_trial_is_no_best_trial(client, tokens, app):
    """The breaker: a two-objective study whose front held one trial answered it as
    ``best_trial``, which the schema keeps for a single objective."""
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("front-of-one", n_trials=3, objective=[
        {"metric": "val_accuracy"}, {"metric": "val_loss"}]), headers=h)
    tracker = _drive(app, "front-of-one")
    study = optuna.load_study(study_name="front-of-one",
                              storage=app.state.components.studies.storage)
    _finish(study, tracker, 1, 2)
    body = client.get("/v1/studies/front-of-one", headers=h).json()
    assert [t["number"] for t in body["best_trials"]] == [0] and body["best_trial"] is None


def test_the_list_reads_no_table_of_optunas(client, tokens, app):
    h = bearer(tokens["alice"])
    for name in ("one", "two", "queued"):
        client.post("/v1/studies", json=tiny_spec(name, n_trials=9), headers=h)
    for name in ("one", "two"):
        tracker = _drive(app, name)
        _finish(optuna.load_study(study_name=name, storage=app.state.components.studies.storage),
                tracker, 5, 1)
    with statements() as seen:
        page = client.get("/v1/studies", headers=h).json()
    assert seen and not [s for s in seen if OPTUNA_TABLE.search(s)], seen
    assert {s["name"]: s["counts"]["complete"] for s in page["items"]} == {
        "one": 3, "two": 3, "queued": 0}
    assert {s["name"]: s["progress"]["finished"] for s in page["items"]} == {
        "one": 5, "two": 5, "queued": 0}


def test_a_driver_without_the_claim_writes_no_summary(client, tokens, app):
    client.post("/v1/studies", json=tiny_spec("lost"), headers=bearer(tokens["alice"]))
    forget_summary(app, "lost")  # the driver's first write is the one under test
    _claim(app, "lost", "driver-2")  # taken over
    writer = summary_writer(app.state.components.sessions, "lost", "driver-1")
    writer(SummaryTracker(["maximize"], 1.0).summary())
    assert _summary_rows(app) == 0
    summary_writer(app.state.components.sessions, "lost", "driver-2")(
        SummaryTracker(["maximize"], 1.0).summary())
    assert _summary_rows(app) == 1


def test_an_ended_study_without_a_summary_has_it_computed_once(client, tokens, app):
    """A study a version before the summaries ran: its counts come from Optuna once."""
    h = bearer(tokens["alice"])
    client.post("/v1/studies", json=tiny_spec("old", n_trials=2), headers=h)
    study = optuna.load_study(study_name="old", storage=app.state.components.studies.storage)
    for value in (0.3, 0.7):
        study.add_trial(optuna.trial.create_trial(value=value, params={"lr": 0.01},
                                                  distributions=X,
                                                  user_attrs={"device_seconds": 2.0}))
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == "old").values(
            status=Status.COMPLETED))
    forget_summary(app, "old")  # made before the service kept summaries
    assert _summary_rows(app) == 0
    first = client.get("/v1/studies", headers=h).json()["items"][0]
    assert first["counts"]["complete"] == 2 and _summary_rows(app) == 1
    with statements() as seen:
        listed = client.get("/v1/studies", headers=h).json()["items"][0]
        view = client.get("/v1/studies/old", headers=h).json()
    assert not [s for s in seen if OPTUNA_TABLE.search(s)]
    assert listed == first
    assert (view["best_trial"]["number"], view["device_seconds"]) == (1, 4.0)


def test_a_kept_pareto_front_follows_new_trials_and_a_study_made_again(client, tokens, app):
    h = bearer(tokens["admin"])
    objective = [{"metric": "val_loss"}, {"metric": "val_accuracy", "direction": "minimize"}]
    storage = app.state.components.studies.storage

    def start() -> tuple[optuna.Study, SummaryTracker]:
        assert client.post("/v1/studies", json=tiny_spec("kept", objective=objective),
                           headers=h).status_code == 201
        return optuna.load_study(study_name="kept", storage=storage), _drive(app, "kept")

    def add(study, tracker, values: list[float]) -> None:
        study.add_trial(optuna.trial.create_trial(values=values))
        tracker.trial_changed(study.trials[-1])

    def front() -> list[int]:
        tracker.flush()
        return [t["number"] for t in client.get("/v1/studies/kept", headers=h).json()[
            "best_trials"]]

    study, tracker = start()
    for values in ([2.0, 2.0], [3.0, 1.0]):
        add(study, tracker, values)
    assert front() == [0, 1]
    assert front() == [0, 1]  # kept
    add(study, tracker, [1.0, 1.0])  # dominates both
    assert front() == [2]
    running = study.ask()
    tracker.trial_changed(study.trials[-1])
    assert front() == [2]  # a trial that has not completed changes nothing
    study.tell(running, [0.5, 3.0])
    tracker.trial_changed(study.trials[-1])
    assert front() == [2, 3] == [t.number for t in study.best_trials]
    with app.state.components.sessions.begin() as session:
        session.execute(sa.update(StudyRow).where(StudyRow.name == "kept").values(
            status=Status.COMPLETED))
    assert client.delete("/v1/studies/kept", headers=h).status_code == 204
    assert _summary_rows(app) == 0
    again, tracker = start()
    for values in ([5.0, 5.0], [4.0, 6.0], [9.0, 9.0], [6.0, 4.0]):
        add(again, tracker, values)
    assert front() == [0, 1, 3] == [t.number for t in again.best_trials]


def test_a_summary_for_a_deleted_study_is_not_stored(client, tokens, app):
    """A list computing an ended study's summary while a DELETE removes its row: nothing
    is stored and nothing fails (bench/load.py saw a foreign-key error here)."""
    client.post("/v1/studies", json=tiny_spec("gone"), headers=bearer(tokens["alice"]))
    forget_summary(app, "gone")  # a study made before the service kept summaries
    with app.state.components.sessions.begin() as session:
        row = session.execute(sa.select(StudyRow).where(StudyRow.name == "gone")).scalar_one()
        session.execute(sa.delete(StudyRow).where(StudyRow.id == row.id))
    with app.state.components.sessions.begin() as session:
        store_summary(session, row.id, SummaryTracker(["maximize"], 1.0).summary())
    assert _summary_rows(app) == 0
