"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 10:18:10.131632
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

import taskq.db.types

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:

    op.create_table(
        "actor_config",
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), server_default="default", nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("max_pending", sa.Integer(), nullable=True),
        sa.Column("result_ttl_s", sa.Float(), nullable=True),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            server_default="{}",
            nullable=False,
        ),
        sa.Column(
            "created_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "max_concurrent IS NULL OR max_concurrent >= 0",
            name=op.f("ck_actor_config_max_concurrent"),
        ),
        sa.CheckConstraint(
            "max_pending IS NULL OR max_pending >= 0", name=op.f("ck_actor_config_max_pending")
        ),
        sa.PrimaryKeyConstraint("actor", name=op.f("pk_actor_config")),
    )
    with op.batch_alter_table("actor_config", schema=None) as batch_op:
        batch_op.create_index("ix_actor_config_queue", ["queue"], unique=False)

    op.create_table(
        "cron_schedules",
        sa.Column("id", sa.String(length=200), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), nullable=True),
        sa.Column("cron_expression", sa.String(length=255), nullable=False),
        sa.Column("timezone", sa.String(length=64), server_default="UTC", nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            server_default="{}",
            nullable=False,
        ),
        sa.Column("enabled", sa.Boolean(), server_default=sa.text("true"), nullable=False),
        sa.Column("next_run_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("last_run_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("last_job_id", sa.Uuid(), nullable=True),
        sa.Column(
            "created_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_cron_schedules")),
    )
    with op.batch_alter_table("cron_schedules", schema=None) as batch_op:
        batch_op.create_index("ix_cron_schedules_actor", ["actor"], unique=False)
        batch_op.create_index("ix_cron_schedules_due", ["enabled", "next_run_at"], unique=False)

    op.create_table(
        "jobs",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("actor", sa.String(length=200), nullable=False),
        sa.Column("queue", sa.String(length=200), server_default="default", nullable=False),
        sa.Column("status", sa.String(length=16), server_default="pending", nullable=False),
        sa.Column(
            "payload",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=False,
        ),
        sa.Column(
            "result",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("priority", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("attempt", sa.Integer(), server_default="0", nullable=False),
        sa.Column("budget_used", sa.Integer(), server_default="0", nullable=False),
        sa.Column("max_attempts", sa.Integer(), nullable=True),
        sa.Column("scheduled_at", taskq.db.types.UTCDateTime(), nullable=False),
        sa.Column("identity_key", sa.String(length=200), nullable=True),
        sa.Column("idempotency_key", sa.String(length=200), nullable=True),
        sa.Column("singleton", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "tags",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            server_default="[]",
            nullable=False,
        ),
        sa.Column(
            "metadata",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            server_default="{}",
            nullable=False,
        ),
        sa.Column("error_class", sa.String(length=200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("locked_by", sa.Uuid(), nullable=True),
        sa.Column("lease_expires_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("cancel_phase", sa.SmallInteger(), server_default="0", nullable=False),
        sa.Column("cancel_requested_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column(
            "progress",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("progress_seq", sa.BigInteger(), server_default="0", nullable=False),
        sa.Column(
            "trace_context",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            nullable=True,
        ),
        sa.Column("start_to_close_s", sa.Float(), nullable=True),
        sa.Column("schedule_to_close_s", sa.Float(), nullable=True),
        sa.Column("deadline_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("result_expires_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("parent_job_id", sa.Uuid(), nullable=True),
        sa.Column(
            "created_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("started_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("finished_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.CheckConstraint(
            "status IN ('pending', 'scheduled', 'running', 'succeeded', 'failed', 'cancelled', 'crashed', 'abandoned')",
            name=op.f("ck_jobs_status"),
        ),
        sa.CheckConstraint("attempt >= 0 AND budget_used >= 0", name=op.f("ck_jobs_attempt")),
        sa.CheckConstraint("cancel_phase BETWEEN 0 AND 3", name=op.f("ck_jobs_cancel_phase")),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_jobs")),
    )
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.create_index("ix_jobs_actor_status", ["actor", "status"], unique=False)
        batch_op.create_index(
            "ix_jobs_dispatch",
            ["queue", sa.literal_column("priority DESC"), "scheduled_at"],
            unique=False,
            postgresql_where=sa.text("status IN ('pending', 'scheduled')"),
            sqlite_where=sa.text("status IN ('pending', 'scheduled')"),
        )
        batch_op.create_index(
            "ix_jobs_identity",
            ["actor", "identity_key", "created_at"],
            unique=False,
            postgresql_where=sa.text("identity_key IS NOT NULL"),
            sqlite_where=sa.text("identity_key IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_jobs_lease",
            ["lease_expires_at"],
            unique=False,
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.create_index(
            "ix_jobs_parent",
            ["parent_job_id"],
            unique=False,
            postgresql_where=sa.text("parent_job_id IS NOT NULL"),
            sqlite_where=sa.text("parent_job_id IS NOT NULL"),
        )
        batch_op.create_index(
            "ix_jobs_result_expiry",
            ["result_expires_at"],
            unique=False,
            postgresql_where=sa.text("result_expires_at IS NOT NULL"),
            sqlite_where=sa.text("result_expires_at IS NOT NULL"),
        )
        batch_op.create_index(
            "uq_jobs_idempotency",
            ["actor", "idempotency_key"],
            unique=True,
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        )
        batch_op.create_index(
            "uq_jobs_singleton_active",
            ["actor"],
            unique=True,
            postgresql_where=sa.text("singleton AND status IN ('pending', 'scheduled', 'running')"),
            sqlite_where=sa.text("singleton AND status IN ('pending', 'scheduled', 'running')"),
        )

    op.create_table(
        "leader_leases",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("holder", sa.Uuid(), nullable=False),
        sa.Column("acquired_at", taskq.db.types.UTCDateTime(), nullable=False),
        sa.Column("expires_at", taskq.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_leader_leases")),
    )
    op.create_table(
        "queues",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("mode", sa.String(length=16), server_default="fifo", nullable=False),
        sa.Column("max_concurrent", sa.Integer(), nullable=True),
        sa.Column("paused", sa.Boolean(), server_default=sa.text("false"), nullable=False),
        sa.Column(
            "created_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.CheckConstraint("mode IN ('fifo', 'fair')", name=op.f("ck_queues_mode")),
        sa.CheckConstraint(
            "max_concurrent IS NULL OR max_concurrent >= 1", name=op.f("ck_queues_max_concurrent")
        ),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_queues")),
    )
    op.create_table(
        "rate_limit_buckets",
        sa.Column("bucket_name", sa.String(length=200), nullable=False),
        sa.Column("kind", sa.String(length=16), nullable=False),
        sa.Column("capacity", sa.Float(), nullable=False),
        sa.Column("refill_per_second", sa.Float(), server_default="0", nullable=False),
        sa.Column("window_s", sa.Float(), nullable=True),
        sa.Column("tokens", sa.Float(), nullable=True),
        sa.Column("tat", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column(
            "config",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            server_default="{}",
            nullable=False,
        ),
        sa.Column(
            "updated_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.CheckConstraint(
            "kind IN ('token_bucket', 'gcra', 'log')", name=op.f("ck_rate_limit_buckets_kind")
        ),
        sa.PrimaryKeyConstraint("bucket_name", name=op.f("pk_rate_limit_buckets")),
    )
    op.create_table(
        "rate_limit_window_entries",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("bucket_name", sa.String(length=200), nullable=False),
        sa.Column("request_id", sa.String(length=64), nullable=False),
        sa.Column("weight", sa.Float(), server_default="1", nullable=False),
        sa.Column("created_at", taskq.db.types.UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_rate_limit_window_entries")),
    )
    with op.batch_alter_table("rate_limit_window_entries", schema=None) as batch_op:
        batch_op.create_index(
            "ix_rate_limit_window_entries_bucket", ["bucket_name", "created_at"], unique=False
        )
        batch_op.create_index(
            "uq_rate_limit_window_entries_request", ["bucket_name", "request_id"], unique=True
        )

    op.create_table(
        "reservation_slots",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("slot_index", sa.Integer(), nullable=False),
        sa.Column("job_id", sa.Uuid(), nullable=True),
        sa.Column("worker_id", sa.Uuid(), nullable=True),
        sa.Column("acquired_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.Column("lease_expires_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.CheckConstraint("slot_index >= 0", name=op.f("ck_reservation_slots_slot_index")),
        sa.PrimaryKeyConstraint("name", "slot_index", name=op.f("pk_reservation_slots")),
    )
    with op.batch_alter_table("reservation_slots", schema=None) as batch_op:
        batch_op.create_index("ix_reservation_slots_lease", ["lease_expires_at"], unique=False)

    op.create_table(
        "workers",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column(
            "queues",
            sa.JSON().with_variant(postgresql.JSONB(astext_type=sa.Text()), "postgresql"),
            server_default="[]",
            nullable=False,
        ),
        sa.Column("concurrency", sa.Integer(), nullable=False),
        sa.Column("status", sa.String(length=16), server_default="running", nullable=False),
        sa.Column("version", sa.String(length=32), nullable=True),
        sa.Column(
            "started_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("last_heartbeat_at", taskq.db.types.UTCDateTime(), nullable=False),
        sa.Column("stopped_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.CheckConstraint(
            "status IN ('running', 'stopping', 'stopped', 'isolated')",
            name=op.f("ck_workers_status"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_workers")),
    )
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.create_index("ix_workers_heartbeat", ["last_heartbeat_at"], unique=False)

    op.create_table(
        "job_attempts",
        sa.Column(
            "id",
            sa.BigInteger().with_variant(sa.Integer(), "sqlite"),
            autoincrement=True,
            nullable=False,
        ),
        sa.Column("job_id", sa.Uuid(), nullable=False),
        sa.Column("attempt", sa.Integer(), nullable=False),
        sa.Column("worker_id", sa.Uuid(), nullable=True),
        sa.Column("outcome", sa.String(length=16), server_default="running", nullable=False),
        sa.Column("error_class", sa.String(length=200), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column(
            "started_at",
            taskq.db.types.UTCDateTime(),
            server_default=sa.text("CURRENT_TIMESTAMP"),
            nullable=False,
        ),
        sa.Column("finished_at", taskq.db.types.UTCDateTime(), nullable=True),
        sa.CheckConstraint(
            "outcome IN ('running', 'succeeded', 'failed', 'retried', 'snoozed', 'cancelled', 'crashed', 'abandoned')",
            name=op.f("ck_job_attempts_outcome"),
        ),
        sa.ForeignKeyConstraint(
            ["job_id"], ["jobs.id"], name=op.f("fk_job_attempts_job_id_jobs"), ondelete="CASCADE"
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_job_attempts")),
    )
    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.create_index("ix_job_attempts_job", ["job_id", "attempt"], unique=False)


def downgrade() -> None:

    with op.batch_alter_table("job_attempts", schema=None) as batch_op:
        batch_op.drop_index("ix_job_attempts_job")

    op.drop_table("job_attempts")
    with op.batch_alter_table("workers", schema=None) as batch_op:
        batch_op.drop_index("ix_workers_heartbeat")

    op.drop_table("workers")
    with op.batch_alter_table("reservation_slots", schema=None) as batch_op:
        batch_op.drop_index("ix_reservation_slots_lease")

    op.drop_table("reservation_slots")
    with op.batch_alter_table("rate_limit_window_entries", schema=None) as batch_op:
        batch_op.drop_index("uq_rate_limit_window_entries_request")
        batch_op.drop_index("ix_rate_limit_window_entries_bucket")

    op.drop_table("rate_limit_window_entries")
    op.drop_table("rate_limit_buckets")
    op.drop_table("queues")
    op.drop_table("leader_leases")
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_index(
            "uq_jobs_singleton_active",
            postgresql_where=sa.text("singleton AND status IN ('pending', 'scheduled', 'running')"),
            sqlite_where=sa.text("singleton AND status IN ('pending', 'scheduled', 'running')"),
        )
        batch_op.drop_index(
            "uq_jobs_idempotency",
            postgresql_where=sa.text("idempotency_key IS NOT NULL"),
            sqlite_where=sa.text("idempotency_key IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_jobs_result_expiry",
            postgresql_where=sa.text("result_expires_at IS NOT NULL"),
            sqlite_where=sa.text("result_expires_at IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_jobs_parent",
            postgresql_where=sa.text("parent_job_id IS NOT NULL"),
            sqlite_where=sa.text("parent_job_id IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_jobs_lease",
            postgresql_where=sa.text("status = 'running'"),
            sqlite_where=sa.text("status = 'running'"),
        )
        batch_op.drop_index(
            "ix_jobs_identity",
            postgresql_where=sa.text("identity_key IS NOT NULL"),
            sqlite_where=sa.text("identity_key IS NOT NULL"),
        )
        batch_op.drop_index(
            "ix_jobs_dispatch",
            postgresql_where=sa.text("status IN ('pending', 'scheduled')"),
            sqlite_where=sa.text("status IN ('pending', 'scheduled')"),
        )
        batch_op.drop_index("ix_jobs_actor_status")

    op.drop_table("jobs")
    with op.batch_alter_table("cron_schedules", schema=None) as batch_op:
        batch_op.drop_index("ix_cron_schedules_due")
        batch_op.drop_index("ix_cron_schedules_actor")

    op.drop_table("cron_schedules")
    with op.batch_alter_table("actor_config", schema=None) as batch_op:
        batch_op.drop_index("ix_actor_config_queue")

    op.drop_table("actor_config")
