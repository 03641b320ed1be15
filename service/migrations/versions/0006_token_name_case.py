"""Token names unique whatever their case (``Alice`` beside ``alice`` read as one owner in
study rows and audit rows): a unique index on ``lower(name)``, which also settles two
concurrent creates that the service's own check (``service.auth.create_token``) lets
through together.

A database that already holds two names differing only in case keeps them (a token's row
stays after its revocation: its studies name it) and gets no index; the service's check
still refuses new ones. The upgrade says so in the log.

Revision ID: 0006
Revises: 0005
"""

import logging

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

INDEX = "ix_hpo_tokens_name_lower"


def upgrade() -> None:
    clashes = op.get_bind().execute(sa.text(
        "SELECT lower(name) FROM hpo_tokens GROUP BY lower(name) HAVING count(*) > 1")).all()
    if clashes:
        logging.getLogger("service.migrate").warning(
            "token names differing only in case (%s): no unique index on lower(name); new "
            "such names are still refused", ", ".join(sorted(c[0] for c in clashes)))
        return
    op.create_index(INDEX, "hpo_tokens", [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.execute(sa.text(f"DROP INDEX IF EXISTS {INDEX}"))
