"""Sharing one service (issue 15): token roles, expiry, last use and revocation; per-owner
quotas, trial slots and usage events; a study's waiting reason; the audit table.

Revision ID: 0004
Revises: 0003
"""

import sqlalchemy as sa
from alembic import op

from service.db import UTCDateTime

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("hpo_tokens") as batch:
        batch.add_column(sa.Column("role", sa.String(16), nullable=False,
                                   server_default="member"))
        batch.add_column(sa.Column("expires_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("last_used_at", UTCDateTime(), nullable=True))
        batch.add_column(sa.Column("revoked_at", UTCDateTime(), nullable=True))
    tokens = sa.table("hpo_tokens", sa.column("role", sa.String), sa.column("is_admin", sa.Boolean))
    op.execute(tokens.update().where(tokens.c.is_admin == sa.true()).values(role="admin"))
    with op.batch_alter_table("hpo_studies") as batch:
        batch.add_column(sa.Column("waiting_for", sa.String(200), nullable=True))
    op.create_table(
        "hpo_quotas",
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                  primary_key=True),
        sa.Column("max_running_trials", sa.Integer(), nullable=True),
        sa.Column("max_gpus", sa.Float(), nullable=True),
        sa.Column("device_seconds_per_day", sa.Float(), nullable=True),
        sa.Column("device_seconds_total", sa.Float(), nullable=True),
    )
    op.create_table(
        "hpo_trial_slots",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                  nullable=True, index=True),
        sa.Column("study_id", sa.Integer(), sa.ForeignKey("hpo_studies.id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("trial", sa.String(200), nullable=False),
        sa.Column("gpus", sa.Float(), nullable=False),
        sa.Column("devices", sa.Float(), nullable=False),
        sa.Column("started_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "hpo_usage_events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("owner_id", sa.Integer(), sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                  nullable=True, index=True),
        sa.Column("ended_at", UTCDateTime(), nullable=False, index=True),
        sa.Column("device_seconds", sa.Float(), nullable=False),
    )
    op.create_table(
        "hpo_audit",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", UTCDateTime(), nullable=False, index=True),
        sa.Column("actor", sa.String(64), nullable=False),
        sa.Column("action", sa.String(32), nullable=False),
        sa.Column("target", sa.String(200), nullable=False),
        sa.Column("address", sa.String(64), nullable=True),
        sa.Column("detail", sa.JSON(), nullable=True),
    )


def downgrade() -> None:
    op.drop_table("hpo_audit")
    op.drop_table("hpo_usage_events")
    op.drop_table("hpo_trial_slots")
    op.drop_table("hpo_quotas")
    with op.batch_alter_table("hpo_studies") as batch:
        batch.drop_column("waiting_for")
    with op.batch_alter_table("hpo_tokens") as batch:
        batch.drop_column("revoked_at")
        batch.drop_column("last_used_at")
        batch.drop_column("expires_at")
        batch.drop_column("role")
