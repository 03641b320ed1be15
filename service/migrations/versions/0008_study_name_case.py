"""Study names unique whatever their case: a study's result files are kept in
``<HPO_RESULTS_DIR>/<name>``, and on a case-insensitive file system (macOS, Windows, many
network shares) ``bob-s1`` and ``BOB-S1`` are one folder: one owner's trials would write
into another's, and deleting either study would delete both's files. A unique index on
``lower(name)``, which also settles two concurrent creates that the service's own check
(``service.studies.StudyService._refuse_case_variant``) lets through together.

A database that already holds two names differing only in case keeps them and gets no
index; the service's check still refuses new ones. The upgrade says so in the log (as
revision 0006 does for token names).

Revision ID: 0008
Revises: 0007
"""

import logging

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

INDEX = "ix_hpo_studies_name_lower"


def upgrade() -> None:
    clashes = op.get_bind().execute(sa.text(
        "SELECT lower(name) FROM hpo_studies GROUP BY lower(name) HAVING count(*) > 1")).all()
    if clashes:
        logging.getLogger("service.migrate").warning(
            "study names differing only in case (%s): no unique index on lower(name); new "
            "such names are still refused", ", ".join(sorted(c[0] for c in clashes)))
        return
    op.create_index(INDEX, "hpo_studies", [sa.text("lower(name)")], unique=True)


def downgrade() -> None:
    op.execute(sa.text(f"DROP INDEX IF EXISTS {INDEX}"))
