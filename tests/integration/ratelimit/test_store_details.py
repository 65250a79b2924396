"""Store-specific promises: key layout and TTLs, NOSCRIPT reloads, keyed publishing,
and a model check of fixed quotas on the real stores (no time involved, so exact)."""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from datetime import timedelta
from types import SimpleNamespace
from typing import Any

import pytest
import redis.asyncio as aredis
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from sqlalchemy import select

from taskq.db.tables import rate_limit_buckets
from taskq.ratelimit import (
    KeyedRateLimitRef,
    RateLimitRegistry,
    SlidingWindow,
    TokenBucket,
)
from taskq.ratelimit._lua import GCRA, LOG, TOKEN_BUCKET
from taskq.settings import TaskQSettings
from tests.integration.ratelimit.conftest import Env, call

pytestmark = pytest.mark.integration


@pytest.fixture
async def aredis_client(redis_url: str) -> AsyncIterator[aredis.Redis]:
    client = aredis.Redis.from_url(redis_url)
    yield client
    await client.aclose()


async def test_redis_keys_are_hash_tagged_and_always_expire(
    aredis_client: aredis.Redis, unique_name: str, settings: TaskQSettings
) -> None:
    kw: dict[str, Any] = {"redis_client": aredis_client, "settings": settings}
    tb = TokenBucket(unique_name, capacity=100, refill_per_second=10)
    fixed = TokenBucket(unique_name + "_q", capacity=1, refill_per_second=0)
    log = SlidingWindow(unique_name, limit=5, window=timedelta(minutes=1))
    gcra = SlidingWindow(unique_name, limit=5, window=timedelta(minutes=1), style="gcra")
    tiny = TokenBucket(unique_name + "_t", capacity=1, refill_per_second=1, ttl=timedelta(0))
    for p, ttl in ((tb, 80), (fixed, 86_400), (log, 180), (gcra, 120), (tiny, 1)):
        await p.acquire(**kw)
        assert p.redis_key.startswith(f"taskq:rl:{{{p.name}}}:")
        remaining = await aredis_client.ttl(p.redis_key)
        assert 0 < remaining <= ttl
    await tb.reset(**kw)
    assert not await aredis_client.exists(tb.redis_key)


async def test_scripts_are_reloaded_on_noscript(
    aredis_client: aredis.Redis, unique_name: str, settings: TaskQSettings
) -> None:
    tb = TokenBucket(unique_name, capacity=2, refill_per_second=0)
    await tb.acquire(redis_client=aredis_client, settings=settings)
    real = {s: s.sha for s in (TOKEN_BUCKET, GCRA, LOG)}
    for s in real:
        s.sha = b"0" * 40  # a sha the server does not know: as if it lost its script cache
    try:
        d = await tb.acquire(redis_client=aredis_client, settings=settings)
        assert d.allowed
        assert d.remaining == 0
        assert TOKEN_BUCKET.sha == real[TOKEN_BUCKET]
        state = await tb.peek(redis_client=aredis_client, settings=settings)
        assert state.tokens_remaining == 0
    finally:
        for s, sha in real.items():
            s.sha = sha


class Tenant(BaseModel):
    tenant: str


@pytest.mark.parametrize("slot_store", ["postgres", "sqlite"])
@pytest.mark.parametrize("flavour", ["async"])
async def test_keyed_buckets_are_published_to_rate_limit_buckets(
    slot_env: Env, unique_name: str
) -> None:
    env = slot_env
    reg = RateLimitRegistry()
    ref = KeyedRateLimitRef.typed(
        Tenant,
        base_name=unique_name,
        key_fn=lambda p: p.tenant,
        capacity=3,
        refill_per_second=1,
        backend="memory",
    )
    actor = SimpleNamespace(name="a", rate_limits=[ref], reservations=[])
    for _ in range(2):
        await reg.acquire_for_actor(
            actor,
            {"tenant": "t1"},
            job_id=None,
            worker_id=uuid.uuid4(),
            pg_pool=env.engine,
            clock=env.clock,
        )
    async with env.engine.connect() as conn:
        rows = (
            await conn.execute(
                select(rate_limit_buckets).where(
                    rate_limit_buckets.c.bucket_name == f"{unique_name}:t1"
                )
            )
        ).all()
    assert len(rows) == 1
    assert (rows[0].kind, rows[0].capacity, rows[0].refill_per_second) == ("token_bucket", 3, 1)


