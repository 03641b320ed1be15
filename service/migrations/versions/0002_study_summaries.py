"""hpo_study_summaries: each study's summary, kept current by its driver (issue 13.5).

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

from service.db import UTCDateTime

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    if sa.inspect(op.get_bind()).has_table("hpo_study_summaries"):
        return  # made by create_all before this revision was stamped (a development build)
    op.create_table(
        "hpo_study_summaries",
        sa.Column("study_id", sa.Integer(),
                  sa.ForeignKey("hpo_studies.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("hpo_study_summaries")
