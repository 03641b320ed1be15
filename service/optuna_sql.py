"""Reads over Optuna's RDB tables: the one seam where the service reads them directly.

Optuna's storage API answers per-trial questions, one trial at a time: counting the
trials of a study by state, or paging through them, loads every trial of the study
(``get_n_trials`` calls ``get_all_trials``), and ``get_trial`` sends about six
statements per trial (its relationships load lazily); ``Study.best_trials`` loads every
trial of the study. The reads here are set-based: a page of trials, a study's counts,
its best trial or Pareto front cost a number of statements that does not grow with the
study (issue 11, points 9 and 10). They touch only tables and columns that Optuna's RDB
schema has kept since v3 (``studies``, ``study_directions``, ``trials``,
``trial_values``, ``trial_params``, ``trial_user_attributes``,
``trial_system_attributes``, ``trial_intermediate_values``) and build the
:class:`~optuna.trial.FrozenTrial` that ``RDBStorage.get_trial`` builds from the same
rows; ``tests/service/test_optuna_sql.py`` checks them against a real storage, so a
schema change in Optuna fails a test instead of a request.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import itertools
import json
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence

import numpy as np
import sqlalchemy as sa
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

from hpo.storage import pareto_front_mask

_meta = sa.MetaData()
studies = sa.Table("studies", _meta, sa.Column("study_id", sa.Integer, primary_key=True),
                   sa.Column("study_name", sa.String))
study_directions = sa.Table(
    "study_directions", _meta, sa.Column("study_id", sa.Integer),
    sa.Column("objective", sa.Integer), sa.Column("direction", sa.String))
trials = sa.Table("trials", _meta, sa.Column("trial_id", sa.Integer, primary_key=True),
                  sa.Column("number", sa.Integer), sa.Column("study_id", sa.Integer),
                  sa.Column("state", sa.String), sa.Column("datetime_start", sa.DateTime),
                  sa.Column("datetime_complete", sa.DateTime))
trial_values = sa.Table(
    "trial_values", _meta, sa.Column("trial_value_id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer), sa.Column("objective", sa.Integer),
    sa.Column("value", sa.Float), sa.Column("value_type", sa.String))
trial_params = sa.Table(
    "trial_params", _meta, sa.Column("param_id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer), sa.Column("param_name", sa.String),
    sa.Column("param_value", sa.Float), sa.Column("distribution_json", sa.Text))
trial_user_attributes = sa.Table(
    "trial_user_attributes", _meta,
    sa.Column("trial_user_attribute_id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer), sa.Column("key", sa.String),
    sa.Column("value_json", sa.Text))
trial_system_attributes = sa.Table(
    "trial_system_attributes", _meta,
    sa.Column("trial_system_attribute_id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer), sa.Column("key", sa.String),
    sa.Column("value_json", sa.Text))
trial_intermediate_values = sa.Table(
    "trial_intermediate_values", _meta,
    sa.Column("trial_intermediate_value_id", sa.Integer, primary_key=True),
    sa.Column("trial_id", sa.Integer), sa.Column("step", sa.Integer),
    sa.Column("intermediate_value", sa.Float), sa.Column("intermediate_value_type", sa.String))

REQUEUED_ATTR = "requeued"
# An untyped SQL literal: PostgreSQL compares it with Optuna's enum column ("trialstate"),
# where a bound VARCHAR parameter would be refused.
_RUNNING = sa.literal_column("'RUNNING'")  # hpo.record: a FAIL trial of a lost driver, run again
_COMPLETE = sa.literal_column("'COMPLETE'")


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


def n_trials(conn: sa.Connection, study_id: int) -> int:
    """The number of trials of a study, of every state. One query on ``trials``' index."""
    return conn.execute(sa.select(sa.func.count()).select_from(trials)
                        .where(trials.c.study_id == study_id)).scalar_one()


def trial_id(conn: sa.Connection, study_id: int, number: int) -> int | None:
    """The internal id of trial ``number`` of a study, or ``None``."""
    return conn.execute(sa.select(trials.c.trial_id).where(
        trials.c.study_id == study_id, trials.c.number == number)).scalars().first()