@pytest.mark.parametrize("store", ["redis", "postgres", "sqlite"])
@pytest.mark.parametrize("flavour", ["async"])
@settings(max_examples=15, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    capacity=st.integers(1, 6),
    steps=st.lists(st.sampled_from(["take1", "take2", "refund", "reset", "peek"]), max_size=15),
)
async def test_fixed_quota_matches_the_model_on_real_stores(
    env: Env, capacity: int, steps: list[str]
) -> None:
    """Model: a counter that only acquire, refund and reset move."""
    tb = env.rl.TokenBucket(
        f"hyp_{uuid.uuid4().hex}", capacity=capacity, refill_per_second=0, backend=env.backend
    )
    tokens = capacity
    last = None
    for step in steps:
        if step.startswith("take"):
            count = int(step[-1])
            if count > capacity:
                continue
            d = await call(tb.acquire(count, **env.kw))
            assert d.allowed is (tokens >= count)
            assert d.retry_after == (timedelta(0) if d.allowed else None)
            if d.allowed:
                tokens -= count
                last = d
            assert d.remaining == tokens
        elif step == "refund" and last is not None:
            await call(tb.refund(last, **env.kw))
            tokens = min(capacity, tokens + 1)
            last = None
        elif step == "reset":
            await call(tb.reset(**env.kw))
            tokens = capacity
        else:
            state = await call(tb.peek(**env.kw))
            assert state.tokens_remaining == tokens
            assert state.is_exhausted is (tokens < 1)


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_missing_tables_say_run_migrate(
    tmp_path: Any, flavour: str, settings: TaskQSettings
) -> None:
    import taskq.ratelimit as arl
    import taskq_sync.ratelimit as srl
    from taskq.db.engine import make_engine as make_async
    from taskq.exceptions import SchemaNotReady
    from taskq_sync.db.engine import make_engine as make_sync

    rl = arl if flavour == "async" else srl
    engine = (make_async if flavour == "async" else make_sync)(
        f"sqlite:///{tmp_path}/empty.db", settings=settings
    )
    try:
        res = rl.ConcurrencyReservation("r", slots=1, lease=5)
        with pytest.raises(SchemaNotReady) as info:
            await call(res.acquire(None, uuid.uuid4(), engine))
        assert info.value.table == "reservation_slots"
        assert "taskq migrate up" in str(info.value)
        tb = rl.TokenBucket("b", capacity=1, refill_per_second=1, backend="postgres")
        with pytest.raises(SchemaNotReady) as info:
            await call(tb.acquire(pg_pool=engine, settings=settings))
        assert info.value.table == "rate_limit_buckets"
    finally:
        await call(engine.dispose())


async def test_cancelled_redis_acquires_leave_no_reply_behind(
    aredis_client: aredis.Redis, unique_name: str, settings: TaskQSettings
) -> None:
    """A task cancelled while its EVALSHA is in flight must not leave the reply unread on a
    pooled connection (the next command on it would read the stale reply as its own)."""
    kw: dict[str, Any] = {"redis_client": aredis_client, "settings": settings}
    tb = TokenBucket(unique_name, capacity=1000, refill_per_second=0)
    for delay in (0, 0, 0.0001, 0.0005, 0.001) * 4:
        task = asyncio.create_task(tb.acquire(**kw))
        await asyncio.sleep(delay)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
    before = await tb.peek(**kw)
    d = await tb.acquire(**kw)
    assert d.allowed
    assert d.remaining == before.tokens_remaining - 1
    after = await tb.peek(**kw)
    assert after.tokens_remaining == d.remaining


