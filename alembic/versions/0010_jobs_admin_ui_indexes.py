"""jobs: indexes that keep the admin UI's pages bounded on millions of rows

- ``ix_jobs_actor_created (actor, created_at)`` and ``ix_jobs_status_created (status,
  created_at)``: the jobs page filtered by actor or status (newest first, keyset pages)
  and its capped counts walk one index range, however rare the actor or status.
- ``ix_jobs_identity_key (identity_key, created_at)``, partial on rows with a key: the
  identity-key filter (``ix_jobs_identity`` leads with the actor).
- ``ix_jobs_actor_finished (actor, finished_at)``, partial on finished rows, covering
  ``status, started_at, error_class`` on Postgres: the actors page's per-actor statistics
  read an index-only range of each actor's newest finishes.
- ``ix_jobs_running_worker (locked_by)``, partial on running rows: the workers page
  counts each worker's running jobs (capped) without reading every running row.
- ``ix_jobs_finished`` (Postgres) now covers ``status, queue``: the throughput chart and
  a queue's drain rate are index-only range scans of the window.

No table rewrite. ``CREATE INDEX`` blocks writes to ``jobs`` while it builds: on a large
Postgres table, create them beforehand with ``CREATE INDEX CONCURRENTLY`` under the same
names and this migration leaves them be (``IF NOT EXISTS``; for ``ix_jobs_finished``,
build the covering one as ``ix_jobs_finished_v2`` and rename it after dropping the old).

Revision ID: 0010
Revises: 0008
Create Date: 2026-12-02 01:00:00.000000
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
# Issue 24's number; the coordinator re-chains migrations at merge time.
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_FINISHED = "finished_at IS NOT NULL"


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index(
            "ix_jobs_actor_created", ["actor", "created_at"], unique=False, if_not_exists=True
        )
        batch_op.create_index(
            "ix_jobs_status_created", ["status", "created_at"], unique=False, if_not_exists=True
        )
        batch_op.create_index(
            "ix_jobs_identity_key",
            ["identity_key", "created_at"],
            unique=False,
            postgresql_where=sa.text("identity_key IS NOT NULL"),
            sqlite_where=sa.text("identity_key IS NOT NULL"),
            if_not_exists=True,
        )
        batch_op.create_index(
            "ix_jobs_actor_finished",
            ["actor", "finished_at"],
            unique=False,
            postgresql_include=["status", "started_at", "error_class"],
            postgresql_where=sa.text(_FINISHED),
            sqlite_where=sa.text(_FINISHED),
            if_not_exists=True,
        )
        batch_op.create_index(
            "ix_jobs_running_worker",
            ["locked_by"],
            unique=False,
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
            if_not_exists=True,
        )
    if op.get_bind().dialect.name == "postgresql":
        # Same name and key, now covering (SQLite has no INCLUDE: its index stays).
        op.drop_index("ix_jobs_finished", table_name="jobs")
        op.create_index(
            "ix_jobs_finished",
            "jobs",
            ["finished_at"],
            unique=False,
            postgresql_include=["status", "queue"],
            postgresql_where=sa.text(_FINISHED),
        )


def downgrade() -> None:
    if op.get_bind().dialect.name == "postgresql":
        op.drop_index("ix_jobs_finished", table_name="jobs")
        op.create_index(
            "ix_jobs_finished",
            "jobs",
            ["finished_at"],
            unique=False,
            postgresql_where=sa.text(_FINISHED),
        )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index("ix_jobs_running_worker")
        batch_op.drop_index("ix_jobs_actor_finished")
        batch_op.drop_index("ix_jobs_identity_key")
        batch_op.drop_index("ix_jobs_status_created")
        batch_op.drop_index("ix_jobs_actor_created")
