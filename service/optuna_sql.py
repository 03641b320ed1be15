"""Aggregate reads over Optuna's RDB tables: the one seam where the service reads them directly.

Optuna's storage API answers per-trial questions well, but counting the trials
of a study by state, or paging through them, loads every trial of the study
(``get_n_trials`` calls ``get_all_trials``): seconds at 10k trials. These
read-only queries touch only columns that Optuna's RDB schema has kept since
v3 (``studies``, ``trials``, ``trial_user_attributes``);
``tests/service/test_optuna_sql.py`` checks them against a real storage, so
a schema change in Optuna fails a test instead of a request.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Iterable

import sqlalchemy as sa

_meta = sa.MetaData()
studies = sa.Table("studies", _meta, sa.Column("study_id", sa.Integer, primary_key=True),
                   sa.Column("study_name", sa.String))
trials = sa.Table("trials", _meta, sa.Column("trial_id", sa.Integer, primary_key=True),
                  sa.Column("number", sa.Integer), sa.Column("study_id", sa.Integer),
                  sa.Column("state", sa.String), sa.Column("datetime_start", sa.DateTime))
trial_user_attributes = sa.Table(
    "trial_user_attributes", _meta, sa.Column("trial_id", sa.Integer),
    sa.Column("key", sa.String), sa.Column("value_json", sa.Text))

REQUEUED_ATTR = "requeued"
# An untyped SQL literal: PostgreSQL compares it with Optuna's enum column ("trialstate"),
# where a bound VARCHAR parameter would be refused.
_RUNNING = sa.literal_column("'RUNNING'")  # hpo.record: a FAIL trial of a lost driver, run again


@dataclasses.dataclass(frozen=True)
class TrialCounts:
    """Trials of one study by state."""

    complete: int = 0
    pruned: int = 0
    failed: int = 0
    running: int = 0
    waiting: int = 0
    requeued: int = 0

    @property
    def finished(self) -> int:
        """Trials COMPLETE, PRUNED or FAIL (requeued ones included)."""
        return self.complete + self.pruned + self.failed

    @property
    def budget_used(self) -> int:
        """Finished trials that count against ``budget.n_trials``: not the FAIL trials a
        lost driver left and ``run_study`` requeued (user attribute ``requeued``)."""
        return self.finished - self.requeued

    @property
    def total(self) -> int:
        return self.finished + self.running + self.waiting


def trial_counts(conn: sa.Connection, names: Iterable[str]) -> dict[str, TrialCounts]:
    """Trial counts by state for each study in ``names`` (absent studies: all zero). One query."""
    names = list(names)
    if not names:
        return {}
    query = (sa.select(studies.c.study_name, trials.c.state, sa.func.count())
             .select_from(studies.join(trials, trials.c.study_id == studies.c.study_id))
             .where(studies.c.study_name.in_(names))
             .group_by(studies.c.study_name, trials.c.state))
    raw: dict[str, dict[str, int]] = {name: {} for name in names}
    for name, state, n in conn.execute(query):
        raw[name][str(state).rsplit(".", 1)[-1]] = int(n)
    requeued = (sa.select(studies.c.study_name, sa.func.count())
                .select_from(studies.join(trials, trials.c.study_id == studies.c.study_id)
                             .join(trial_user_attributes,
                                   trial_user_attributes.c.trial_id == trials.c.trial_id))
                .where(studies.c.study_name.in_(names),
                       trial_user_attributes.c.key == REQUEUED_ATTR)
                .group_by(studies.c.study_name))
    for name, n in conn.execute(requeued):
        raw[name]["requeued"] = int(n)
    return {name: TrialCounts(complete=c.get("COMPLETE", 0), pruned=c.get("PRUNED", 0),
                              failed=c.get("FAIL", 0), running=c.get("RUNNING", 0),
                              waiting=c.get("WAITING", 0), requeued=c.get("requeued", 0))
            for name, c in raw.items()}


def device_seconds(conn: sa.Connection, study_id: int, devices_held: float,
                   now: dt.datetime | None = None) -> float:
    """Device-seconds a study used so far, in seconds of one CPU (or GPU) held.

    The sum of the finished trials' ``device_seconds`` attribute, plus, for
    each RUNNING trial, the time since it started times ``devices_held`` (the
    devices one trial holds): an estimate until the trial ends (a RUNNING trial
    has no ``device_seconds`` yet: ``hpo.record`` writes it as the trial ends).
    """
    finished = conn.execute(
        sa.select(sa.func.coalesce(sa.func.sum(sa.cast(trial_user_attributes.c.value_json,
                                                       sa.Float)), 0.0))
        .select_from(trial_user_attributes.join(
            trials, trials.c.trial_id == trial_user_attributes.c.trial_id))
        .where(trials.c.study_id == study_id, trial_user_attributes.c.key == "device_seconds")
    ).scalar_one()
    now = (now or dt.datetime.now(dt.UTC)).replace(tzinfo=None)
    starts = conn.execute(sa.select(trials.c.datetime_start).where(
        trials.c.study_id == study_id, trials.c.state == _RUNNING)).scalars()
    running = sum(max(0.0, (now - start).total_seconds()) for start in starts
                  if start is not None)
    return float(finished) + running * devices_held


def trial_ids_page(conn: sa.Connection, study_id: int, offset: int, limit: int) -> list[int]:
    """Internal trial ids of one page of a study's trials, by trial number."""
    query = (sa.select(trials.c.trial_id).where(trials.c.study_id == study_id)
             .order_by(trials.c.number).offset(offset).limit(limit))
    return list(conn.execute(query).scalars())


def study_ids(conn: sa.Connection, names: Iterable[str]) -> dict[str, int]:
    """Optuna study ids of the studies in ``names`` that exist."""
    query = sa.select(studies.c.study_name, studies.c.study_id).where(
        studies.c.study_name.in_(list(names)))
    return {name: sid for name, sid in conn.execute(query)}
