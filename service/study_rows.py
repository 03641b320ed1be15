"""The API's statements on the service's study rows, in SQLAlchemy Core and built once.

Rows of columns read like :class:`service.db.StudyRow`'s attributes (``row.name``,
``row.status``, ``row.spec``...) without ORM entities: an entity load was a fifth of a
lookup's CPU under ``bench/load.py``.
"""

from __future__ import annotations

import functools

import sqlalchemy as sa

from service.audit import insert_for
from service.db import ENDED, VISIBLE, Status, StudyRow, SummaryRow, TokenRow

STUDIES, TOKENS = StudyRow.__table__, TokenRow.__table__
# a study's owner's name, in a statement on the study's row (an UPDATE's RETURNING)
OWNER_NAME = (sa.select(TOKENS.c.name).where(TOKENS.c.id == STUDIES.c.owner_id)
              .scalar_subquery().label("owner_name"))
# a study's columns and its owner's name
_WITH_OWNER = sa.select(*STUDIES.c, TOKENS.c.name.label("owner_name")).select_from(
    STUDIES.outerjoin(TOKENS, TOKENS.c.id == STUDIES.c.owner_id))


# a study's stored summary's JSON (None if none), in a statement on the study's row
KEPT_SUMMARY = (sa.select(SummaryRow.__table__.c.summary)
                .where(SummaryRow.__table__.c.study_id == STUDIES.c.id)
                .scalar_subquery().label("kept"))


@functools.cache
def visible_study(scoped: bool) -> sa.Select:
    """The visible study ``:name`` with its owner's name (``owner_name``) and its stored
    summary's JSON (``kept``, None if none); ``scoped``: only if ``:owner`` owns it (built
    once: every read, stop and delete looks its study up)."""
    where = [STUDIES.c.name == sa.bindparam("name"), STUDIES.c.status.in_(VISIBLE)]
    if scoped:
        where.append(STUDIES.c.owner_id == sa.bindparam("owner"))
    return _WITH_OWNER.add_columns(KEPT_SUMMARY).where(*where)


@functools.cache
def study_page(one_status: bool, scoped: bool) -> tuple[sa.Select, sa.Select]:
    """The count and one page (``:offset``, ``:limit``) of the visible studies, of status
    ``:status`` if ``one_status``, of owner ``:owner`` if ``scoped``, newest first, each
    with its owner's name and its summary's JSON (``kept``) (built once per kind)."""
    where = [STUDIES.c.status == sa.bindparam("status") if one_status
             else STUDIES.c.status.in_(VISIBLE)]
    if scoped:
        where.append(STUDIES.c.owner_id == sa.bindparam("owner"))
    summaries = SummaryRow.__table__
    page = (_WITH_OWNER.add_columns(summaries.c.summary.label("kept"))
            .outerjoin(summaries, summaries.c.study_id == STUDIES.c.id).where(*where)
            .order_by(STUDIES.c.created_at.desc(), STUDIES.c.id.desc())
            .offset(sa.bindparam("offset")).limit(sa.bindparam("limit")))
    return sa.select(sa.func.count()).select_from(STUDIES).where(*where), page


def _guarded_update(from_states: tuple[str, ...], scoped: bool) -> sa.Update:
    """An UPDATE of the study ``:study_name`` while its status is one of ``from_states``
    (and, if ``scoped``, while ``:owner`` owns it). (An UPDATE's parameter named as a
    column, ``name``, would set that column.)"""
    where = [STUDIES.c.name == sa.bindparam("study_name"), STUDIES.c.status.in_(from_states)]
    if scoped:
        where.append(STUDIES.c.owner_id == sa.bindparam("owner"))
    return sa.update(STUDIES).where(*where)


@functools.cache
def stop_update(scoped: bool) -> sa.Update:
    """Stop's one guarded UPDATE, bound by ``:study_name``, ``:now`` (and ``:owner`` if
    ``scoped``): a QUEUED study ends STOPPED, a RUNNING one is asked to stop (SET's
    expressions see the row as it was); it returns the row, its owner's name and its stored
    summary's JSON (``kept``)."""
    now = sa.bindparam("now", type_=STUDIES.c.updated_at.type)
    queued = STUDIES.c.status == Status.QUEUED
    return _guarded_update((Status.QUEUED, Status.RUNNING), scoped).values(
        updated_at=now, stop_requested=True,
        status=sa.case((queued, sa.literal(Status.STOPPED, STUDIES.c.status.type)),
                       else_=STUDIES.c.status),
        ended_at=sa.case((queued, now), else_=STUDIES.c.ended_at),
        waiting_for=sa.case((queued, sa.null()), else_=STUDIES.c.waiting_for),
    ).returning(*STUDIES.c, OWNER_NAME, KEPT_SUMMARY)


@functools.cache
def mark_deleting_update(scoped: bool) -> sa.Update:
    """Delete's first UPDATE, bound by ``:study_name``, ``:now`` (and ``:owner`` if ``scoped``):
    a QUEUED or ended study becomes DELETING; it returns its owner's id and its summary's
    JSON (``kept``, None if none)."""
    return (_guarded_update((Status.QUEUED, *ENDED), scoped)
            .values(status=Status.DELETING,
                    updated_at=sa.bindparam("now", type_=STUDIES.c.updated_at.type))
            .returning(STUDIES.c.owner_id, KEPT_SUMMARY))


@functools.lru_cache(maxsize=16)
def with_audit_row(update: sa.Update) -> sa.Select:
    """PostgreSQL: ``update`` (one of this module's, built once) as a data-modifying
    ``WITH`` whose changed row is selected, with the audit row's INSERT
    (:func:`service.audit.insert_for`) reading it: the change and its audit row in one
    statement (built once per statement)."""
    changed = update.cte("changed")
    return sa.select(*changed.c).add_cte(insert_for(changed))


@functools.lru_cache(maxsize=32)
def with_creating_row(create_optuna_study: sa.Select) -> sa.Select:
    """PostgreSQL: Optuna's study-creating statement (:func:`hpo.storage.
    create_study_statement`, one object per shape) with the CREATING row's INSERT added as
    a data-modifying ``WITH``, bound by ``row_name``, ``row_owner_id``, ``row_status``,
    ``row_spec``, ``row_n_trials`` and ``row_at`` (built once per shape)."""
    def bound(column: str, name: str | None = None) -> sa.BindParameter:
        return sa.bindparam(f"row_{name or column}", type_=STUDIES.c[column].type)

    creating = sa.insert(STUDIES).values(
        name=bound("name"), owner_id=bound("owner_id"), status=bound("status"),
        spec=bound("spec"), n_trials=bound("n_trials"), stop_requested=False, attempts=0,
        created_at=bound("created_at", "at"), updated_at=bound("updated_at", "at"))
    return create_optuna_study.add_cte(creating.cte("creating_row"))
