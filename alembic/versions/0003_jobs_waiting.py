"""jobs.waiting_on and jobs.denials: what parked a job, and how often

A job denied by a rate limit, a reservation or a queue cap is parked (``scheduled``)
until it can be admitted, with no attempt counted. ``waiting_on`` names the primitive
that parked it last (cleared when it is claimed again) and ``denials`` counts the parks.
``ix_jobs_waiting`` finds the jobs parked on a reservation when one of its slots is
released.

Both columns are added with constant defaults (no table rewrite on Postgres 11+, a plain
``ALTER TABLE ... ADD COLUMN`` on SQLite, never a batch rebuild); the partial index covers
only parked rows.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-01 22:10:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_WHERE = "status = 'scheduled' AND waiting_on IS NOT NULL"


def upgrade() -> None:
    op.add_column("jobs", sa.Column("waiting_on", sa.String(length=200), nullable=True))
    op.add_column("jobs", sa.Column("denials", sa.Integer(), server_default="0", nullable=False))
    op.create_index(
        "ix_jobs_waiting",
        "jobs",
        ["waiting_on", sa.literal_column("priority DESC"), "scheduled_at"],
        unique=False,
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )


def downgrade() -> None:
    op.drop_index(
        "ix_jobs_waiting",
        table_name="jobs",
        postgresql_where=sa.text(_WHERE),
        sqlite_where=sa.text(_WHERE),
    )
    # SQLite >= 3.35 drops a column in place (no batch rebuild, which would cascade).
    op.drop_column("jobs", "denials")
    op.drop_column("jobs", "waiting_on")
