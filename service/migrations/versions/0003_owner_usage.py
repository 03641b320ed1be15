"""hpo_owner_usage: device-seconds of deleted studies by owner (issue 14.2's counter).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hpo_owner_usage",
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("device_seconds", sa.Float(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hpo_owner_usage")
