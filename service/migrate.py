"""Schema migrations of the service's own tables, with Alembic (``service/migrations``).

Optuna versions its own tables (``alembic_version``); the service's ``hpo_*`` tables keep
their revision in ``hpo_alembic_version``. What a database can be in, and what is done:

* no service table at all (a new database): the tables are created as the code declares
  them and stamped with the newest revision (what Alembic's documentation recommends
  for a fresh database; no need to replay history);
* service tables but no version table (made by a version before migrations): it is
  taken to be at the first revision, ``0001``, and upgraded from there;
* an older revision: :func:`prepare` upgrades it when allowed (``HPO_AUTO_MIGRATE``),
  else refuses with :class:`SchemaOutdated`, naming ``hpo db upgrade``;
* the newest revision: nothing to do. A revision this code does not know (a newer
  version of the service wrote it) is refused too: downgrading is the operator's call.

Upgrades run under a lock, so that two servers starting on one database do not both
migrate it (:func:`hpo.engines.database_lock`): PostgreSQL's advisory lock, a file
lock next to a SQLite database.
"""

from __future__ import annotations

import contextlib
import functools
import logging
from pathlib import Path

import sqlalchemy as sa
from alembic import command
from alembic.config import Config
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory

from hpo.engines import database_lock
from service.errors import ServiceError

VERSION_TABLE = "hpo_alembic_version"
BASELINE = "0001"
log = logging.getLogger(__name__)
LOCK_KEY = 0x68706F6D  # "hpom": the advisory lock of the service's migrations
SCRIPTS = Path(__file__).with_name("migrations")


class SchemaOutdated(ServiceError):
    """The database's service tables are at an older revision than this code needs."""


def _config(connection: sa.Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPTS))
    config.attributes["connection"] = connection
    return config


@functools.cache
def _scripts() -> ScriptDirectory:
    """The service's migrations, loaded once a process (read-only: each load executes every
    migration file)."""
    return ScriptDirectory.from_config(_config())


def head() -> str:
    """The newest revision this code knows."""
    return _scripts().get_current_head()


def current(engine: sa.Engine) -> str | None:
    """The database's revision: ``None`` without service tables, ``BASELINE`` for tables
    made before migrations existed.

    The tables are looked at before the version table: a new database's tables and its
    version are committed together (:func:`upgrade`), so a process that saw no version
    first and then the tables (a concurrent first start committing in between) took a
    new database for one made before migrations and refused to start it as outdated."""
    with engine.connect() as connection:
        has_tables = sa.inspect(connection).has_table("hpo_studies")
        revision = MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
        if revision is None and has_tables:
            return BASELINE
    return revision


def upgrade(engine: sa.Engine) -> tuple[str | None, str]:
    """Bring the service's tables to the newest revision, under the migration lock.

    Returns:
        ``(revision before, revision after)``.

    Raises:
        SchemaOutdated: the database holds a revision this code does not know.
    """
    with _locked(engine) as connection:
        before = MigrationContext.configure(
            connection, opts={"version_table": VERSION_TABLE}).get_current_revision()
        has_tables = sa.inspect(connection).has_table("hpo_studies")
        check_known(before)
        config = _config(connection)
        if before is None and not has_tables:  # a new database
            from service.db import Base

            Base.metadata.create_all(connection, checkfirst=True)
            command.stamp(config, "head")
            return None, head()
        if before is None:  # tables from before migrations: they are the baseline
            command.stamp(config, BASELINE)
            before = BASELINE
        command.upgrade(config, "head")
        _case_indexes(connection)
    return before, head()


# unique indexes on lower(name) that revisions 0006 and 0008 skip while names differing
# only in case are stored: made once they are gone (see _case_indexes)
CASE_INDEXES = {"hpo_tokens": "ix_hpo_tokens_name_lower",
                "hpo_studies": "ix_hpo_studies_name_lower"}


