"""Values for actor-config operations: the stored row, a diff line, a deregistration result,
a queue's settings.

Pure, so ``taskq.actor_config_ops`` and its generated sync twin share the same classes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

__all__ = ["ActorConfigDiff", "ActorConfigRow", "DeregisterResult", "QueueConfig"]


@dataclass(frozen=True, slots=True)
class ActorConfigRow:
    """A snapshot of one ``actor_config`` row (what ``get``/``list`` return)."""

    actor: str
    queue: str
    max_concurrent: int | None
    max_pending: int | None
    result_ttl: timedelta | None
    metadata: dict[str, Any]
    updated_at: datetime

    @classmethod
    def from_mapping(cls, row: Mapping[Any, Any]) -> ActorConfigRow:
        """Build from an ``actor_config`` result row."""
        ttl = row["result_ttl_s"]
        return cls(
            actor=row["actor"],
            queue=row["queue"],
            max_concurrent=row["max_concurrent"],
            max_pending=row["max_pending"],
            result_ttl=timedelta(seconds=ttl) if ttl is not None else None,
            metadata=dict(row["metadata"] or {}),
            updated_at=row["updated_at"],
        )


@dataclass(frozen=True, slots=True)
class ActorConfigDiff:
    """One seed-only field of one actor: the decorator literal, the stored value, and which
    one dispatch/enqueue actually enforces (``"stored"``, ``"literal"`` or ``"unregistered"``
    when no row exists yet)."""

    actor: str
    field: str
    literal: Any
    stored: Any
    enforced: str

    @property
    def differs(self) -> bool:
        """True when the literal and the stored value disagree."""
        return bool(self.literal != self.stored)


@dataclass(frozen=True, slots=True)
class DeregisterResult:
    """What ``actors.deregister()`` did. ``actor_config_deleted`` is always True."""

    actor: str
    queue: str
    actor_config_deleted: bool
    schedules_disabled: int
    jobs_cancelled: int
    terminal_jobs_remaining: int
    queue_purged: bool


@dataclass(frozen=True, slots=True)
class QueueConfig:
    """What the store says about one queue.

    ``stored`` tells whether a ``queues`` row exists; a queue known only from the
    ``actor_config`` rows that use it has the defaults (``fifo``, uncapped, not paused)
    and ``updated_at=None``. ``max_concurrent`` is the fleet-wide cap (``None``:
    uncapped); ``actors`` are the stored actors on the queue, by name.
    """

    name: str
    mode: str
    max_concurrent: int | None
    paused: bool
    actors: tuple[str, ...]
    stored: bool
    updated_at: datetime | None

    @classmethod
    def of(cls, name: str, row: Mapping[Any, Any] | None, actors: Iterable[str]) -> QueueConfig:
        """Build from a ``queues`` result row (or ``None``) and the queue's actors."""
        return cls(
            name=name,
            mode=str(row["mode"]) if row is not None else "fifo",
            max_concurrent=row["max_concurrent"] if row is not None else None,
            paused=bool(row["paused"]) if row is not None else False,
            actors=tuple(actors),
            stored=row is not None,
            updated_at=row["updated_at"] if row is not None else None,
        )
