"""One environment per (store, flavour): the behavioural suite runs on each.

Stores: memory (FakeClock), Redis, Postgres, SQLite. Flavours: ``taskq.ratelimit``
(asyncio) and the generated ``taskq_sync.ratelimit`` (blocking calls; awaited through
:func:`call`, which passes plain values through).
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from types import ModuleType
from typing import Any, TypeVar

import pytest
import redis
import redis.asyncio as aredis
from sqlalchemy import select, text, type_coerce
from sqlalchemy.engine import URL

import taskq.ratelimit as async_rl
import taskq_sync.ratelimit as sync_rl
from taskq.db import dialect as db_dialect
from taskq.db.engine import make_engine as make_async_engine
from taskq.db.types import UTCDateTime
from taskq.settings import TaskQSettings
from taskq.testing.clock import FakeClock
from taskq_sync.db.engine import make_engine as make_sync_engine

T = TypeVar("T")
START = datetime(2025, 1, 1, tzinfo=UTC)


async def call(value: Any) -> Any:
    """Await ``value`` if it is awaitable (async flavour); return it as is (sync flavour)."""
    if inspect.isawaitable(value):
        return await value
    return value


@dataclass
class Env:
    """What a behavioural test needs: the API module, the backend and its keyword args."""

    store: str
    flavour: str
    rl: ModuleType
    backend: str
    kw: dict[str, Any]
    clock: FakeClock
    engine: Any = None
    redis: Any = None
    closers: list[Any] = field(default_factory=list)

    @property
    def real_time(self) -> bool:
        return self.store != "memory"

    async def advance(self, seconds: float) -> None:
        """Let time pass: the FakeClock for memory, real (short) time for the stores."""
        if self.real_time:
            await asyncio.sleep(seconds)
        else:
            self.clock.advance(seconds)

    async def lapse_slots(self, name: str, seconds: float) -> None:
        """Let ``seconds`` pass for the leases of reservation ``name``, without waiting.

        Memory: the FakeClock. The SQL stores read their own clock, so their slot rows'
        ``lease_expires_at`` are moved ``seconds`` earlier instead (the same thing as far
        as every comparison with the store's clock is concerned). A test can so use a
        lease far longer than any scheduling delay and still watch it lapse at once.
        """
        if self.store == "memory":
            self.clock.advance(seconds)
            return
        if self.engine.dialect.name == "postgresql":
            stmt = text(
                "UPDATE taskq.reservation_slots SET lease_expires_at = lease_expires_at "
                "- make_interval(secs => :seconds) WHERE name = :name"
            )
        else:
            stmt = text(
                "UPDATE reservation_slots SET lease_expires_at = strftime('%Y-%m-%d %H:%M:%f', "
                "lease_expires_at, '-' || :seconds || ' seconds') WHERE name = :name"
            )
        params = {"name": name, "seconds": seconds}
        if hasattr(self.engine, "sync_engine"):
            async with self.engine.begin() as conn:
                await conn.execute(stmt, params)
        else:
            with self.engine.begin() as conn:
                conn.execute(stmt, params)

    async def now(self) -> datetime:
        """What the store's clock reads now: the FakeClock, or the SQL store's own clock."""
        if self.store == "memory":
            return self.clock.now()
        stmt = select(type_coerce(db_dialect.now(self.engine.dialect.name), UTCDateTime()))
        if hasattr(self.engine, "sync_engine"):
            async with self.engine.connect() as conn:
                return (await conn.execute(stmt)).scalar_one()  # type: ignore[no-any-return]
        with self.engine.connect() as conn:
            return conn.execute(stmt).scalar_one()  # type: ignore[no-any-return]

    @property
    def pool(self) -> Any:
        """``pool=`` for reservations: the engine, or ``None`` (memory)."""
        return self.engine

    def reservation(self, name: str, slots: int, lease: float) -> Any:
        if self.store == "memory":
            return self.rl.ConcurrencyReservation(name, slots=slots, lease=lease, clock=self.clock)
        return self.rl.ConcurrencyReservation(name, slots=slots, lease=lease)


def _store_url(store: str, request: pytest.FixtureRequest) -> str | URL | None:
    if store == "redis":
        return request.getfixturevalue("redis_url")  # type: ignore[no-any-return]
    if store in ("postgres", "sqlite"):
        return request.getfixturevalue("pg_url" if store == "postgres" else "sqlite_url")  # type: ignore[no-any-return]
    return None


async def _make_env(
    store: str, flavour: str, url: str | URL | None, settings: TaskQSettings
) -> Env:
    rl = async_rl if flavour == "async" else sync_rl
    clock = FakeClock(START)
    env = Env(store, flavour, rl, "memory", {"clock": clock}, clock)
    if store == "redis":
        assert isinstance(url, str)
        env.redis = aredis.Redis.from_url(url) if flavour == "async" else redis.Redis.from_url(url)
        env.backend = "redis"
        env.kw = {"redis_client": env.redis, "settings": settings}
    elif store in ("postgres", "sqlite"):
        make = make_async_engine if flavour == "async" else make_sync_engine
        env.engine = make(url, settings=settings)
        env.backend = "postgres"
        env.kw = {"pg_pool": env.engine, "settings": settings}
    return env


async def _close(env: Env) -> None:
    if env.redis is not None:
        await call(env.redis.aclose() if env.flavour == "async" else env.redis.close())
    if env.engine is not None:
        await call(env.engine.dispose())


@pytest.fixture(params=["memory", "redis", "postgres", "sqlite"])
def store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=["async", "sync"])
def flavour(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def store_url(store: str, request: pytest.FixtureRequest) -> str | URL | None:
    """Resolved outside the event loop (the database fixtures run their own loop)."""
    return _store_url(store, request)


@pytest.fixture
def slot_store_url(slot_store: str, request: pytest.FixtureRequest) -> str | URL | None:
    return _store_url(slot_store, request)


@pytest.fixture
async def env(
    store: str, flavour: str, store_url: str | URL | None, settings: TaskQSettings
) -> AsyncIterator[Env]:
    """Every store in both flavours."""
    e = await _make_env(store, flavour, store_url, settings)
    yield e
    await _close(e)


@pytest.fixture(params=["memory", "postgres", "sqlite"])
def slot_store(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
async def slot_env(
    slot_store: str, flavour: str, slot_store_url: str | URL | None, settings: TaskQSettings
) -> AsyncIterator[Env]:
    """Reservation stores (memory, Postgres, SQLite) in both flavours."""
    e = await _make_env(slot_store, flavour, slot_store_url, settings)
    yield e
    await _close(e)


@pytest.fixture
def sync_redis(redis_url: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.close()
