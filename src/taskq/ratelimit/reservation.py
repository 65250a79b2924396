# sync twin: src/taskq_sync/ratelimit/reservation.py
"""``ConcurrencyReservation``: at most ``slots`` holders at once, by leased slot rows.

On Postgres each slot is a row of ``reservation_slots`` claimed with
``FOR UPDATE SKIP LOCKED`` and held until released or its lease lapses (the worker
heartbeat renews it). SQLite runs the same statements under its write lock. With no
engine and a ``clock`` given at construction, slots live in process memory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from datetime import timedelta
from typing import TYPE_CHECKING, Any
from uuid import UUID

from taskq.clock import Clock
from taskq.constants import DEFAULT_RESERVATION_BACKOFF, SCHEMA_NAME_RE, validate_name
from taskq.db.engine import transaction, with_schema
from taskq.db.queries import ratelimit as q
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit._algorithms import from_us, to_us, us_to_timedelta
from taskq.ratelimit._memory import MemoryReservation
from taskq.ratelimit.decision import HeldSlot, SyncResult
from taskq.ratelimit.refs import lease_seconds

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

__all__ = ["ConcurrencyReservation", "sync_slots"]

_log = logging.getLogger("taskq.ratelimit")


def _uuid(value: object, what: str) -> UUID:
    if isinstance(value, UUID):
        return value
    try:
        return UUID(str(value))
    except ValueError:
        raise ValueError(f"{what} must be a UUID, got {value!r}") from None


class ConcurrencyReservation:
    """``slots`` concurrent holders of a named resource, each for at most ``lease``."""

    def __init__(
        self,
        name: str,
        slots: int,
        lease: timedelta | float,
        lock_lease: timedelta | None = None,
        *,
        clock: Clock | None = None,
        schema: str | None = None,
    ) -> None:
        self.name = validate_name(name, kind="reservation")
        if isinstance(slots, bool) or not isinstance(slots, int):
            raise TypeError(f"slots must be an int, got {type(slots).__name__}")
        if slots < 1:
            raise ValueError(f"slots must be >= 1, got {slots}")
        self.slots = slots
        self.lease = (
            lease if isinstance(lease, timedelta) else timedelta(seconds=lease_seconds(lease))
        )
        self.lease_s = lease_seconds(lease)
        if schema is not None and SCHEMA_NAME_RE.fullmatch(schema) is None:
            raise ValueError(f"invalid schema name {schema!r}")
        # None: the engine's own schema map, else TASKQ_SCHEMA_NAME (as every entry point
        # that takes an engine resolves it, see taskq.db.engine.with_schema).
        self.schema = schema
        self.clock = clock
        self.lock_lease = lock_lease
        if lock_lease is not None and self.lease < lock_lease:
            _log.warning(
                "ratelimit.lease_shorter_than_lock_lease reservation=%s lease=%s lock_lease=%s",
                self.name,
                self.lease,
                lock_lease,
            )
        self._memory = MemoryReservation(slots)

    def __repr__(self) -> str:
        return f"ConcurrencyReservation({self.name!r}, slots={self.slots}, lease={self.lease!r})"

    @property
    def config(self) -> tuple[Any, ...]:
        """What makes two instances the same reservation (registry idempotency compares it)."""
        return ("reservation", self.name, self.slots, self.lease, self.schema, self.clock is None)

    def memory_slots_held(self) -> bool:
        """True when this is a memory reservation with a live slot (never idle-evicted)."""
        return self.clock is not None and bool(self._memory.held(to_us(self.clock.now())))

    def _clock_us(self) -> int:
        if self.clock is None:
            raise RuntimeError(
                f"reservation {self.name!r}: pass pool= (a SQLAlchemy engine), "
                "or construct it with clock= for the in-memory backend"
            )
        return to_us(self.clock.now())

    async def acquire(
        self, job_id: UUID | None, worker_id: UUID, pool: AsyncEngine | None = None
    ) -> int:
        """Take a free slot and return its ``slot_index`` (in ``range(slots)``).

        Raises ``ReservationUnavailable`` (with the wait until the soonest lease lapses)
        when every slot is held. Missing slot rows are created on first use.
        """
        job = None if job_id is None else _uuid(job_id, "job_id")
        worker = _uuid(worker_id, "worker_id")
        if pool is None:
            index, wait_us = self._memory.acquire(
                self._clock_us(), round(self.lease_s * 1e6), job, worker
            )
            if index is None:
                raise ReservationUnavailable(self.name, us_to_timedelta(wait_us))
            return index
        for _ in range(3):
            async with transaction(with_schema(pool, schema=self.schema)) as conn:
                index = await self._claim(conn, job, worker)
                if index is not None:
                    return index
                dialect = conn.dialect.name
                stats = q.slots_soonest_expiry(dialect, self.name, self.slots)
                count, free, soonest, now = (await conn.execute(stats)).one()
                if count < self.slots:
                    await conn.execute(q.slots_ensure(dialect, self.name, self.slots))
                    index = await self._claim(conn, job, worker)
                    if index is not None:
                        return index
            # Free rows skipped only because a concurrent claim had them locked: look again.
            if not free:
                break
        wait = DEFAULT_RESERVATION_BACKOFF if soonest is None else max(timedelta(0), soonest - now)
        raise ReservationUnavailable(self.name, wait)

    async def _claim(self, conn: AsyncConnection, job: UUID | None, worker: UUID) -> int | None:
        stmt = q.slot_claim(
            conn.dialect.name,
            self.name,
            self.slots,
            job_id=job,
            worker_id=worker,
            lease_s=self.lease_s,
        )
        value = (await conn.execute(stmt)).scalar_one_or_none()
        return None if value is None else int(value)

    async def release(
        self, slot_index: int, worker_id: UUID, pool: AsyncEngine | None = None
    ) -> None:
        """Free ``slot_index``; a no-op unless ``worker_id`` holds it (no double release).

        Without ``pool`` this needs a memory reservation (one built with ``clock=``) and
        raises ``RuntimeError`` otherwise, like :meth:`acquire`: a store-backed slot
        released without an engine would otherwise stay held until its lease lapsed.
        """
        worker = _uuid(worker_id, "worker_id")
        if pool is None:
            self._clock_us()  # raises for a store-backed reservation: pass pool=
            self._memory.release(slot_index, worker)
            return
        async with transaction(with_schema(pool, schema=self.schema)) as conn:
            await conn.execute(q.slot_release(self.name, slot_index, worker))

    async def renew(
        self, slot_index: int, worker_id: UUID, pool: AsyncEngine | None = None
    ) -> bool:
        """Extend the lease of a slot ``worker_id`` holds by ``lease`` from now (heartbeat)."""
        worker = _uuid(worker_id, "worker_id")
        if pool is None:
            return self._memory.renew(
                slot_index, worker, self._clock_us(), round(self.lease_s * 1e6)
            )
        async with transaction(with_schema(pool, schema=self.schema)) as conn:
            result = await conn.execute(
                q.slot_renew(conn.dialect.name, self.name, slot_index, worker, self.lease_s)
            )
            return bool(result.rowcount)

    async def held(self, pool: AsyncEngine | None = None) -> list[HeldSlot]:
        """The slots currently held (lease not lapsed), lowest index first."""
        if pool is None:
            now_us = self._clock_us()
            return [
                HeldSlot(i, h.job_id, h.worker_id, from_us(h.lease_expires_us))
                for i, h in self._memory.held(now_us)
            ]
        async with transaction(with_schema(pool, schema=self.schema), readonly=True) as conn:
            rows = (await conn.execute(q.slots_held(conn.dialect.name, self.name))).all()
        return [HeldSlot(r.slot_index, r.job_id, r.worker_id, r.lease_expires_at) for r in rows]

    async def ensure_slots(self, pool: AsyncEngine) -> SyncResult:
        """``sync_slots([self], pool)``: make the slot rows match ``slots``."""
        return await sync_slots([self], pool, schema=self.schema)


async def sync_slots(
    reservations: Iterable[ConcurrencyReservation],
    pool: AsyncEngine,
    *,
    schema: str | None = None,
) -> SyncResult:
    """Make ``reservation_slots`` match each reservation's ``slots``.

    Inserts missing rows, deletes rows past ``slots`` that nobody holds, and leaves held
    ones (``skipped_held``) for a later sync once released. Idempotent.
    """
    inserted = deleted = skipped = 0
    async with transaction(with_schema(pool, schema=schema)) as conn:
        dialect = conn.dialect.name
        for res in reservations:
            before = (
                await conn.execute(q.slots_soonest_expiry(dialect, res.name, res.slots))
            ).one()[0]
            await conn.execute(q.slots_ensure(dialect, res.name, res.slots))
            inserted += res.slots - int(before)
            skipped += int(
                (await conn.execute(q.slots_held_excess(dialect, res.name, res.slots))).scalar_one()
            )
            deleted += int(
                (await conn.execute(q.slots_delete_excess(dialect, res.name, res.slots))).rowcount
            )
    return SyncResult(inserted=inserted, deleted=deleted, skipped_held=skipped)
