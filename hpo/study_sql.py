"""SQL statements on the tables of Optuna's storage, built once from its ORM metadata (passed
in by :mod:`hpo.storage`, the one module that names Optuna's private modules): a study's rows
created in one statement (:func:`hpo.storage.create_study_with_attrs`) and deleted set-based
(:func:`hpo.storage.delete_study`)."""

from __future__ import annotations

import functools

import sqlalchemy


@functools.lru_cache(maxsize=32)
def create_statement(metadata: sqlalchemy.MetaData,
                     shape: tuple[tuple[str, int, tuple[str, ...]], ...]) -> sqlalchemy.Select:
    """PostgreSQL, on the tables of ``metadata`` (Optuna's ORM metadata): the study's INSERT
    as a data-modifying ``WITH`` returning its id, and each table's rows one ``INSERT ...
    SELECT`` of that id (a ``WITH`` each), in one statement, bound by ``new_study_name`` and
    ``TABLE_I_KEY``. A table's rows are inserted in their order (Optuna reads a study's
    directions in the order of their ids); the tables' order does not matter. Built once
    per ``shape`` (table name, rows, keys): building it costs more than its round trip."""
    studies = metadata.tables["studies"]
    study = (sqlalchemy.insert(studies).values(study_name=sqlalchemy.bindparam("new_study_name"))
             .returning(studies.c.study_id).cte("new_study"))
    parts = []
    for name, n_rows, keys in shape:
        table = metadata.tables[name]
        ordered = sqlalchemy.union_all(*(sqlalchemy.select(
            study.c.study_id, sqlalchemy.literal(i).label("ordinal"),
            *(sqlalchemy.cast(sqlalchemy.bindparam(f"{table.name}_{i}_{k}", type_=table.c[k].type),
                              table.c[k].type).label(k) for k in keys))
            for i in range(n_rows))).subquery()
        columns = ["study_id", *keys]
        parts.append(sqlalchemy.insert(table).from_select(columns, sqlalchemy.select(
            *(ordered.c[k] for k in columns)).order_by(ordered.c.ordinal))
            .cte(f"insert_{table.name}"))
    return sqlalchemy.select(study.c.study_id).add_cte(*parts)


@functools.cache
def study_delete_statements(
        metadata: sqlalchemy.MetaData) -> tuple[sqlalchemy.Delete, ...] | None:
    """:func:`hpo.storage.delete_study`'s DELETEs for the tables of ``metadata`` (Optuna's
    ORM metadata), in order, bound by ``study_id``; None when a table references a study's
    rows other than by ``trials.trial_id`` or ``studies.study_id``."""
    studies, trials = metadata.tables["studies"], metadata.tables["trials"]
    tables = metadata.sorted_tables  # each after the tables it references
    owned = {studies}  # tables that have rows of a study
    for table in tables:
        if any(fk.column.table in owned for fk in table.foreign_keys):
            owned.add(table)
    study_id = sqlalchemy.bindparam("study_id")
    trial_ids = sqlalchemy.select(trials.c.trial_id).where(trials.c.study_id == study_id)
    statements = []
    for table in reversed(tables):  # children first
        conditions = []
        for fk in (fk for fk in table.foreign_keys if fk.column.table in owned):
            if fk.column is studies.c.study_id:
                conditions.append(fk.parent == study_id)
            elif fk.column is trials.c.trial_id and table is not trials:
                conditions.append(fk.parent.in_(trial_ids))
            else:
                return None
        if conditions:
            statements.append(sqlalchemy.delete(table).where(sqlalchemy.or_(*conditions)))
    statements.append(sqlalchemy.delete(studies).where(studies.c.study_id == study_id))
    return tuple(statements)


@functools.cache
def one_statement(statements: tuple[sqlalchemy.Delete, ...]) -> sqlalchemy.Delete:
    """The last of ``statements`` with each earlier one as a data-modifying ``WITH``
    (PostgreSQL only): one round trip. Every part reads the snapshot the statement
    started with (the trials' children still find their trials), and PostgreSQL checks
    foreign keys after the whole statement, so the parts' order does not matter."""
    last = statements[-1]
    for i, statement in enumerate(statements[:-1]):
        last = last.add_cte(statement.cte(f"delete_{i}"))
    return last
