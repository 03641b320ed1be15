"""Migrations of the service's own tables (issue 14.1): a database made by the version
before migrations (its tables and data, built here as that version built them) upgrades
on SQLite and PostgreSQL with nothing lost; a new database starts at the newest revision;
the migrations replayed from nothing give exactly the tables the code declares; an
outdated database is refused unless auto-migration is on."""

from __future__ import annotations

import datetime as dt
import warnings

import pytest
import sqlalchemy as sa
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from typer.testing import CliRunner

from service import migrate
from service.db import Base, UTCDateTime, build_engine

# SQLite's reflection skips the index on lower(name) (revision 0006), saying so
pytestmark = pytest.mark.filterwarnings(
    "ignore:Skipped unsupported reflection of expression-based index")

# -- the schema as the version before migrations made it (create_all of its models) --------
LEGACY = sa.MetaData()
sa.Table("hpo_tokens", LEGACY,
         sa.Column("id", sa.Integer, primary_key=True),
         sa.Column("name", sa.String(64), unique=True, nullable=False),
         sa.Column("token_hash", sa.String(64), unique=True, nullable=False),
         sa.Column("is_admin", sa.Boolean, nullable=False),
         sa.Column("created_at", UTCDateTime, nullable=False))
sa.Table("hpo_studies", LEGACY,
         sa.Column("id", sa.Integer, primary_key=True),
         sa.Column("name", sa.String(64), unique=True, nullable=False),
         sa.Column("owner_id", sa.ForeignKey("hpo_tokens.id"), index=True),
         sa.Column("status", sa.String(16), index=True, nullable=False),
         sa.Column("spec", sa.JSON, nullable=False),
         sa.Column("n_trials", sa.Integer, nullable=False),
         sa.Column("stop_requested", sa.Boolean, nullable=False),
         sa.Column("claimed_by", sa.String(200)),
         sa.Column("worker_pid", sa.Integer),
         sa.Column("heartbeat_at", UTCDateTime),
         sa.Column("attempts", sa.Integer, nullable=False),
         sa.Column("error", sa.Text),
         sa.Column("created_at", UTCDateTime, nullable=False),
         sa.Column("started_at", UTCDateTime),
         sa.Column("ended_at", UTCDateTime),
         sa.Column("updated_at", UTCDateTime, nullable=False))

T0 = dt.datetime(2026, 11, 30, 12, 0, tzinfo=dt.UTC)
TOKENS = [{"id": 1, "name": "alice", "token_hash": "a" * 64, "is_admin": False,
           "created_at": T0},
          {"id": 2, "name": "admin", "token_hash": "b" * 64, "is_admin": True,
           "created_at": T0}]
STUDIES = [
    {"id": 1, "name": "done-study", "owner_id": 1, "status": "COMPLETED",
     "spec": {"name": "done-study", "budget": {"n_trials": 4}, "note": "ünïcode"},
     "n_trials": 4, "stop_requested": False, "claimed_by": None, "worker_pid": None,
     "heartbeat_at": T0, "attempts": 1, "error": None, "created_at": T0, "started_at": T0,
     "ended_at": T0 + dt.timedelta(minutes=5), "updated_at": T0},
    {"id": 2, "name": "queued-study", "owner_id": 2, "status": "QUEUED",
     "spec": {"name": "queued-study", "budget": {"n_trials": 8}}, "n_trials": 8,
     "stop_requested": True, "claimed_by": "host:1:abc", "worker_pid": 123, "heartbeat_at": None,
     "attempts": 0, "error": "one line", "created_at": T0, "started_at": None,
     "ended_at": None, "updated_at": T0}]


def _rows(engine, table: str) -> list[dict]:
    with engine.connect() as conn:
        t = sa.Table(table, sa.MetaData(), autoload_with=conn)
        columns = [c for c in t.c if c.name in LEGACY.tables[table].c]
        rows = conn.execute(sa.select(*columns).order_by(t.c.id)).mappings().all()
    typed = LEGACY.tables[table]
    out = []
    for row in rows:  # read back through the legacy types (UTC datetimes, JSON)
        out.append({k: (typed.c[k].type.process_result_value(v, engine.dialect)
                        if isinstance(typed.c[k].type, UTCDateTime) else v)
                    for k, v in row.items()})
    return out


