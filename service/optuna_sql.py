"""Pages of a study's trials read set-based from Optuna's RDB tables: the one seam where
the service reads them directly.

Optuna's public API cannot read a page: ``Study.get_trials`` and
``BaseStorage.get_all_trials`` load every trial of the study, and ``get_trial`` sends
about six statements per trial (its relationships load lazily), so a page of 100 cost
about 600 statements and a second at 5k trials (issue 11, point 10). A page here costs
6 statements (5 without intermediate values), whatever the study's size. Counts, the
best trial and the Pareto front are no longer read here: the driver keeps them in the
service's own table (:mod:`service.summaries`, issue 13 point 5); one trial is read
through ``RDBStorage.get_trial``.

The reads touch only tables and columns that Optuna's RDB schema has kept since v3
(``studies``, ``trials``, ``trial_values``, ``trial_params``, ``trial_user_attributes``,
``trial_system_attributes``, ``trial_intermediate_values``) and build the
:class:`~optuna.trial.FrozenTrial` that ``RDBStorage.get_trial`` builds from the same
rows; ``tests/service/test_optuna_sql.py`` checks them against a real storage, so a
schema change in Optuna fails a test instead of a request.
"""

from __future__ import annotations

import datetime as dt
import json
from collections import defaultdict
from collections.abc import Iterable, Sequence

import sqlalchemy as sa
from optuna.distributions import BaseDistribution, json_to_distribution
from optuna.trial import FrozenTrial, TrialState

_meta = sa.MetaData()
studies = sa.Table("studies", _meta, sa.Column("study_id", sa.Integer, primary_key=True),
                   sa.Column("study_name", sa.String))
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

def trial_ids_page(conn: sa.Connection, study_id: int, offset: int, limit: int) -> list[int]:
    """Internal trial ids of one page of a study's trials, by trial number."""
    query = (sa.select(trials.c.trial_id).where(trials.c.study_id == study_id)
             .order_by(trials.c.number).offset(offset).limit(limit))
    return list(conn.execute(query).scalars())


def n_trials(conn: sa.Connection, study_id: int) -> int:
    """The number of trials of a study, of every state. One query on ``trials``' index."""
    return conn.execute(sa.select(sa.func.count()).select_from(trials)
                        .where(trials.c.study_id == study_id)).scalar_one()


def has_constraints(conn: sa.Connection, study_id: int) -> bool:
    """Whether any trial of the study has a constraint value (Optuna 5's ``constraints:KEY``
    system attributes, ``Trial.set_constraint``). One query."""
    query = (sa.select(sa.literal(1)).select_from(trial_system_attributes.join(
        trials, trials.c.trial_id == trial_system_attributes.c.trial_id))
        .where(trials.c.study_id == study_id,
               trial_system_attributes.c.key.startswith("constraints:", autoescape=True))
        .limit(1))
    return conn.execute(query).first() is not None


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
