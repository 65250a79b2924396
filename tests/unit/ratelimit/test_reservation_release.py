"""``ConcurrencyReservation.release`` without ``pool=`` on a store-backed reservation.

It used to take the in-memory path and free nothing (the real slot row stayed held until
its lease lapsed) while ``acquire`` raised; it now raises the same ``RuntimeError``, in
both APIs. A memory reservation (built with ``clock=``) still releases without a pool.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

import taskq.ratelimit as async_rl
import taskq_sync.ratelimit as sync_rl
from taskq.testing.clock import FakeClock


async def test_release_without_pool_on_a_store_reservation_raises() -> None:
    res = async_rl.ConcurrencyReservation("rel.store", slots=1, lease=1)
    with pytest.raises(RuntimeError, match="pass pool="):
        await res.release(0, uuid.uuid4())
    with pytest.raises(RuntimeError, match="pass pool="):
        await res.acquire(None, uuid.uuid4())


def test_sync_release_without_pool_on_a_store_reservation_raises() -> None:
    res = sync_rl.ConcurrencyReservation("rel.store", slots=1, lease=1)
    with pytest.raises(RuntimeError, match="pass pool="):
        res.release(0, uuid.uuid4())


async def test_memory_reservation_releases_without_pool() -> None:
    res = async_rl.ConcurrencyReservation(
        "rel.memory", slots=1, lease=1, clock=FakeClock(datetime(2025, 1, 1, tzinfo=UTC))
    )
    worker = uuid.uuid4()
    slot = await res.acquire(None, worker)
    await res.release(slot, worker)
    assert await res.held() == []
