"""cron_schedules: enqueue options, missed-tick policy, last tick's outcome

Adds nullable columns and NOT NULL columns with constant defaults only, so the change
is a catalogue update on Postgres (no table rewrite) and plain ``ADD COLUMN`` on SQLite.

Revision ID: 0006
Revises: 0002
Create Date: 2026-12-01 22:30:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import taskq.db.types

revision: str = "0006"
down_revision: str | None = "0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_JSON = sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql")


def _columns() -> list[sa.Column[object]]:
    return [
        sa.Column("jitter_s", sa.Float(), nullable=True),
        sa.Column("missed", sa.String(length=8), server_default="latest", nullable=False),
        sa.Column("max_catchup", sa.Integer(), server_default="10", nullable=False),
        sa.Column("priority", sa.SmallInteger(), nullable=True),
        sa.Column("tags", _JSON, nullable=True),
        sa.Column("identity_key", sa.String(length=200), nullable=True),
        sa.Column("origin", sa.String(length=8), server_default="api", nullable=False),
        sa.Column("last_tick_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("last_outcome", sa.String(length=32), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("enqueued_count", sa.Integer(), server_default="0", nullable=False),
        sa.Column("refused_count", sa.Integer(), server_default="0", nullable=False),
    ]


def upgrade() -> None:
    for column in _columns():
        op.add_column("cron_schedules", column)


def downgrade() -> None:
    # SQLite >= 3.35 drops a column in place: no batch rebuild, which would need a live
    # connection to reflect the table (``taskq migrate sql`` prints DDL without one).
    for column in reversed(_columns()):
        op.drop_column("cron_schedules", column.name)