def _schema_diff(engine) -> list:
    with engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={
            "include_name": lambda name, kind, _: kind != "table" or name.startswith("hpo_")})
        with warnings.catch_warnings():  # SQLite's: an index on lower(name) is not compared
            warnings.filterwarnings("ignore", "autogenerate skipping metadata-specified "
                                    "expression-based index", UserWarning)
            diff = compare_metadata(context, Base.metadata)
    return [d for d in diff if not (isinstance(d, tuple) and d[0] == "remove_table"
                                    and d[1].name == migrate.VERSION_TABLE)]


@pytest.fixture
def engine(db_url):
    engine = build_engine(db_url)
    yield engine
    engine.dispose()


def test_a_database_from_before_migrations_upgrades_with_nothing_lost(engine):
    LEGACY.create_all(engine)
    with engine.begin() as conn:
        conn.execute(LEGACY.tables["hpo_tokens"].insert(), TOKENS)
        conn.execute(LEGACY.tables["hpo_studies"].insert(), STUDIES)
    before_tokens, before_studies = _rows(engine, "hpo_tokens"), _rows(engine, "hpo_studies")
    assert migrate.current(engine) == migrate.BASELINE
    assert migrate.upgrade(engine) == (migrate.BASELINE, migrate.head())
    assert migrate.current(engine) == migrate.head()
    assert _rows(engine, "hpo_tokens") == before_tokens == TOKENS
    assert _rows(engine, "hpo_studies") == before_studies == STUDIES
    assert _schema_diff(engine) == []
    assert migrate.upgrade(engine) == (migrate.head(), migrate.head())  # a second run: no-op


def test_a_new_database_starts_at_the_newest_revision(engine):
    assert migrate.current(engine) is None
    migrate.prepare(engine, auto=False)  # a new database needs no permission
    assert migrate.current(engine) == migrate.head()
    assert _schema_diff(engine) == []


def test_the_app_makes_the_driver_lease_table_at_start_up(db_url, tmp_path):
    from service.app import create_app
    from service.settings import Settings

    create_app(Settings(database_url=db_url, results_dir=tmp_path, run_dispatcher=False))
    engine = build_engine(db_url)
    try:  # so that a delete need not ask whether it exists (hpo.lease.forget)
        assert sa.inspect(engine).has_table("hpo_leases")
    finally:
        engine.dispose()


def test_the_migrations_replayed_from_nothing_give_the_declared_tables(engine):
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "head")
    assert migrate.current(engine) == migrate.head()
    assert _schema_diff(engine) == []
    with engine.begin() as conn:  # and each migration goes back down
        command.downgrade(migrate._config(conn), "base")
        assert not sa.inspect(conn).has_table("hpo_studies")


def test_an_unknown_revision_is_refused(engine):
    migrate.prepare(engine, auto=True)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999'"))
    with pytest.raises(migrate.SchemaOutdated, match="revision 9999, which this version does "
                                                     "not know"):
        migrate.prepare(engine, auto=True)


def test_hpo_db_current_and_upgrade(sqlite_url, monkeypatch):
    import hpo.cli

    monkeypatch.setenv("HPO_DATABASE_URL", sqlite_url)
    engine = build_engine(sqlite_url)
    LEGACY.create_all(engine)
    runner = CliRunner()
    result = runner.invoke(hpo.cli.app, ["db", "current"])
    assert result.exit_code == 0, result.output
    assert result.output.split() == [migrate.BASELINE, "(newest:", f"{migrate.head()})", "in",
                                     sqlite_url]
    result = runner.invoke(hpo.cli.app, ["db", "upgrade"])
    assert result.exit_code == 0, result.output
    assert f"upgraded the service's tables from {migrate.BASELINE} to {migrate.head()}" \
        in " ".join(result.output.split())
    assert migrate.current(engine) == migrate.head()
    engine.dispose()