def _case_indexes(connection: sa.Connection) -> None:
    """Make each of ``CASE_INDEXES`` that is missing, unless names that differ only in case
    are still stored (then say so in the log: the service's own check still refuses new
    ones, but only the index settles concurrent creates). Revisions 0006 and 0008 leave
    the index out of a database that held such names; once they are deleted, the next
    start or ``hpo db upgrade`` makes it."""
    # on PostgreSQL, in the schema of the table it indexes (the one the search path finds,
    # where CREATE INDEX puts it): another schema's index of the same name is another
    # deployment's, and current_schema() is not the table's when the path's first schema
    # was made after the tables
    exists = sa.text("SELECT name FROM sqlite_master WHERE type = 'index' AND name = :n"
                     if connection.dialect.name == "sqlite" else
                     "SELECT i.indexname FROM pg_indexes i JOIN pg_class c ON "
                     "c.oid = to_regclass(:t) JOIN pg_namespace s ON s.oid = c.relnamespace "
                     "WHERE i.indexname = :n AND i.schemaname = s.nspname")
    for table, index in CASE_INDEXES.items():
        if connection.execute(exists, {"n": index, "t": table}).first() is not None:
            continue
        clashes = connection.execute(sa.text(
            f"SELECT lower(name) FROM {table} GROUP BY lower(name) HAVING count(*) > 1")).all()
        if clashes:
            log.warning("%s: names differing only in case (%s), so no unique index on "
                        "lower(name); new such names are still refused", table,
                        ", ".join(sorted(c[0] for c in clashes)))
            continue
        connection.execute(sa.text(f"CREATE UNIQUE INDEX {index} ON {table} (lower(name))"))
        log.info("%s: made the unique index on lower(name) (%s)", table, index)


def prepare(engine: sa.Engine, *, auto: bool) -> None:
    """Make the service's tables usable at start-up: create them in a new database; upgrade
    an outdated one when ``auto``, else refuse.

    Raises:
        SchemaOutdated: outdated and not ``auto`` (the message names ``hpo db upgrade`` and
            ``HPO_AUTO_MIGRATE``), or at a revision this code does not know.
    """
    revision = current(engine)
    if revision == head():
        with _locked(engine) as connection:
            _case_indexes(connection)
        return
    check_known(revision)
    if revision is not None and not auto:
        raise SchemaOutdated(
            f"the database's service tables are at revision {revision}, this version needs "
            f"{head()}: run `hpo db upgrade` (same HPO_DATABASE_URL), or start with "
            f"HPO_AUTO_MIGRATE=true")
    upgrade(engine)


def check_known(revision: str | None) -> None:
    """Raises :class:`SchemaOutdated` for a revision this code does not know."""
    if revision is None:
        return
    if revision not in {s.revision for s in _scripts().walk_revisions()}:
        raise SchemaOutdated(f"the database's service tables are at revision {revision}, "
                             f"which this version does not know (newest: {head()}): a newer "
                             f"version of the service migrated it; run that version")


@contextlib.contextmanager
def _locked(engine: sa.Engine):
    """A transaction for a migration, under the migration lock
    (:func:`hpo.engines.database_lock`: the file ``<database>.migrate-lock`` beside a
    SQLite database, PostgreSQL's advisory lock ``LOCK_KEY``)."""
    url = engine.url.render_as_string(hide_password=False)
    with database_lock(url, "migrate", LOCK_KEY), _connection(engine) as connection, \
            connection.begin():
        yield connection


@contextlib.contextmanager
def _connection(engine: sa.Engine):
    """A connection of ``engine`` for a migration: on SQLite without foreign-key
    enforcement (``hpo.engines.sync_normal`` turns it on), which SQLite's table rebuilds
    (Alembic's batch mode) need, as SQLite's and Alembic's documentation say; it is set
    outside the transaction (inside, SQLite ignores it) and turned on again after."""
    with engine.connect() as connection:
        sqlite = connection.dialect.name == "sqlite"
        if sqlite:
            connection.exec_driver_sql("PRAGMA foreign_keys=OFF")
            connection.commit()
        try:
            yield connection
        finally:
            if sqlite:
                connection.rollback()
                connection.exec_driver_sql("PRAGMA foreign_keys=ON")
                connection.commit()
