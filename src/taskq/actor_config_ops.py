# sync twin: src/taskq_sync/actor_config_ops.py
"""Actor-config operations (``tq.actors``): read, set, diff, deregister, and the startup sync.

``max_concurrent``, ``max_pending`` and ``result_ttl`` are operator-owned once a row
exists: :func:`sync_actor_config` (called by the worker at startup) seeds them only on
insert, and :meth:`ActorsClient.set` is how an operator changes them.

:class:`QueuesClient` is the same for the ``queues`` table: the fleet-wide per-queue
concurrency cap (``queues.max_concurrent``) that workers read at startup.
"""

from __future__ import annotations

import builtins
import math
from collections.abc import Iterable
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef, get_actor, validate_actor_name
from taskq.actor_config import ActorConfigDiff, ActorConfigRow, DeregisterResult, QueueConfig
from taskq.constants import validate_queue_name
from taskq.db.engine import transaction, with_schema
from taskq.db.queries import actor_config as q
from taskq.db.queries import queues as qq
from taskq.exceptions import (
    ActorHasActiveJobsError,
    ActorHasEnabledSchedulesError,
    ActorNotFoundError,
)
from taskq.settings import TaskQSettings

__all__ = [
    "UNSET",
    "ActorConfigDiff",
    "ActorConfigRow",
    "ActorsClient",
    "DeregisterResult",
    "QueueConfig",
    "QueuesClient",
    "seed_values",
    "sync_actor_config",
]

_log = structlog.get_logger("taskq.actor_config")
UNSET: Any = object()
"""Sentinel: "leave this field as it is" in :meth:`ActorsClient.set`."""

_SEED_FIELDS = ("max_concurrent", "max_pending", "result_ttl")


def seed_values(ref: ActorRef[Any, Any]) -> dict[str, Any]:
    """The ``actor_config`` row an actor's decorator literals seed."""
    metadata = dict(ref.metadata)
    if ref.singleton:
        metadata["singleton"] = True
    return {
        "actor": ref.name,
        "queue": ref.queue,
        "max_concurrent": ref.max_concurrent,
        "max_pending": ref.max_pending,
        "result_ttl_s": ref.result_ttl.total_seconds() if ref.result_ttl is not None else None,
        "metadata": metadata,
    }


async def sync_actor_config(
    conn: AsyncConnection, actors: Iterable[ActorRef[Any, Any]]
) -> list[ActorConfigRow]:
    """Upsert every actor's row on ``conn`` (the worker's startup sync); return the stored rows.

    Logs ``actor-config-capacity-override`` (info) per actor whose literal differs from a
    stored seed-only field, since that literal is not what is enforced.
    """
    dialect = conn.dialect.name
    rows: list[ActorConfigRow] = []
    for ref in actors:
        row = ActorConfigRow.from_mapping(
            (await conn.execute(q.upsert_seed(dialect, seed_values(ref)))).mappings().one()
        )
        rows.append(row)
        differing = [d.field for d in _diff(ref, row) if d.differs]
        if differing:
            _log.info("actor-config-capacity-override", actor=ref.name, fields=differing)
    return rows


def _diff(ref: ActorRef[Any, Any], row: ActorConfigRow | None) -> list[ActorConfigDiff]:
    out = []
    for name in _SEED_FIELDS:
        literal = getattr(ref, name)
        stored = getattr(row, name) if row is not None else None
        if row is None:
            enforced = "unregistered"
        elif name == "max_pending":
            enforced = "stored" if stored is not None else "literal"
        else:
            enforced = "stored"
        out.append(ActorConfigDiff(ref.name, name, literal, stored, enforced))
    return out