def test_an_outdated_database_is_refused_unless_auto_migration_is_on(engine):
    LEGACY.create_all(engine)
    assert migrate.head() != migrate.BASELINE  # a later revision exists to upgrade to
    with pytest.raises(migrate.SchemaOutdated) as caught:
        migrate.prepare(engine, auto=False)
    assert str(caught.value) == (
        f"the database's service tables are at revision {migrate.BASELINE}, this version "
        f"needs {migrate.head()}: run `hpo db upgrade` (same HPO_DATABASE_URL), or start with "
        f"HPO_AUTO_MIGRATE=true")
    assert migrate.current(engine) == migrate.BASELINE  # nothing was changed
    migrate.prepare(engine, auto=True)
    assert migrate.current(engine) == migrate.head()


def test_auto_migration_defaults_to_sqlite_only():
    from service.settings import Settings

    assert Settings.from_env({"HPO_DATABASE_URL": "sqlite:///x.db"}).migrate_on_start
    pg = {"HPO_DATABASE_URL": "postgresql+psycopg://u@h/db"}
    assert not Settings.from_env(pg).migrate_on_start
    assert Settings.from_env({**pg, "HPO_AUTO_MIGRATE": "true"}).migrate_on_start


def test_hpo_serve_refuses_an_outdated_schema_before_starting_ray(tmp_path, monkeypatch):
    from service import server as server_module
    from service.settings import Settings

    def no_ray(*_args, **_kwargs):
        raise AssertionError("the local Ray head was started on an outdated schema")

    url = f"sqlite:///{tmp_path / 'hpo.db'}"
    engine = build_engine(url)
    LEGACY.create_all(engine)
    engine.dispose()
    monkeypatch.setattr(server_module, "LocalRay", no_ray)
    settings = Settings(database_url=url, port=0, auto_migrate=False,
                        results_dir=tmp_path / "results")
    with pytest.raises(migrate.SchemaOutdated, match="run `hpo db upgrade`"):
        server_module.serve(settings)


def test_hpo_db_current_makes_no_database_where_there_is_none(tmp_path, monkeypatch):
    import hpo.cli

    missing = tmp_path / "elsewhere" / "hpo.db"
    monkeypatch.setenv("HPO_DATABASE_URL", f"sqlite:///{missing}")
    result = CliRunner().invoke(hpo.cli.app, ["db", "current"])
    assert result.exit_code == 0, result.output
    assert " ".join(result.output.split()) == (
        f"none: no database at {missing} (HPO_DATABASE_URL); newest: {migrate.head()}")
    assert not missing.exists() and not missing.parent.exists()


def test_hpo_db_current_refuses_a_revision_it_does_not_know(sqlite_url, monkeypatch):
    import hpo.cli

    monkeypatch.setenv("HPO_DATABASE_URL", sqlite_url)
    engine = build_engine(sqlite_url)
    migrate.prepare(engine, auto=True)
    with engine.begin() as conn:
        conn.execute(sa.text(f"UPDATE {migrate.VERSION_TABLE} SET version_num = '9999zz'"))
    engine.dispose()
    result = CliRunner().invoke(hpo.cli.app, ["db", "current"])
    assert result.exit_code == 1
    assert "revision 9999zz, which this version does not know" in result.output


def test_a_bad_hpo_port_is_one_line_naming_the_variable(monkeypatch):
    import hpo.cli

    monkeypatch.setenv("HPO_PORT", "abc")
    result = CliRunner().invoke(hpo.cli.app, ["serve"])
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert lines == ["error: HPO_PORT must be an integer, got 'abc'"], result.output