def study_ids(conn: sa.Connection, names: Iterable[str]) -> dict[str, int]:
    """Optuna study ids of the studies in ``names`` that exist."""
    query = sa.select(studies.c.study_name, studies.c.study_id).where(
        studies.c.study_name.in_(list(names)))
    return {name: sid for name, sid in conn.execute(query)}


# -- whole trials, a few statements per call -------------------------------------------

IDS_PER_STATEMENT = 500  # ids in one IN list: under SQLite's oldest limit of 999 parameters
_INFINITIES = {"INF_POS": float("inf"), "INF_NEG": float("-inf"), "NAN": float("nan")}


def load_trials(conn: sa.Connection, trial_ids: Sequence[int], *,
                intermediate: bool = True) -> list[FrozenTrial]:
    """The trials with internal ids ``trial_ids``, in that order, as Optuna's
    ``RDBStorage.get_trial`` builds them (params in the order set, datetimes naive local
    time), with 6 statements per 500 ids (5 with ``intermediate=False``, which leaves
    ``intermediate_values`` empty). Ids of no trial are left out.
    """
    found: dict[int, FrozenTrial] = {}
    ids = list(trial_ids)
    for start in range(0, len(ids), IDS_PER_STATEMENT):
        found.update(_load_chunk(conn, ids[start:start + IDS_PER_STATEMENT], intermediate))
    return [found[i] for i in ids if i in found]


def _load_chunk(conn: sa.Connection, ids: list[int], intermediate: bool) -> dict[int, FrozenTrial]:
    rows = conn.execute(sa.select(trials.c.trial_id, trials.c.number, trials.c.state,
                                  trials.c.datetime_start, trials.c.datetime_complete)
                        .where(trials.c.trial_id.in_(ids))).all()
    if not rows:
        return {}
    values = _children(conn, trial_values, trial_values.c.trial_value_id, ids,
                       trial_values.c.objective, trial_values.c.value, trial_values.c.value_type)
    params = _children(conn, trial_params, trial_params.c.param_id, ids,
                       trial_params.c.param_name, trial_params.c.param_value,
                       trial_params.c.distribution_json)
    user = _children(conn, trial_user_attributes, trial_user_attributes.c.trial_user_attribute_id,
                     ids, trial_user_attributes.c.key, trial_user_attributes.c.value_json)
    system = _children(conn, trial_system_attributes,
                       trial_system_attributes.c.trial_system_attribute_id, ids,
                       trial_system_attributes.c.key, trial_system_attributes.c.value_json)
    curves = (_children(conn, trial_intermediate_values,
                        trial_intermediate_values.c.trial_intermediate_value_id, ids,
                        trial_intermediate_values.c.step,
                        trial_intermediate_values.c.intermediate_value,
                        trial_intermediate_values.c.intermediate_value_type)
              if intermediate else {})
    known: dict[str, BaseDistribution] = {}  # a page shares a few distributions
    out = {}
    for trial_id, number, state, start, complete in rows:
        dists = {name: known.get(text) or known.setdefault(text, json_to_distribution(text))
                 for name, _, text in params.get(trial_id, [])}
        out[trial_id] = FrozenTrial(
            number=number, state=TrialState[_enum_name(state)], value=None,
            values=_objective_values(values.get(trial_id)),
            datetime_start=_local(start), datetime_complete=_local(complete),
            params={name: dists[name].to_external_repr(internal)
                    for name, internal, _ in params.get(trial_id, [])},
            distributions=dists,
            user_attrs={key: json.loads(text) for key, text in user.get(trial_id, [])},
            system_attrs={key: json.loads(text) for key, text in system.get(trial_id, [])},
            intermediate_values={step: _float(v, kind)
                                 for step, v, kind in curves.get(trial_id, [])},
            trial_id=trial_id)
    return out


def _children(conn: sa.Connection, table: sa.Table, order: sa.Column, ids: list[int],
              *columns: sa.Column) -> dict[int, list[tuple]]:
    """Rows of a per-trial table for the trials ``ids``, by trial, in ``order``. One query."""
    query = sa.select(table.c.trial_id, *columns).where(table.c.trial_id.in_(ids)).order_by(order)
    by_trial: dict[int, list[tuple]] = defaultdict(list)
    for trial_id, *rest in conn.execute(query):
        by_trial[trial_id].append(tuple(rest))
    return by_trial


