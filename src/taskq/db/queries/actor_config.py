"""Statement builders for ``actor_config`` and the reads ``deregister`` needs."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from sqlalchemy import Select, delete, func, select, update

from taskq.constants import ACTIVE_STATUSES, TERMINAL_STATUSES
from taskq.db import dialect as dialects
from taskq.db.tables import actor_config, cron_schedules, jobs, queues

__all__ = [
    "cancel_queued_jobs",
    "count_terminal",
    "delete_config",
    "delete_queue_if_unshared",
    "disable_schedules",
    "enabled_schedules",
    "get",
    "list_all",
    "status_counts",
    "upsert",
    "upsert_seed",
]


def get(actor: str, *, for_update: bool = False) -> Select[Any]:
    """One ``actor_config`` row."""
    stmt = select(actor_config).where(actor_config.c.actor == actor)
    return stmt.with_for_update() if for_update else stmt


def list_all() -> Select[Any]:
    """Every ``actor_config`` row, by name."""
    return select(actor_config).order_by(actor_config.c.actor)


def upsert_seed(dialect: str, row: Mapping[str, Any]) -> Any:
    """The worker's startup UPSERT: capacity fields are seed-only.

    ``max_concurrent``, ``max_pending`` and ``result_ttl_s`` are written only when the row
    is created; on conflict only ``queue`` and ``metadata`` follow the code.
    """
    now = dialects.now(dialect)
    stmt = dialects.insert(dialect, actor_config).values(**row, created_at=now, updated_at=now)
    return stmt.on_conflict_do_update(
        index_elements=[actor_config.c.actor],
        set_={"queue": stmt.excluded.queue, "metadata": stmt.excluded.metadata, "updated_at": now},
    ).returning(*actor_config.c)


def upsert(dialect: str, actor: str, queue: str, values: Mapping[str, Any]) -> Any:
    """Operator ``set``: create the row if needed, then overwrite exactly ``values``.

    ``queue`` is the new row's queue; ``values`` may carry ``queue`` too (to move an
    existing row), and any column it names wins over the defaults of a new row.
    """
    now = dialects.now(dialect)
    row: dict[str, Any] = {"actor": actor, "queue": queue, "metadata": {}, "created_at": now}
    row.update(values)
    row["updated_at"] = now
    stmt = dialects.insert(dialect, actor_config).values(**row)
    return stmt.on_conflict_do_update(
        index_elements=[actor_config.c.actor], set_={**values, "updated_at": now}
    ).returning(*actor_config.c)


def status_counts(actor: str) -> Select[Any]:
    """Active job counts by status."""
    return (
        select(jobs.c.status, func.count())
        .where(jobs.c.actor == actor, jobs.c.status.in_(ACTIVE_STATUSES))
        .group_by(jobs.c.status)
    )


def count_terminal(actor: str) -> Select[Any]:
    """How many finished jobs reference the actor."""
    return (
        select(func.count())
        .select_from(jobs)
        .where(jobs.c.actor == actor, jobs.c.status.in_(TERMINAL_STATUSES))
    )


def enabled_schedules(actor: str) -> Select[Any]:
    """Ids of enabled cron schedules for the actor."""
    return (
        select(cron_schedules.c.id)
        .where(cron_schedules.c.actor == actor, cron_schedules.c.enabled.is_(True))
        .order_by(cron_schedules.c.id)
    )


def cancel_queued_jobs(dialect: str, actor: str) -> Any:
    """Cancel the actor's pending/scheduled jobs with ``error_class='ActorDeregistered'``."""
    now = dialects.now(dialect)
    return (
        update(jobs)
        .where(jobs.c.actor == actor, jobs.c.status.in_(("pending", "scheduled")))
        .values(
            status="cancelled",
            error_class="ActorDeregistered",
            finished_at=now,
            cancel_requested_at=now,
            updated_at=now,
        )
    )


def disable_schedules(dialect: str, actor: str) -> Any:
    """Disable the actor's enabled cron schedules."""
    return (
        update(cron_schedules)
        .where(cron_schedules.c.actor == actor, cron_schedules.c.enabled.is_(True))
        .values(enabled=False, updated_at=dialects.now(dialect))
    )


def delete_config(actor: str) -> Any:
    """Delete the ``actor_config`` row."""
    return delete(actor_config).where(actor_config.c.actor == actor)


def delete_queue_if_unshared(queue: str) -> Any:
    """Delete the ``queues`` row unless another ``actor_config`` row still uses the queue."""
    others = select(actor_config.c.actor).where(actor_config.c.queue == queue).exists()
    return delete(queues).where(queues.c.name == queue, ~others)