@pytest.mark.parametrize("options", [{}, {"single_connection_client": True}])
async def test_every_redis_client_shape_gets_the_same_decisions(
    redis_url: str, unique_name: str, settings: TaskQSettings, options: dict[str, Any]
) -> None:
    """The direct path (plain client) and execute_command (other clients) agree."""
    client = aredis.Redis.from_url(redis_url, **options)
    try:
        kw: dict[str, Any] = {"redis_client": client, "settings": settings}
        tb = TokenBucket(unique_name, capacity=3, refill_per_second=0)
        gcra = SlidingWindow(unique_name, limit=2, window=timedelta(minutes=1), style="gcra")
        log = SlidingWindow(unique_name, limit=2, window=timedelta(minutes=1))
        assert [(await tb.acquire(**kw)).remaining for _ in range(3)] == [2, 1, 0]
        assert not (await tb.acquire(**kw)).allowed
        assert [(await gcra.acquire(**kw)).allowed for _ in range(3)] == [True, True, False]
        decisions = [await log.acquire(**kw) for _ in range(3)]
        assert [d.allowed for d in decisions] == [True, True, False]
        assert decisions[0].request_id
        assert decisions[2].request_id is None
    finally:
        await client.aclose()


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_postgres_acquire_errors_and_dead_connections(
    pg_url: Any, flavour: str, settings: TaskQSettings, unique_name: str
) -> None:
    """The one-statement Postgres acquire runs on the pool's psycopg connection directly:
    a missing table still says "run migrate", a connection killed under the pool fails
    one acquire (as taskq's ``StoreUnavailable``, chained to SQLAlchemy's ``DBAPIError``)
    and is replaced, and a connection goes back to the pool with autocommit off."""
    from sqlalchemy.exc import DBAPIError

    import taskq.ratelimit as arl
    import taskq_sync.ratelimit as srl
    from taskq.db.engine import make_engine as make_async
    from taskq.exceptions import SchemaNotReady, StoreUnavailable
    from taskq_sync.db.engine import make_engine as make_sync

    rl = arl if flavour == "async" else srl
    make = make_async if flavour == "async" else make_sync
    one = settings.model_copy(update={"pool_size": 1})
    engine = make(pg_url, settings=one)
    elsewhere = make(pg_url, settings=one.model_copy(update={"schema_name": "no_such_schema"}))
    try:
        tb = rl.TokenBucket(unique_name, capacity=5, refill_per_second=0, backend="postgres")
        with pytest.raises(SchemaNotReady):
            await call(tb.acquire(pg_pool=elsewhere))
        assert (await call(tb.acquire(pg_pool=engine))).remaining == 4
        async with aconnect(engine, autocommit=False) as conn:
            autocommit = conn_driver(conn).autocommit
        assert autocommit is False
        killer = make(pg_url, settings=one)
        async with aconnect(killer, autocommit=True) as kconn:
            await call(
                kconn.exec_driver_sql(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND pid <> pg_backend_pid()"
                )
            )
        await call(killer.dispose())
        with pytest.raises(StoreUnavailable) as caught:
            await call(tb.acquire(pg_pool=engine))
        assert isinstance(caught.value.__cause__, DBAPIError)
        assert (await call(tb.acquire(pg_pool=engine))).remaining == 3
    finally:
        await call(engine.dispose())
        await call(elsewhere.dispose())


def conn_driver(conn: Any) -> Any:
    """The psycopg connection under a SQLAlchemy connection (async or sync)."""
    sync_conn = getattr(conn, "sync_connection", None) or conn
    return sync_conn.connection.driver_connection


@contextlib.asynccontextmanager
async def aconnect(engine: Any, *, autocommit: bool) -> Any:
    """``engine.connect()`` for an async or a sync engine, as one async context."""
    bound = engine.execution_options(isolation_level="AUTOCOMMIT") if autocommit else engine
    if hasattr(bound, "sync_engine"):
        async with bound.connect() as conn:
            yield conn
    else:
        with bound.connect() as conn:
            yield conn


@pytest.mark.parametrize("flavour", ["async", "sync"])
async def test_a_pooled_redis_connection_killed_by_the_server_is_replaced(
    redis_url: str, unique_name: str, settings: TaskQSettings, flavour: str
) -> None:
    """The direct path drops a dead held connection and runs the command once more
    through redis-py (its retry policy), so the caller sees a normal decision."""
    import redis as sync_redis

    import taskq_sync.ratelimit as srl

    name = f"tq-{unique_name}"
    client: Any = (
        aredis.Redis.from_url(redis_url, client_name=name)
        if flavour == "async"
        else sync_redis.Redis.from_url(redis_url, client_name=name)
    )
    admin = sync_redis.Redis.from_url(redis_url)
    rl: Any = __import__("taskq.ratelimit", fromlist=["TokenBucket"]) if flavour == "async" else srl
    try:
        kw: dict[str, Any] = {"redis_client": client, "settings": settings}
        tb = rl.TokenBucket(unique_name, capacity=5, refill_per_second=0)
        assert (await call(tb.acquire(**kw))).remaining == 4
        held = [c["id"] for c in admin.client_list() if c["name"] == name]
        assert len(held) == 1  # the one connection the acquire holds
        admin.client_kill_filter(_id=held[0])
        d = await call(tb.acquire(**kw))
        assert d.allowed
        assert d.remaining == 3
    finally:
        admin.close()
        await call(client.aclose() if flavour == "async" else client.close())
