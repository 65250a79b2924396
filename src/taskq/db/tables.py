"""The one definition of taskq's schema, as SQLAlchemy Core tables.

Tables carry no schema name: the engine maps ``None`` to ``TASKQ_SCHEMA_NAME`` through
``schema_translate_map`` on Postgres (SQLite has no schemas). Alembic migrations are
written from this module and a test fails when the two disagree.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    Column,
    Float,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    SmallInteger,
    String,
    Table,
    Text,
    Uuid,
    false,
    func,
    text,
    true,
)

from taskq.db.types import JSONDoc, UTCDateTime

__all__ = [
    "actor_config",
    "cron_schedules",
    "job_attempts",
    "jobs",
    "leader_leases",
    "metadata",
    "queues",
    "rate_limit_buckets",
    "rate_limit_window_entries",
    "reservation_slots",
    "workers",
]

NAMING_CONVENTION = {
    "ix": "ix_%(table_name)s_%(column_0_N_name)s",
    "uq": "uq_%(table_name)s_%(column_0_N_name)s",
    "ck": "ck_%(table_name)s_%(constraint_name)s",
    "fk": "fk_%(table_name)s_%(column_0_name)s_%(referred_table_name)s",
    "pk": "pk_%(table_name)s",
}

metadata = MetaData(naming_convention=NAMING_CONVENTION)

_NAME = 200
_ACTIVE = "status IN ('pending', 'scheduled', 'running')"
_TAGGED = "tags <> '[]'"
_BIGINT_PK = BigInteger().with_variant(Integer(), "sqlite")

jobs = Table(
    "jobs",
    metadata,
    Column("id", Uuid(), primary_key=True),
    Column("actor", String(_NAME), nullable=False),
    Column("queue", String(_NAME), nullable=False, server_default="default"),
    Column("status", String(16), nullable=False, server_default="pending"),
    Column("payload", JSONDoc, nullable=False),
    Column("result", JSONDoc, nullable=True),
    Column("priority", SmallInteger(), nullable=False, server_default="0"),
    # attempt: attempts started so far; budget_used: attempts that count against max_attempts
    # (a Snooze or RetryAfter(consume_budget=False) starts an attempt but spends no budget).
    Column("attempt", Integer(), nullable=False, server_default="0"),
    Column("budget_used", Integer(), nullable=False, server_default="0"),
    Column("max_attempts", Integer(), nullable=True),
    # Postgres: defaults to the transaction's timestamp, as created_at does (the bulk COPY
    # leaves all three out). SQLite tables keep no default (migration 0002 says why).
    Column("scheduled_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("identity_key", String(_NAME), nullable=True),
    Column("idempotency_key", String(_NAME), nullable=True),
    Column("singleton", Boolean(), nullable=False, server_default=false()),
    Column("tags", JSONDoc, nullable=False, server_default="[]"),
    Column("metadata", JSONDoc, nullable=False, server_default="{}"),
    Column("error_class", String(_NAME), nullable=True),
    Column("error", Text(), nullable=True),
    Column("locked_by", Uuid(), nullable=True),
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    Column("cancel_phase", SmallInteger(), nullable=False, server_default="0"),
    Column("cancel_requested_at", UTCDateTime(), nullable=True),
    Column("progress", JSONDoc, nullable=True),
    Column("progress_seq", BigInteger(), nullable=False, server_default="0"),
    Column("trace_context", JSONDoc, nullable=True),
    Column("start_to_close_s", Float(), nullable=True),
    Column("schedule_to_close_s", Float(), nullable=True),
    Column("deadline_at", UTCDateTime(), nullable=True),
    Column("result_expires_at", UTCDateTime(), nullable=True),
    Column("parent_job_id", Uuid(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("updated_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("started_at", UTCDateTime(), nullable=True),
    Column("finished_at", UTCDateTime(), nullable=True),
    # Waiting: the rate limit, reservation or queue cap whose denial parked the job (NULL
    # once claimed again), and how many denials parked it in all. A parked job is
    # ``scheduled`` at the earliest moment it can be admitted; a denial is no attempt.
    Column("waiting_on", String(_NAME), nullable=True),
    Column("denials", Integer(), nullable=False, server_default="0"),
    CheckConstraint(
        "status IN ('pending', 'scheduled', 'running', 'succeeded', 'failed', "
        "'cancelled', 'crashed', 'abandoned')",
        name="status",
    ),
    CheckConstraint("cancel_phase BETWEEN 0 AND 3", name="cancel_phase"),
    CheckConstraint("attempt >= 0 AND budget_used >= 0", name="attempt"),
)

# Dispatch: the claim scans ready rows per queue in priority then schedule order.
Index(
    "ix_jobs_dispatch",
    jobs.c.queue,
    jobs.c.priority.desc(),
    jobs.c.scheduled_at,
    postgresql_where=text("status IN ('pending', 'scheduled')"),
    sqlite_where=text("status IN ('pending', 'scheduled')"),
)
# Waking: the jobs parked on a reservation or queue cap, for the release that frees a slot.
Index(
    "ix_jobs_waiting",
    jobs.c.waiting_on,
    jobs.c.priority.desc(),
    jobs.c.scheduled_at,
    postgresql_where=text("status = 'scheduled' AND waiting_on IS NOT NULL"),
    sqlite_where=text("status = 'scheduled' AND waiting_on IS NOT NULL"),
)
# Lease sweep: running rows whose lease expired.
Index(
    "ix_jobs_lease",
    jobs.c.lease_expires_at,
    postgresql_where=text("status = 'running'"),
    sqlite_where=text("status = 'running'"),
)
# Singletons: at most one active job per singleton actor (enqueue's race-path backstop).
Index(
    "uq_jobs_singleton_active",
    jobs.c.actor,
    unique=True,
    postgresql_where=text(f"singleton AND {_ACTIVE}"),
    sqlite_where=text(f"singleton AND {_ACTIVE}"),
)
# unique_for windows and identity fairness.
Index(
    "ix_jobs_identity",
    jobs.c.actor,
    jobs.c.identity_key,
    jobs.c.created_at,
    postgresql_where=text("identity_key IS NOT NULL"),
    sqlite_where=text("identity_key IS NOT NULL"),
)
# Idempotency keys are unique per actor.
Index(
    "uq_jobs_idempotency",
    jobs.c.actor,
    jobs.c.idempotency_key,
    unique=True,
    postgresql_where=text("idempotency_key IS NOT NULL"),
    sqlite_where=text("idempotency_key IS NOT NULL"),
)
# max_pending counts and per-actor status views.
Index("ix_jobs_actor_status", jobs.c.actor, jobs.c.status)
# Result retention sweep.
Index(
    "ix_jobs_result_expiry",
    jobs.c.result_expires_at,
    postgresql_where=text("result_expires_at IS NOT NULL"),
    sqlite_where=text("result_expires_at IS NOT NULL"),
)
Index(
    "ix_jobs_parent",
    jobs.c.parent_job_id,
    postgresql_where=text("parent_job_id IS NOT NULL"),
    sqlite_where=text("parent_job_id IS NOT NULL"),
)
# Operations: list pages newest first (keyset on created_at, id).
Index("ix_jobs_created", jobs.c.created_at, jobs.c.id)
Index("ix_jobs_queue_created", jobs.c.queue, jobs.c.created_at)
# Tag filters (``JobFilter(tags=...)``: jsonb ``@>`` on Postgres, where this is GIN), on
# tagged rows only: an untagged job costs it nothing (the filter repeats the predicate).
Index(
    "ix_jobs_tags",
    jobs.c.tags,
    postgresql_using="gin",
    postgresql_where=text(_TAGGED),
    sqlite_where=text(_TAGGED),
)
# error_class filters (failures by exception, cancellations by how they ended).
Index(
    "ix_jobs_error_class",
    jobs.c.error_class,
    jobs.c.created_at,
    postgresql_where=text("error_class IS NOT NULL"),
    sqlite_where=text("error_class IS NOT NULL"),
)
# Admin UI: per-queue counts of active jobs by status (capped), index-only, on active
# rows only (a finished job leaves it).
Index(
    "ix_jobs_queue_active",
    jobs.c.queue,
    jobs.c.status,
    postgresql_where=text(_ACTIVE),
    sqlite_where=text(_ACTIVE),
)
# Purge by finish time; on Postgres it covers status and queue, so the throughput chart
# and a queue's drain rate are index-only range scans of their window.
Index(
    "ix_jobs_finished",
    jobs.c.finished_at,
    postgresql_include=["status", "queue"],
    postgresql_where=text("finished_at IS NOT NULL"),
    sqlite_where=text("finished_at IS NOT NULL"),
)
# Admin UI (migration 0010): the jobs page's actor and status filters and their capped
# counts walk one index range (newest first) however rare the value.
Index("ix_jobs_actor_created", jobs.c.actor, jobs.c.created_at)
Index("ix_jobs_status_created", jobs.c.status, jobs.c.created_at)
# The identity-key filter without an actor (ix_jobs_identity leads with the actor).
Index(
    "ix_jobs_identity_key",
    jobs.c.identity_key,
    jobs.c.created_at,
    postgresql_where=text("identity_key IS NOT NULL"),
    sqlite_where=text("identity_key IS NOT NULL"),
)
# The actors page: each actor's newest finishes in a window, index-only on Postgres.
Index(
    "ix_jobs_actor_finished",
    jobs.c.actor,
    jobs.c.finished_at,
    postgresql_include=["status", "started_at", "error_class"],
    postgresql_where=text("finished_at IS NOT NULL"),
    sqlite_where=text("finished_at IS NOT NULL"),
)
# The workers page: a worker's running jobs, counted to a cap (running rows only).
Index(
    "ix_jobs_running_worker",
    jobs.c.locked_by,
    postgresql_where=text("status = 'running'"),
    sqlite_where=text("status = 'running'"),
)

job_attempts = Table(
    "job_attempts",
    metadata,
    Column("id", _BIGINT_PK, primary_key=True, autoincrement=True),
    Column("job_id", Uuid(), ForeignKey("jobs.id", ondelete="CASCADE"), nullable=False),
    Column("attempt", Integer(), nullable=False),
    Column("worker_id", Uuid(), nullable=True),
    Column("outcome", String(16), nullable=False, server_default="running"),
    Column("error_class", String(_NAME), nullable=True),
    Column("error", Text(), nullable=True),
    Column("traceback", Text(), nullable=True),
    Column("started_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("finished_at", UTCDateTime(), nullable=True),
    CheckConstraint(
        "outcome IN ('running', 'succeeded', 'failed', 'retried', 'snoozed', 'cancelled', "
        "'crashed', 'abandoned')",
        name="outcome",
    ),
)
Index("ix_job_attempts_job", job_attempts.c.job_id, job_attempts.c.attempt)

actor_config = Table(
    "actor_config",
    metadata,
    Column("actor", String(_NAME), primary_key=True),
    Column("queue", String(_NAME), nullable=False, server_default="default"),
    Column("max_concurrent", Integer(), nullable=True),
    Column("max_pending", Integer(), nullable=True),
    Column("result_ttl_s", Float(), nullable=True),
    Column("metadata", JSONDoc, nullable=False, server_default="{}"),
    Column("created_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("updated_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    CheckConstraint("max_concurrent IS NULL OR max_concurrent >= 0", name="max_concurrent"),
    CheckConstraint("max_pending IS NULL OR max_pending >= 0", name="max_pending"),
)
Index("ix_actor_config_queue", actor_config.c.queue)

queues = Table(
    "queues",
    metadata,
    Column("name", String(_NAME), primary_key=True),
    Column("mode", String(16), nullable=False, server_default="fifo"),
    Column("max_concurrent", Integer(), nullable=True),
    Column("paused", Boolean(), nullable=False, server_default=false()),
    Column("created_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("updated_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    CheckConstraint("mode IN ('fifo', 'fair')", name="mode"),
    CheckConstraint("max_concurrent IS NULL OR max_concurrent >= 1", name="max_concurrent"),
)

workers = Table(
    "workers",
    metadata,
    Column("id", Uuid(), primary_key=True),
    Column("hostname", String(255), nullable=False),
    Column("pid", Integer(), nullable=False),
    Column("queues", JSONDoc, nullable=False, server_default="[]"),
    Column("concurrency", Integer(), nullable=False),
    Column("status", String(16), nullable=False, server_default="running"),
    Column("version", String(32), nullable=True),
    Column("started_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("last_heartbeat_at", UTCDateTime(), nullable=False),
    Column("stopped_at", UTCDateTime(), nullable=True),
    CheckConstraint("status IN ('running', 'stopping', 'stopped', 'isolated')", name="status"),
)
Index("ix_workers_heartbeat", workers.c.last_heartbeat_at)

leader_leases = Table(
    "leader_leases",
    metadata,
    Column("name", String(_NAME), primary_key=True),
    Column("holder", Uuid(), nullable=False),
    Column("acquired_at", UTCDateTime(), nullable=False),
    Column("expires_at", UTCDateTime(), nullable=False),
)

cron_schedules = Table(
    "cron_schedules",
    metadata,
    Column("id", String(_NAME), primary_key=True),
    Column("actor", String(_NAME), nullable=False),
    Column("queue", String(_NAME), nullable=True),
    Column("cron_expression", String(255), nullable=False),
    Column("timezone", String(64), nullable=False, server_default="UTC"),
    Column("payload", JSONDoc, nullable=False, server_default="{}"),
    Column("enabled", Boolean(), nullable=False, server_default=true()),
    Column("next_run_at", UTCDateTime(), nullable=True),
    Column("last_run_at", UTCDateTime(), nullable=True),
    Column("last_job_id", Uuid(), nullable=True),
    Column("created_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    Column("updated_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    # Migration 0006: the enqueue options, the missed-tick policy and the last tick's outcome.
    # cron_expression holds a cron expression or "@every <seconds>s" for an interval.
    Column("jitter_s", Float(), nullable=True),
    Column("missed", String(8), nullable=False, server_default="latest"),
    Column("max_catchup", Integer(), nullable=False, server_default="10"),
    Column("priority", SmallInteger(), nullable=True),
    Column("tags", JSONDoc, nullable=True),
    Column("identity_key", String(_NAME), nullable=True),
    Column("origin", String(8), nullable=False, server_default="api"),
    Column("last_tick_at", UTCDateTime(), nullable=True),
    Column("last_outcome", String(32), nullable=True),
    Column("last_error", Text(), nullable=True),
    Column("enqueued_count", Integer(), nullable=False, server_default="0"),
    Column("refused_count", Integer(), nullable=False, server_default="0"),
)
Index("ix_cron_schedules_due", cron_schedules.c.enabled, cron_schedules.c.next_run_at)
Index("ix_cron_schedules_actor", cron_schedules.c.actor)

rate_limit_buckets = Table(
    "rate_limit_buckets",
    metadata,
    Column("bucket_name", String(_NAME), primary_key=True),
    Column("kind", String(16), nullable=False),
    Column("capacity", Float(), nullable=False),
    Column("refill_per_second", Float(), nullable=False, server_default="0"),
    Column("window_s", Float(), nullable=True),
    # token bucket: tokens left at updated_at; GCRA: theoretical arrival time in tat.
    Column("tokens", Float(), nullable=True),
    Column("tat", UTCDateTime(), nullable=True),
    Column("config", JSONDoc, nullable=False, server_default="{}"),
    Column("updated_at", UTCDateTime(), nullable=False, server_default=func.current_timestamp()),
    CheckConstraint("kind IN ('token_bucket', 'gcra', 'log')", name="kind"),
)

rate_limit_window_entries = Table(
    "rate_limit_window_entries",
    metadata,
    Column("id", _BIGINT_PK, primary_key=True, autoincrement=True),
    Column("bucket_name", String(_NAME), nullable=False),
    Column("request_id", String(64), nullable=False),
    Column("weight", Float(), nullable=False, server_default="1"),
    Column("created_at", UTCDateTime(), nullable=False),
)
Index(
    "ix_rate_limit_window_entries_bucket",
    rate_limit_window_entries.c.bucket_name,
    rate_limit_window_entries.c.created_at,
)
Index(
    "uq_rate_limit_window_entries_request",
    rate_limit_window_entries.c.bucket_name,
    rate_limit_window_entries.c.request_id,
    unique=True,
)

reservation_slots = Table(
    "reservation_slots",
    metadata,
    Column("name", String(_NAME), nullable=False),
    Column("slot_index", Integer(), nullable=False),
    # No foreign key: holders need not be jobs.
    Column("job_id", Uuid(), nullable=True),
    Column("worker_id", Uuid(), nullable=True),
    Column("acquired_at", UTCDateTime(), nullable=True),
    Column("lease_expires_at", UTCDateTime(), nullable=True),
    PrimaryKeyConstraint("name", "slot_index"),
    CheckConstraint("slot_index >= 0", name="slot_index"),
)
Index("ix_reservation_slots_lease", reservation_slots.c.lease_expires_at)
