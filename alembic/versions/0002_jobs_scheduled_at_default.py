"""jobs.scheduled_at defaults to the transaction's timestamp (Postgres)

A row written without ``scheduled_at`` runs now: ``created_at`` and ``updated_at``
default to the same reading. The bulk COPY of ``enqueue_many`` leaves all three to their
defaults, so it needs no clock reading before it (see ``docs/jobs-and-clients.md``).

Postgres only. SQLite cannot change a column's default without rebuilding the table, and
a rebuild there would drop the old ``jobs`` table under ``PRAGMA foreign_keys = ON`` (which
cascades to ``job_attempts``) and recreate the dispatch index without its ``DESC``.
Nothing on SQLite writes a job without ``scheduled_at``, so its tables keep no default.

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01 11:05:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

import taskq.db.types

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def _on_postgres() -> bool:
    return op.get_context().dialect.name == "postgresql"


def upgrade() -> None:
    if _on_postgres():
        op.alter_column(
            "jobs",
            "scheduled_at",
            existing_type=taskq.db.types.UTCDateTime(),
            existing_nullable=False,
            server_default=sa.text("CURRENT_TIMESTAMP"),
        )


def downgrade() -> None:
    if _on_postgres():
        op.alter_column(
            "jobs",
            "scheduled_at",
            existing_type=taskq.db.types.UTCDateTime(),
            existing_nullable=False,
            server_default=None,
        )
