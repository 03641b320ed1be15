"""The service's tables as the first released version made them (hpo_tokens, hpo_studies).

Revision ID: 0001
Revises:
"""

import sqlalchemy as sa
from alembic import op

from service.db import UTCDateTime

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hpo_tokens",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("token_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("is_admin", sa.Boolean(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "hpo_studies",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("name", sa.String(64), nullable=False, unique=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("hpo_tokens.id"), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("spec", sa.JSON(), nullable=False),
        sa.Column("n_trials", sa.Integer(), nullable=False),
        sa.Column("stop_requested", sa.Boolean(), nullable=False),
        sa.Column("claimed_by", sa.String(200), nullable=True),
        sa.Column("worker_pid", sa.Integer(), nullable=True),
        sa.Column("heartbeat_at", UTCDateTime(), nullable=True),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=True),
        sa.Column("ended_at", UTCDateTime(), nullable=True),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_index("ix_hpo_studies_owner_id", "hpo_studies", ["owner_id"])
    op.create_index("ix_hpo_studies_status", "hpo_studies", ["status"])


def downgrade() -> None:
    op.drop_table("hpo_studies")
    op.drop_table("hpo_tokens")
