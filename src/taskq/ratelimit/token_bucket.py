# sync twin: src/taskq_sync/ratelimit/token_bucket.py
"""``TokenBucket``: throughput with burst tolerance, on Redis, Postgres/SQLite or memory."""

from __future__ import annotations

import logging
import math
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from taskq._acompat import ASYNC
from taskq.clock import Clock
from taskq.constants import validate_name
from taskq.db.engine import with_schema
from taskq.ratelimit import _redis_utils as rru
from taskq.ratelimit import _sql
from taskq.ratelimit._algorithms import redis_ttl_seconds, tb_step, to_us
from taskq.ratelimit._common import (
    ALLOWED_WAIT,
    check_count,
    check_number,
    decision,
    memory_now_us,
    missing_clock,
    redis_decision,
    require_engine,
    retry,
)
from taskq.ratelimit._lua import TOKEN_BUCKET, EncodedCall, redis_key
from taskq.ratelimit._memory import MemoryTokenBucket
from taskq.ratelimit.circuit import bounded, circuit_for
from taskq.ratelimit.decision import RateLimitDecision, RateLimitState
from taskq.ratelimit.refs import validate_backend
from taskq.settings import TaskQSettings
from taskq.telemetry import acquire_started, record_decision

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["TokenBucket"]

_log = logging.getLogger("taskq.ratelimit")