@pytest.mark.parametrize("clash", [False, True])
def test_revision_0006_makes_token_names_unique_whatever_their_case(engine, clash, caplog):
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "0005")
        names = ["alice", "Alice"] if clash else ["alice", "bob"]
        for i, name in enumerate(names):
            conn.execute(sa.text("INSERT INTO hpo_tokens (name, token_hash, is_admin, "
                                 "created_at, role) VALUES (:n, :h, false, :t, 'member')"),
                         {"n": name, "h": f"h{i}", "t": "2026-01-01 00:00:00"})
    with caplog.at_level("WARNING", logger="service.migrate"):
        migrate.prepare(engine, auto=True)  # a database with both names still upgrades
    assert migrate.current(engine) == migrate.head()
    assert ("differing only in case (alice)" in caplog.text) is clash
    insert = sa.text("INSERT INTO hpo_tokens (name, token_hash, is_admin, created_at, role) "
                     "VALUES ('ALICE', 'h9', false, '2026-01-01 00:00:00', 'member')")
    if clash:  # no index (SQLite's inspector cannot list one on an expression)
        with engine.begin() as conn:
            conn.execute(insert)
    else:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(insert)


@pytest.mark.parametrize("clash", [False, True])
def test_revision_0008_makes_study_names_unique_whatever_their_case(engine, clash, caplog):
    study = ("INSERT INTO hpo_studies (name, status, spec, n_trials, stop_requested, attempts, "
             "created_at, updated_at) VALUES (:n, 'COMPLETED', '{}', 1, false, 0, "
             "'2026-01-01 00:00:00', '2026-01-01 00:00:00')")
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "0007")
        for name in ["bob-s1", "BOB-S1"] if clash else ["bob-s1", "bob-s2"]:
            conn.execute(sa.text(study), {"n": name})
    with caplog.at_level("WARNING", logger="service.migrate"):
        migrate.prepare(engine, auto=True)  # a database with both names still upgrades
    assert migrate.current(engine) == migrate.head()
    assert ("study names differing only in case (bob-s1)" in caplog.text) is clash
    if clash:  # both kept, no index
        with engine.begin() as conn:
            conn.execute(sa.text(study), {"n": "Bob-S1"})
    else:
        with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
            conn.execute(sa.text(study), {"n": "Bob-S1"})


def test_a_first_start_committing_between_the_two_looks_is_not_taken_for_an_old_database(
        tmp_path, monkeypatch):
    """A helper's finding: ``current`` read the version table, then looked for the tables;
    a concurrent first start that committed both in between (they are committed together)
    made a new database look like one from before migrations (BASELINE), and ``hpo serve``
    refused it as outdated. The tables are looked at first now."""
    from alembic.migration import MigrationContext as Context

    url = f"sqlite:///{tmp_path / 'new.db'}"
    engine, other = build_engine(url), build_engine(url)
    real = Context.get_current_revision
    done = []

    def then_another_process_starts(self):
        revision = real(self)
        if not done:  # once: upgrade reads the revision too
            done.append(None)
            done[0] = migrate.upgrade(other)  # commits the tables and their version
        return revision

    monkeypatch.setattr(Context, "get_current_revision", then_another_process_starts)
    assert migrate.current(engine) in (None, migrate.head())
    monkeypatch.undo()
    assert done == [(None, migrate.head())] and migrate.current(engine) == migrate.head()
    engine.dispose()
    other.dispose()


