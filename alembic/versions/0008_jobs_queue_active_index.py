"""jobs: ix_jobs_queue_active (queue, status), partial on active rows, for the admin UI

The overview's and queues page's per-queue counts of pending, scheduled and running jobs
(capped) read it index-only. Active rows only, so finished history costs it nothing. No
table rewrite. ``CREATE INDEX`` blocks writes to ``jobs`` while it builds: on a large
Postgres table, create it beforehand with ``CREATE INDEX CONCURRENTLY`` under the same
name and this migration leaves it be (``IF NOT EXISTS``).

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-01 23:25:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
# Chained after 0007 (the operations indexes this branch builds on), so the branch has one
# head; the coordinator re-chains migrations at merge time.
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_ACTIVE = "status IN ('pending', 'scheduled', 'running')"


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_queue_active",
            ["queue", "status"],
            unique=False,
            postgresql_where=sa.text(_ACTIVE),
            sqlite_where=sa.text(_ACTIVE),
            if_not_exists=True,
        )


def downgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_queue_active")