class TokenBucket:
    """A bucket of ``capacity`` tokens refilled continuously at ``refill_per_second``.

    It starts full; each ``acquire`` takes ``count`` tokens. ``refill_per_second=0`` is a
    fixed quota that never refills (denials then carry ``retry_after=None``).
    """

    def __init__(
        self,
        name: str,
        capacity: float,
        refill_per_second: float,
        backend: Literal["redis", "postgres", "memory"] = "redis",
        ttl: timedelta | None = None,
    ) -> None:
        self.name = validate_name(name, kind="rate limit")
        self.metrics_name = self.name
        """The ``bucket`` its decisions are counted under (a keyed bucket's base name)."""
        self.capacity = check_number(capacity, "capacity", minimum=0, strict=True)
        self.refill_per_second = check_number(
            refill_per_second, "refill_per_second", minimum=0, strict=False
        )
        self.backend = validate_backend(backend)
        if ttl is not None and not isinstance(ttl, timedelta):
            raise TypeError("ttl must be a timedelta or None")
        self.ttl = ttl
        self.redis_key = redis_key(self.name, "tb")
        self._memory = MemoryTokenBucket()
        # The script's key and configuration, encoded once: the acquire hot path passes
        # them as they are (one EVALSHA, nothing to convert). See _lua.TOKEN_BUCKET.
        self._redis_args_one = (self.redis_key.encode(), *self._redis_spec(1.0))
        self._one = EncodedCall(TOKEN_BUCKET, self._redis_args_one)  # a one-token acquire
        self._pg: _sql.PgAutocommit | None = None

    def __repr__(self) -> str:
        return (
            f"TokenBucket({self.name!r}, capacity={self.capacity:g}, "
            f"refill_per_second={self.refill_per_second:g}, backend={self.backend!r})"
        )

    @property
    def config(self) -> tuple[Any, ...]:
        """What makes two instances the same bucket (registry idempotency compares it)."""
        return (
            "token_bucket",
            self.name,
            self.capacity,
            self.refill_per_second,
            self.backend,
            self.ttl,
        )

    @property
    def ttl_seconds(self) -> int:
        """Redis key TTL: ``ceil(capacity / refill * 2) + 60`` s, or 24 h with no refill."""
        if self.refill_per_second == 0:
            default = 86_400.0
        else:
            default = math.ceil(self.capacity / self.refill_per_second * 2) + 60
        return redis_ttl_seconds(default, self.ttl)

    def memory_quota_consumed(self) -> bool:
        """True for a memory fixed-quota bucket with some quota taken (never idle-evicted)."""
        return (
            self.backend == "memory"
            and self.refill_per_second == 0
            and self._memory.consumed(self.capacity)
        )

    def _redis_spec(self, count: float) -> tuple[bytes, bytes, bytes, bytes]:
        """The script's configuration arguments: capacity, refill, count, ttl_s."""
        return (
            repr(self.capacity).encode(),
            repr(self.refill_per_second).encode(),
            repr(count).encode(),
            str(self.ttl_seconds).encode(),
        )

    def _script_args(self, count: float, *mode: bytes) -> tuple[bytes, ...]:
        if count == 1.0:
            return (*self._redis_args_one, *mode)
        return (self._redis_args_one[0], *self._redis_spec(count), *mode)

    async def _postgres(self, engine: AsyncEngine, count: float) -> RateLimitDecision:
        self._pg = _sql.pg_autocommit(self._pg, engine)
        allowed, tokens, retry_us = await _sql.sql_token_bucket(
            engine,
            self.name,
            capacity=self.capacity,
            rate=self.refill_per_second,
            count=count,
            pg=self._pg,
        )
        return decision(self.name, "postgres", allowed, tokens, retry_us)

    async def acquire(
        self,
        count: float = 1.0,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> RateLimitDecision:
        """Try to take ``count`` tokens; the decision says whether it worked and when to retry.

        ``clock`` drives the memory backend only; Redis and Postgres use their own clock.
        Redis: one ``EVALSHA`` with the arguments encoded at construction; the fallback
        machinery runs only when Redis raised. Postgres: one statement (see ``_sql``).
        Counted in ``taskq.rate_limit.decisions`` under :attr:`metrics_name`
        (:mod:`taskq.telemetry`).
        """
        started = acquire_started()
        if count.__class__ is not float or not 0.0 < count <= self.capacity:
            count = check_count(count, self.capacity)
        if self.backend == "memory":  # no I/O: not one more coroutine per acquire
            taken = self._take_memory(count, clock)
        else:
            taken = await self._take_stored(count, redis_client, pg_pool, settings)
        record_decision(self.metrics_name, taken, started, "token_bucket")
        return taken

    def _take_memory(self, count: float, clock: Clock | None) -> RateLimitDecision:
        if clock is None:
            raise missing_clock(self.name)
        allowed, tokens, retry_us = self._memory.take(
            to_us(clock.now()), self.capacity, self.refill_per_second, count
        )
        if allowed:
            return RateLimitDecision(True, tokens, ALLOWED_WAIT, self.name, "memory")
        return RateLimitDecision(False, tokens, retry(retry_us), self.name, "memory")

    async def _take_stored(
        self,
        count: float,
        redis_client: Redis | None,
        pg_pool: AsyncEngine | None,
        settings: TaskQSettings | None,
    ) -> RateLimitDecision:
        """Redis (with the Postgres fallback) or Postgres."""
        if self.backend == "redis":
            client = rru.require_redis(redis_client, self.name, settings)
            circuit = circuit_for(client, settings)
            if circuit.is_open:  # Redis failed lately: straight to the fallback
                engine = rru.fallback_engine(self.name, None, pg_pool, settings)
                if engine is not None and circuit.skip_redis():
                    return await self._postgres(with_schema(engine, settings=settings), count)
            try:
                if ASYNC:
                    reply = await bounded(circuit.timeout_s, self._redis_take(client, count))
                else:
                    reply = self._redis_take(client, count)
            except rru.REDIS_DOWN as exc:
                engine = rru.fallback_engine(self.name, exc, pg_pool, settings)
                circuit.failed(self.name, exc, falls_back=engine is not None)
                if engine is None:
                    raise
                engine = with_schema(engine, settings=settings)
                return await self._postgres(engine, count)
            circuit.succeeded()
            return redis_decision(self.name, reply)
        return await self._postgres(
            with_schema(require_engine(pg_pool, self.name), settings=settings), count
        )

    async def _redis_take(self, client: Any, count: float) -> Any:
        if count == 1.0:
            return await rru.evalsha(
                client, TOKEN_BUCKET, self._redis_args_one, self._one.command()
            )
        return await rru.evalsha(client, TOKEN_BUCKET, self._script_args(count))

    async def refund(
        self,
        decision: RateLimitDecision,
        *,
        count: float = 1.0,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        """Give ``count`` tokens back after a rollback (never after the actor succeeded).

        Goes to the backend that made ``decision`` (a Postgres one, made by the SQL
        backend or the Redis fallback, needs ``pg_pool``: without it the refund is a no-op
        that logs a warning). A denied decision took nothing and refunds nothing.
        """
        if not decision.allowed:
            return
        count = check_count(count, self.capacity)
        if decision.backend == "memory":
            self._memory.refund(
                memory_now_us(clock, self.name),
                capacity=self.capacity,
                rate=self.refill_per_second,
                count=count,
            )
        elif decision.backend == "redis":
            client = rru.require_redis(redis_client, self.name, settings)
            await rru.evalsha(client, TOKEN_BUCKET, self._script_args(count, b"refund"))
        elif pg_pool is None:
            _log.warning("ratelimit.refund_noop bucket=%s backend=postgres no pg_pool", self.name)
        else:
            await _sql.sql_token_bucket_refund(
                with_schema(pg_pool, settings=settings),
                self.name,
                capacity=self.capacity,
                rate=self.refill_per_second,
                count=count,
            )

    async def peek(
        self,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> RateLimitState:
        """The bucket's current tokens (after refill) without taking any."""
        if self.backend == "memory":
            r = self._memory.step(
                memory_now_us(clock, self.name),
                capacity=self.capacity,
                rate=self.refill_per_second,
                count=1.0 if self.capacity >= 1 else self.capacity,
                consume=False,
            )
            return self._state("memory", r.tokens)
        if self.backend == "postgres":
            return await self._peek_postgres(
                with_schema(require_engine(pg_pool, self.name), settings=settings)
            )
        client = rru.require_redis(redis_client, self.name, settings)
        circuit = circuit_for(client, settings)
        if circuit.is_open:
            engine = rru.fallback_engine(self.name, None, pg_pool, settings)
            if engine is not None and circuit.skip_redis():
                return await self._peek_postgres(with_schema(engine, settings=settings))
        try:
            args = self._script_args(min(1.0, self.capacity), b"peek")
            if ASYNC:
                reply = await bounded(circuit.timeout_s, rru.evalsha(client, TOKEN_BUCKET, args))
            else:
                reply = rru.evalsha(client, TOKEN_BUCKET, args)
        except rru.REDIS_DOWN as exc:
            engine = rru.fallback_engine(self.name, exc, pg_pool, settings)
            circuit.failed(self.name, exc, falls_back=engine is not None)
            if engine is None:
                raise
            engine = with_schema(engine, settings=settings)
            return await self._peek_postgres(engine)
        circuit.succeeded()
        return self._state("redis", float(reply.split()[1]))

    async def _peek_postgres(self, engine: AsyncEngine) -> RateLimitState:
        tokens, updated_us, _, now_us = await _sql.sql_read(engine, self.name, "token_bucket")
        r = tb_step(
            tokens,
            updated_us,
            now_us,
            capacity=self.capacity,
            rate=self.refill_per_second,
            count=0.0,
            consume=False,
        )
        return self._state("postgres", r.tokens)

    def _state(
        self, backend: Literal["redis", "postgres", "memory"], tokens: float
    ) -> RateLimitState:
        need = min(1.0, self.capacity)
        exhausted = tokens + 1e-9 < need
        wait: float | None = 0.0
        if exhausted:
            wait = (
                None
                if self.refill_per_second == 0
                else (need - tokens) * 1e6 / self.refill_per_second
            )
        return RateLimitState(
            bucket_name=self.name,
            backend=backend,
            is_exhausted=exhausted,
            tokens_remaining=tokens,
            remaining=tokens,
            retry_after=retry(wait),
            capacity=self.capacity,
            limit=None,
            window=None,
            style=None,
            refill_per_second=self.refill_per_second,
        )

    async def reset(
        self,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        """Refill to capacity at once (idempotent): Redis ``DEL``, Postgres ``DELETE``."""
        if self.backend == "memory":
            self._memory.reset()
            return
        await rru.reset_stored(
            self.name,
            self.redis_key,
            backend=self.backend,
            redis_client=redis_client,
            pg_pool=with_schema(pg_pool, settings=settings) if pg_pool is not None else None,
            settings=settings,
        )
