"""The API's statements on the service's study rows, in SQLAlchemy Core and built once.

Rows of columns read like :class:`service.db.StudyRow`'s attributes (``row.name``,
``row.status``, ``row.spec``...) without ORM entities: an entity load was a fifth of a
lookup's CPU under ``bench/load.py``.
"""

from __future__ import annotations

import functools

import sqlalchemy as sa

from service.db import VISIBLE, StudyRow, SummaryRow, TokenRow

STUDIES, TOKENS = StudyRow.__table__, TokenRow.__table__
# a study's columns and its owner's name
_WITH_OWNER = sa.select(*STUDIES.c, TOKENS.c.name.label("owner_name")).select_from(
    STUDIES.outerjoin(TOKENS, TOKENS.c.id == STUDIES.c.owner_id))


@functools.cache
def visible_study(scoped: bool) -> sa.Select:
    """The visible study ``:name`` with its owner's name (``owner_name``); ``scoped``: only
    if ``:owner`` owns it (built once: every read, stop and delete looks its study up)."""
    where = [STUDIES.c.name == sa.bindparam("name"), STUDIES.c.status.in_(VISIBLE)]
    if scoped:
        where.append(STUDIES.c.owner_id == sa.bindparam("owner"))
    return _WITH_OWNER.where(*where)


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
