"""Statement builders for the ``queues`` table: the operator's per-queue settings.

Nothing in taskq inserts a ``queues`` row on its own, so writes here are UPSERTs (a plain
``UPDATE ... WHERE name = ...`` would match zero rows on a fresh deployment).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, select

from taskq.db import dialect as dialects
from taskq.db.tables import actor_config, queues

__all__ = ["actors_by_queue", "get", "list_all", "upsert_max_concurrent", "upsert_paused"]


def get(name: str) -> Select[Any]:
    """One ``queues`` row."""
    return select(queues).where(queues.c.name == name)


def list_all() -> Select[Any]:
    """Every ``queues`` row, by name."""
    return select(queues).order_by(queues.c.name)


def actors_by_queue(name: str | None = None) -> Select[Any]:
    """``(queue, actor)`` of every ``actor_config`` row (of queue ``name`` when given)."""
    stmt = select(actor_config.c.queue, actor_config.c.actor).order_by(
        actor_config.c.queue, actor_config.c.actor
    )
    return stmt.where(actor_config.c.queue == name) if name is not None else stmt


def upsert_max_concurrent(dialect: str, name: str, max_concurrent: int | None) -> Any:
    """Set the queue's fleet-wide cap (``None``: uncapped), creating its row if needed."""
    now = dialects.now(dialect)
    stmt = dialects.insert(dialect, queues).values(
        name=name, max_concurrent=max_concurrent, created_at=now, updated_at=now
    )
    return stmt.on_conflict_do_update(
        index_elements=[queues.c.name],
        set_={"max_concurrent": stmt.excluded.max_concurrent, "updated_at": now},
    ).returning(*queues.c)


def upsert_paused(dialect: str, name: str, paused: bool) -> Any:
    """Pause (or resume) the queue, creating its row if needed; dispatch reads it per claim."""
    now = dialects.now(dialect)
    stmt = dialects.insert(dialect, queues).values(
        name=name, paused=paused, created_at=now, updated_at=now
    )
    return stmt.on_conflict_do_update(
        index_elements=[queues.c.name],
        set_={"paused": stmt.excluded.paused, "updated_at": now},
    ).returning(*queues.c)