class ActorsClient:
    """Operator-side actor-config operations on ``engine``."""

    def __init__(self, engine: AsyncEngine, *, settings: TaskQSettings | None = None) -> None:
        self.engine = with_schema(engine, settings=settings)
        self.settings = settings

    async def get(self, actor: str) -> ActorConfigRow | None:
        """The stored row, or ``None``."""
        async with transaction(self.engine, readonly=True) as conn:
            row = (await conn.execute(q.get(actor))).mappings().first()
        return ActorConfigRow.from_mapping(row) if row is not None else None

    async def list(self) -> list[ActorConfigRow]:
        """Every stored row, by actor name."""
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(q.list_all())).mappings().all()
        return [ActorConfigRow.from_mapping(r) for r in rows]

    async def set(
        self,
        actor: str,
        *,
        queue: str | None = None,
        max_concurrent: int | None = UNSET,
        max_pending: int | None = UNSET,
        result_ttl_s: float | None = UNSET,
    ) -> ActorConfigRow:
        """Overwrite the given fields (``None`` clears one); create the row if missing.

        Idempotent. ``queue`` defaults to the declared actor's queue, else the stored one.
        Every argument is checked before anything is written: a bad actor or queue name
        or an out-of-range value raises ``ValueError`` (``TypeError`` for a non-``str``
        name) and changes nothing.
        """
        validate_actor_name(actor)
        if queue is not None:
            validate_queue_name(queue)
        values: dict[str, Any] = {}
        for name, value in (("max_concurrent", max_concurrent), ("max_pending", max_pending)):
            if value is not UNSET:
                if value is not None and (
                    isinstance(value, bool) or not isinstance(value, int) or value < 0
                ):
                    raise ValueError(f"{name} must be None or an int >= 0, got {value!r}")
                values[name] = value
        if result_ttl_s is not UNSET:
            if result_ttl_s is not None and (
                isinstance(result_ttl_s, bool)
                or not isinstance(result_ttl_s, int | float)
                or not math.isfinite(result_ttl_s)
                or not result_ttl_s > 0
            ):
                raise ValueError(
                    f"result_ttl_s must be None or a finite number > 0, got {result_ttl_s!r}"
                )
            values["result_ttl_s"] = result_ttl_s
        async with transaction(self.engine) as conn:
            if queue is None:
                existing = (await conn.execute(q.get(actor))).mappings().first()
                if existing is not None:
                    queue = str(existing["queue"])
                else:
                    try:
                        queue = get_actor(actor).queue
                    except LookupError:
                        queue = "default"
            else:
                values["queue"] = queue
            stmt = q.upsert(conn.dialect.name, actor, queue, values)
            row = (await conn.execute(stmt)).mappings().one()
        return ActorConfigRow.from_mapping(row)

    async def diff(self, actors: Iterable[ActorRef[Any, Any]]) -> builtins.list[ActorConfigDiff]:
        """Per actor and seed-only field: the literal, the stored value, which is enforced."""
        out: builtins.list[ActorConfigDiff] = []
        for ref in actors:
            out.extend(_diff(ref, await self.get(ref.name)))
        return out

    async def deregister(
        self, actor: str, *, force: bool = False, purge_queue: bool = False
    ) -> DeregisterResult:
        """Delete the actor's row; docs/actors.md ("Deregistration") has the refusals.

        Without ``force``: refuses on active jobs or enabled schedules. With ``force``:
        still refuses on running jobs, cancels pending/scheduled ones
        (``error_class='ActorDeregistered'``) and disables schedules. History stays.
        """
        async with transaction(self.engine) as conn:
            dialect = conn.dialect.name
            row = (await conn.execute(q.get(actor, for_update=True))).mappings().first()
            if row is None:
                raise ActorNotFoundError(actor)
            counts = {str(s): int(n) for s, n in (await conn.execute(q.status_counts(actor))).all()}
            schedules = [str(s) for s in (await conn.execute(q.enabled_schedules(actor))).scalars()]
            active = sum(counts.values())
            if active and (not force or counts.get("running", 0)):
                raise ActorHasActiveJobsError(actor, active, counts)
            if schedules and not force:
                raise ActorHasEnabledSchedulesError(actor, schedules)
            cancelled = disabled = 0
            if force:
                cancelled = (await conn.execute(q.cancel_queued_jobs(dialect, actor))).rowcount
                disabled = (await conn.execute(q.disable_schedules(dialect, actor))).rowcount
            await conn.execute(q.delete_config(actor))
            terminal = int((await conn.execute(q.count_terminal(actor))).scalar_one())
            purged = False
            if purge_queue:
                purged = (
                    await conn.execute(q.delete_queue_if_unshared(str(row["queue"])))
                ).rowcount > 0
        return DeregisterResult(
            actor=actor,
            queue=str(row["queue"]),
            actor_config_deleted=True,
            schedules_disabled=disabled,
            jobs_cancelled=cancelled,
            terminal_jobs_remaining=terminal,
            queue_purged=purged,
        )


