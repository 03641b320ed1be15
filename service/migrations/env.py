"""Alembic's environment for the service's tables: run on the connection that
:mod:`service.migrate` hands over (``config.attributes["connection"]``), in one transaction,
with the version kept in ``hpo_alembic_version`` (Optuna's tables keep theirs in
``alembic_version``)."""

from alembic import context

from service.db import Base
from service.migrate import VERSION_TABLE

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=Base.metadata,
                  version_table=VERSION_TABLE, render_as_batch=True,
                  include_name=lambda name, kind, _: kind != "table" or name.startswith("hpo_"))
with context.begin_transaction():
    context.run_migrations()