def _enum_name(value: object) -> str:
    return str(value).rsplit(".", 1)[-1]  # a plain name on SQLite and PostgreSQL alike


def _float(value: float | None, kind: object) -> float:
    """A stored objective or intermediate value: ``None`` plus its kind for inf and NaN."""
    kind = _enum_name(kind)
    return float(value) if kind == "FINITE" else _INFINITIES[kind]


def _objective_values(rows: list[tuple] | None) -> list[float] | None:
    if not rows:
        return None
    values = [0.0] * len(rows)
    for objective, value, kind in rows:
        values[objective] = _float(value, kind)
    return values


def _local(stored: dt.datetime | None) -> dt.datetime | None:
    """Optuna 5 stores naive UTC and hands out naive local time (``TrialModel``)."""
    if stored is None:
        return None
    return stored.replace(tzinfo=dt.UTC).astimezone().replace(tzinfo=None)


# -- the best trial, or the Pareto front ------------------------------------------------


def best_trials(conn: sa.Connection, study_id: int) -> list[FrozenTrial]:
    """The study's best trial (one objective) or its Pareto front (several), as Optuna's
    ``Study.best_trial`` / ``Study.best_trials`` answer, without intermediate values
    (``intermediate_values`` empty); no COMPLETE trial: ``[]``.

    One objective: 7 statements. Several: 9 statements, one of which reads the objective
    values of every COMPLETE trial (one row per trial and objective); the front is then
    found by Optuna's non-dominated sort over those values, among the feasible trials
    where the study has constraints (``Trial.set_constraint``). The front is kept
    (:class:`_FrontCache`) until the study's COMPLETE trials change: 7 statements then,
    none of which reads every trial.
    """
    directions = [_enum_name(d) for d in conn.execute(
        sa.select(study_directions.c.direction).where(study_directions.c.study_id == study_id)
        .order_by(study_directions.c.objective)).scalars()]
    if len(directions) == 1:
        ids = _best_trial_id(conn, study_id, maximize=directions[0] == "MAXIMIZE")
    else:
        ids = _FRONTS.get(conn, study_id, [d == "MAXIMIZE" for d in directions])
    return load_trials(conn, ids, intermediate=False)


class _FrontCache:
    """Pareto fronts by study, reused while the study's COMPLETE trials stay the same.

    A COMPLETE trial never changes (Optuna refuses updates to a finished trial) and its
    constraints are written before it completes, so the front changes only when the set
    of COMPLETE trials does. That set is fingerprinted in one indexed aggregate (count,
    sum of ids, latest completion), about 2 ms at 10k trials against about 50 ms for
    reading every trial's values and sorting them; a study deleted and made again under
    a reused id has other completion times. Thread-safe; the last ``size`` studies kept.
    """

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._fronts: dict[tuple[str, int], tuple[tuple, list[int]]] = {}
        self._lock = threading.Lock()

    def get(self, conn: sa.Connection, study_id: int, maximize: list[bool]) -> list[int]:
        fingerprint = tuple(conn.execute(
            sa.select(sa.func.count(), sa.func.coalesce(sa.func.sum(trials.c.trial_id), 0),
                      sa.func.max(trials.c.datetime_complete))
            .where(trials.c.study_id == study_id, trials.c.state == _COMPLETE)).one())
        key = (conn.engine.url.render_as_string(hide_password=True), study_id)
        with self._lock:
            cached = self._fronts.get(key)
        if cached is not None and cached[0] == fingerprint:
            return cached[1]
        ids = _pareto_front_ids(conn, study_id, maximize)
        with self._lock:
            self._fronts.pop(key, None)
            self._fronts[key] = (fingerprint, ids)
            while len(self._fronts) > self.size:
                del self._fronts[next(iter(self._fronts))]
        return ids


_FRONTS = _FrontCache()


