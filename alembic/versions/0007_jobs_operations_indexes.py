"""jobs: indexes for the operations layer (list pages, purge)

``ix_jobs_created (created_at, id)`` serves ``tq.jobs.list`` (newest first, keyset
pagination), its time-range filters and capped counts, ``ix_jobs_queue_created`` the
same per queue; ``ix_jobs_finished (finished_at)``,
partial on finished rows, serves ``tq.jobs.purge``; ``ix_jobs_tags`` (GIN on Postgres)
serves tag filters (``jsonb @>``; partial: tagged rows only) and ``ix_jobs_error_class`` (partial, rows with an
error class) error-class filters. No table rewrite. ``CREATE INDEX`` blocks writes
to ``jobs`` while it builds: on a large Postgres table, create both beforehand with
``CREATE INDEX CONCURRENTLY`` under the same names and this migration leaves them be
(``IF NOT EXISTS``).

Revision ID: 0007
Revises: 0002
Create Date: 2026-12-01 22:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_created", ["created_at", "id"], unique=False, if_not_exists=True
        )
        batch_op.create_index(
            "ix_jobs_queue_created", ["queue", "created_at"], unique=False, if_not_exists=True
        )
        batch_op.create_index(
            "ix_jobs_tags",
            ["tags"],
            unique=False,
            postgresql_using="gin",
            postgresql_where=sa.text("tags <> '[]'"),
            sqlite_where=sa.text("tags <> '[]'"),
            if_not_exists=True,
        )
        batch_op.create_index(
            "ix_jobs_error_class",
            ["error_class", "created_at"],
            unique=False,
            postgresql_where=sa.text("error_class IS NOT NULL"),
            sqlite_where=sa.text("error_class IS NOT NULL"),
            if_not_exists=True,
        )
        batch_op.create_index(
            "ix_jobs_finished",
            ["finished_at"],
            unique=False,
            postgresql_where=sa.text("finished_at IS NOT NULL"),
            sqlite_where=sa.text("finished_at IS NOT NULL"),
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_finished")
        batch_op.drop_index("ix_jobs_error_class")
        batch_op.drop_index("ix_jobs_tags")
        batch_op.drop_index("ix_jobs_queue_created")
        batch_op.drop_index("ix_jobs_created")
