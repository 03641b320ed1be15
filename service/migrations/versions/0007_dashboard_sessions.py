"""Dashboard sessions: the dashboard's cookie holds a session id of its own, no longer the
API token (which any listener on another port of the host got with it: cookies are not
bound to a port, RFC 6265 section 8.5). One row per login, by the id's SHA-256.

Revision ID: 0007
Revises: 0006
"""

import sqlalchemy as sa
from alembic import op

from service.db import UTCDateTime

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "hpo_dashboard_sessions",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("session_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("token_id", sa.Integer(), sa.ForeignKey("hpo_tokens.id", ondelete="CASCADE"),
                  nullable=False, index=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("expires_at", UTCDateTime(), nullable=False, index=True),
    )


def downgrade() -> None:
    op.drop_table("hpo_dashboard_sessions")
