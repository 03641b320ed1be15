"""Alembic migrations of the service's own tables (``hpo_*``); see :mod:`service.migrate`.
Optuna versions its own tables (its ``alembic_version``); ours use ``hpo_alembic_version``."""
