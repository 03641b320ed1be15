"""Study-level stopping (issue 18.3): why a study ended before its trial budget.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hpo_studies") as batch:
        batch.add_column(sa.Column("stop_reason", sa.Text(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("hpo_studies") as batch:
        batch.drop_column("stop_reason")