def _best_trial_id(conn: sa.Connection, study_id: int, maximize: bool) -> list[int]:
    """The query of Optuna's ``TrialModel.find_max/min_value_trial_id`` (same order, ties
    included), so that the same trial wins."""
    kind = trial_values.c.value_type
    rank = sa.case((kind == sa.literal_column("'INF_NEG'"), -1),
                   (kind == sa.literal_column("'FINITE'"), 0),
                   (kind == sa.literal_column("'INF_POS'"), 1))
    order = sa.desc if maximize else sa.asc
    query = (sa.select(trials.c.trial_id)
             .select_from(trials.join(trial_values, trial_values.c.trial_id == trials.c.trial_id))
             .where(trials.c.study_id == study_id, trials.c.state == _COMPLETE,
                    trial_values.c.objective == 0)
             .order_by(order(rank), order(trial_values.c.value)).limit(1))
    return list(conn.execute(query).scalars())


def _pareto_front_ids(conn: sa.Connection, study_id: int, maximize: list[bool]) -> list[int]:
    """Ids of the COMPLETE (and, under constraints, feasible) trials that no other such
    trial dominates, by trial id. Two statements, whatever the study's size; the values
    go from the rows into numpy without a Python loop over them (10k trials: ~30 ms)."""
    kind = trial_values.c.value_type
    infinity = sa.case((kind == sa.literal_column("'INF_POS'"), 1),
                       (kind == sa.literal_column("'INF_NEG'"), -1), else_=0)
    query = (sa.select(trial_values.c.trial_id, trial_values.c.objective,
                       sa.func.coalesce(trial_values.c.value, 0.0), infinity)
             .select_from(trials.join(trial_values, trial_values.c.trial_id == trials.c.trial_id))
             .where(trials.c.study_id == study_id, trials.c.state == _COMPLETE))
    rows = conn.execute(query).all()
    if not rows:
        return []
    # one row per trial and objective: trial id, objective, value, sign of an infinity (0: none)
    flat = np.fromiter(itertools.chain.from_iterable(rows), dtype=float, count=4 * len(rows))
    trial_ids, objective, value, sign = flat.reshape(-1, 4).T
    ids, row_trial = np.unique(trial_ids, return_inverse=True)
    losses = np.full((len(ids), len(maximize)), np.nan)
    losses[row_trial, objective.astype(int)] = np.where(sign == 0, value,
                                                         np.copysign(np.inf, sign))
    losses[:, np.asarray(maximize)] *= -1
    keep = ~np.isnan(losses).any(axis=1)  # every objective recorded
    feasible = _feasibility(conn, study_id)
    if feasible is not None:
        keep &= np.array([feasible.get(int(i), True) for i in ids], dtype=bool)
    ids, losses = ids[keep], losses[keep]
    if not len(ids):
        return []
    on_front = pareto_front_mask(losses)
    return ids[on_front].astype(int).tolist()


def _feasibility(conn: sa.Connection, study_id: int) -> dict[int, bool] | None:
    """Trial id -> feasible, for the trials with constraints; ``None`` where no trial of
    the study has any (Optuna's ``_is_constrained_optimization``). Constraints are the
    system attributes ``constraints`` (a list, Optuna's older format) and
    ``constraints:NAME``."""
    key = trial_system_attributes.c.key
    query = (sa.select(trial_system_attributes.c.trial_id, key,
                       trial_system_attributes.c.value_json)
             .select_from(trials.join(trial_system_attributes,
                                      trial_system_attributes.c.trial_id == trials.c.trial_id))
             .where(trials.c.study_id == study_id,
                    sa.or_(key == "constraints", key.startswith("constraints:", autoescape=True))))
    attrs: dict[int, dict[str, object]] = defaultdict(dict)
    for trial_id, name, text in conn.execute(query):
        attrs[trial_id][name] = json.loads(text)
    constraints = {trial_id: _constraints(a) for trial_id, a in attrs.items()}
    if not any(constraints.values()):
        return None
    return {trial_id: all(x <= 0.0 for x in c.values()) for trial_id, c in constraints.items()}


def _constraints(attrs: dict[str, object]) -> dict[str, float]:
    """What ``FrozenTrial.constraints`` makes of these system attributes: the list
    ``constraints`` as keys "0", "1", ..., then ``constraints:NAME``, which wins."""
    found = {str(i): c for i, c in enumerate(attrs.get("constraints") or [])}
    found.update({k.split(":", 1)[1]: v for k, v in attrs.items() if k != "constraints"})
    return found