def _queue_cap(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(
            f"a queue's max_concurrent must be None (uncapped) or an int >= 1, got {value!r}"
        )
    return value


class QueuesClient:
    """Operator-side queue settings on ``engine``: the fleet-wide per-queue cap.

    Workers read ``queues.max_concurrent`` once, at startup (docs/workers.md, "Boot"), so
    a change applies as workers restart.
    """

    def __init__(self, engine: AsyncEngine, *, settings: TaskQSettings | None = None) -> None:
        self.engine = with_schema(engine, settings=settings)
        self.settings = settings

    async def get(self, queue: str) -> QueueConfig | None:
        """The queue's settings; ``None`` when no ``queues`` row nor actor uses it."""
        validate_queue_name(queue)
        async with transaction(self.engine, readonly=True) as conn:
            row = (await conn.execute(qq.get(queue))).mappings().first()
            actors = [str(a) for _, a in (await conn.execute(qq.actors_by_queue(queue))).all()]
        if row is None and not actors:
            return None
        return QueueConfig.of(queue, row, actors)

    async def list(self) -> builtins.list[QueueConfig]:
        """Every queue with a ``queues`` row or a stored actor, by name."""
        async with transaction(self.engine, readonly=True) as conn:
            rows = {str(r["name"]): r for r in (await conn.execute(qq.list_all())).mappings()}
            by_queue: dict[str, builtins.list[str]] = {}
            for queue, name in (await conn.execute(qq.actors_by_queue())).all():
                by_queue.setdefault(str(queue), []).append(str(name))
        names = sorted(rows.keys() | by_queue.keys())
        return [QueueConfig.of(n, rows.get(n), by_queue.get(n, [])) for n in names]

    async def set_max_concurrent(self, queue: str, max_concurrent: int | None) -> QueueConfig:
        """Set (or, with ``None``, clear) the queue's fleet-wide cap; UPSERTs its row.

        ``max_concurrent`` must be ``>= 1``: a queue cap of 0 is rejected (a hard stop
        belongs at the actor level, ``actor_config.max_concurrent = 0``). Bad input
        raises ``ValueError`` and changes nothing. Idempotent.
        """
        validate_queue_name(queue)
        cap = _queue_cap(max_concurrent)
        async with transaction(self.engine) as conn:
            stmt = qq.upsert_max_concurrent(conn.dialect.name, queue, cap)
            row = (await conn.execute(stmt)).mappings().one()
            actors = [str(a) for _, a in (await conn.execute(qq.actors_by_queue(queue))).all()]
        return QueueConfig.of(queue, row, actors)

    async def pause(self, queue: str) -> QueueConfig:
        """Stop dispatch from ``queue``: workers claim none of its jobs until :meth:`resume`
        (running jobs finish; enqueues still succeed). Takes effect at the next claim,
        no restart. Idempotent; a bad name is a ``ValueError`` and changes nothing."""
        return await self._set_paused(queue, True)

    async def resume(self, queue: str) -> QueueConfig:
        """Let workers claim ``queue``'s jobs again (idempotent)."""
        return await self._set_paused(queue, False)

    async def _set_paused(self, queue: str, paused: bool) -> QueueConfig:
        validate_queue_name(queue)
        async with transaction(self.engine) as conn:
            row = (
                (await conn.execute(qq.upsert_paused(conn.dialect.name, queue, paused)))
                .mappings()
                .one()
            )
            actors = [str(a) for _, a in (await conn.execute(qq.actors_by_queue(queue))).all()]
        _log.info("queue-paused" if paused else "queue-resumed", queue=queue)
        return QueueConfig.of(queue, row, actors)