@pytest.mark.parametrize("table, column_values", [
    ("hpo_studies", "status, spec, n_trials, stop_requested, attempts, created_at, updated_at) "
                    "VALUES (:n, 'COMPLETED', '{}', 1, false, 0, '2026-01-01 00:00:00', "
                    "'2026-01-01 00:00:00')"),
    ("hpo_tokens", "token_hash, is_admin, created_at, role) VALUES (:n, :n, false, "
                   "'2026-01-01 00:00:00', 'member')"),
])
def test_the_case_index_left_out_for_a_clash_is_made_once_the_clash_is_gone(
        engine, table, column_values, caplog):
    """A breaker: a database upgraded while it held bob-s1 and BOB-S1 never got the index,
    even after both were deleted, and concurrent creates then stored 8 case variants of
    one name (one result folder on a case-insensitive file system). The next start (or
    ``hpo db upgrade``) makes it once no clash remains."""
    insert = sa.text(f"INSERT INTO {table} (name, {column_values}")
    with engine.begin() as conn:
        command.upgrade(migrate._config(conn), "0005")
        for name in ["bob-s1", "BOB-S1"]:
            conn.execute(insert, {"n": name})
    migrate.prepare(engine, auto=True)  # 0006 and 0008 leave the index out
    with caplog.at_level("WARNING", logger="service.migrate"):
        migrate.prepare(engine, auto=True)  # at head: still a clash, said again
    assert f"{table}: names differing only in case (bob-s1)" in caplog.text
    with engine.begin() as conn:
        conn.execute(sa.text(f"DELETE FROM {table} WHERE name = 'BOB-S1'"))
    migrate.prepare(engine, auto=True)  # at head, no clash: the index is made
    with pytest.raises(sa.exc.IntegrityError), engine.begin() as conn:
        conn.execute(insert, {"n": "Bob-S1"})
    migrate.prepare(engine, auto=True)  # and found the next time


def test_the_case_index_is_looked_for_in_the_databases_own_schema(pg_url, pg_server):
    """On PostgreSQL the index was looked for by name in every schema: another schema's
    (another deployment in the same database; another test's, which is how it showed)
    hid this one's missing index, so it was never made."""
    import uuid

    other = f"other_{uuid.uuid4().hex[:12]}"
    admin, engine = sa.create_engine(pg_server), build_engine(pg_url)
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {other}"))
            for table, index in migrate.CASE_INDEXES.items():
                conn.execute(sa.text(f"CREATE TABLE {other}.{table} (name text)"))
                conn.execute(sa.text(f"CREATE UNIQUE INDEX {index} ON {other}.{table} "
                                     f"(lower(name))"))
        migrate.prepare(engine, auto=True)  # a new database: made at head, indexes included
        with engine.begin() as conn:  # as after 0006/0008 met a clash, since deleted
            for index in migrate.CASE_INDEXES.values():
                conn.execute(sa.text(f"DROP INDEX {index}"))
        migrate.prepare(engine, auto=True)
        with engine.connect() as conn:
            own = set(conn.execute(sa.text(
                "SELECT indexname FROM pg_indexes WHERE schemaname = current_schema()"))
                .scalars())
        assert set(migrate.CASE_INDEXES.values()) <= own
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(sa.text(f"DROP SCHEMA {other} CASCADE"))
        admin.dispose()


def test_the_case_index_is_found_beside_its_table_when_the_search_path_has_several_schemas(
        pg_server):
    """The breaker: with search_path ``s1, s2`` and the tables made in s2 (s1 did not exist
    yet), s1 made later became current_schema(); the index, looked for there, was missed,
    and CREATE INDEX then failed (it exists in s2) at every start."""
    import uuid

    first, second = (f"p{k}_{uuid.uuid4().hex[:10]}" for k in (1, 2))
    admin = sa.create_engine(pg_server)
    sep = "&" if "?" in pg_server else "?"
    engine = build_engine(f"{pg_server}{sep}options=-csearch_path%3D{first},{second}")
    try:
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {second}"))
        migrate.prepare(engine, auto=True)  # the tables and indexes go to the second
        with admin.begin() as conn:
            conn.execute(sa.text(f"CREATE SCHEMA {first}"))
        engine.dispose()
        migrate.prepare(engine, auto=False)  # a start: found, nothing made twice
        with engine.connect() as conn:
            places = conn.execute(sa.text(
                "SELECT schemaname, indexname FROM pg_indexes WHERE indexname LIKE "
                "'ix_hpo_%_name_lower' AND schemaname IN (:a, :b)"),
                {"a": first, "b": second}).all()
        assert sorted(places) == sorted((second, i) for i in migrate.CASE_INDEXES.values())
    finally:
        engine.dispose()
        with admin.begin() as conn:
            for schema in (first, second):
                conn.execute(sa.text(f"DROP SCHEMA IF EXISTS {schema} CASCADE"))
        admin.dispose()
