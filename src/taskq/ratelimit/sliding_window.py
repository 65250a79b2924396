# sync twin: src/taskq_sync/ratelimit/sliding_window.py
"""``SlidingWindow``: at most ``limit`` requests in any rolling ``window``.

``style="log"`` keeps one entry per accepted request (exact; refundable on Redis by
``ZREM``); ``style="gcra"`` keeps a single theoretical arrival time (constant memory).
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

from taskq._acompat import ASYNC
from taskq._ids import new_request_id
from taskq.clock import Clock
from taskq.constants import validate_name
from taskq.db.engine import with_schema
from taskq.ratelimit import _redis_utils as rru
from taskq.ratelimit import _sql
from taskq.ratelimit._algorithms import gcra_step, log_decide, redis_ttl_seconds, to_us
from taskq.ratelimit._common import (
    ALLOWED_WAIT,
    decision,
    memory_now_us,
    missing_clock,
    redis_decision,
    require_engine,
    retry,
)
from taskq.ratelimit._lua import GCRA, LOG, EncodedCall, redis_key
from taskq.ratelimit._memory import MemoryGcra, MemoryLog
from taskq.ratelimit.circuit import bounded, circuit_for
from taskq.ratelimit.decision import RateLimitDecision, RateLimitState, SlidingWindowStyle
from taskq.ratelimit.refs import validate_backend
from taskq.settings import TaskQSettings
from taskq.telemetry import acquire_started, record_decision

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = ["SlidingWindow"]

_log = logging.getLogger("taskq.ratelimit")
_US = timedelta(microseconds=1)


class SlidingWindow:
    """A rolling-window limiter: ``limit`` requests per ``window``."""

    def __init__(
        self,
        name: str,
        limit: int,
        window: timedelta,
        backend: Literal["redis", "postgres", "memory"] = "redis",
        style: SlidingWindowStyle = "log",
        ttl: timedelta | None = None,
    ) -> None:
        self.name = validate_name(name, kind="rate limit")
        self.metrics_name = self.name
        """The ``bucket`` its decisions are counted under."""
        if isinstance(limit, bool) or not isinstance(limit, int):
            raise TypeError(f"limit must be an int, got {type(limit).__name__}")
        if limit < 1:
            raise ValueError(f"limit must be >= 1, got {limit}")
        if not isinstance(window, timedelta):
            raise TypeError("window must be a timedelta")
        if window <= timedelta(0) or window // _US == 0:
            raise ValueError(f"window must be > timedelta(0), got {window!r}")
        if style not in ("log", "gcra"):
            raise ValueError(f'style must be "log" or "gcra", got {style!r}')
        if ttl is not None and not isinstance(ttl, timedelta):
            raise TypeError("ttl must be a timedelta or None")
        self.limit = limit
        self.window = window
        self.window_us = window // _US
        self.backend = validate_backend(backend)
        self.style: SlidingWindowStyle = style
        self.ttl = ttl
        self.redis_key = redis_key(self.name, style)
        self._gcra = MemoryGcra()
        self._log = MemoryLog()
        self._script = LOG if style == "log" else GCRA
        # The script's key and configuration (limit, window_us, ttl_s), encoded once for
        # the acquire hot path. See _lua.GCRA and _lua.LOG.
        self._redis_args = (
            self.redis_key.encode(),
            str(self.limit).encode(),
            str(self.window_us).encode(),
            str(self.ttl_seconds).encode(),
        )
        self._gcra_call = EncodedCall(GCRA, self._redis_args)
        self._pg: _sql.PgAutocommit | None = None

    def __repr__(self) -> str:
        return (
            f"SlidingWindow({self.name!r}, limit={self.limit}, window={self.window!r}, "
            f"backend={self.backend!r}, style={self.style!r})"
        )

    @property
    def config(self) -> tuple[Any, ...]:
        """What makes two instances the same limiter (registry idempotency compares it)."""
        return (
            "sliding_window",
            self.name,
            self.limit,
            self.window,
            self.backend,
            self.style,
            self.ttl,
        )

    @property
    def ttl_seconds(self) -> int:
        """Redis key TTL: ``2 * window + 60`` s for log, ``window + 60`` s for GCRA."""
        window_s = self.window.total_seconds()
        default = (2 * window_s if self.style == "log" else window_s) + 60
        return redis_ttl_seconds(default, self.ttl)

    def memory_quota_consumed(self) -> bool:
        """Sliding windows always recover on their own, so they are always evictable."""
        return False

    async def _postgres(self, engine: AsyncEngine) -> RateLimitDecision:
        if self.style == "gcra":
            self._pg = _sql.pg_autocommit(self._pg, engine)
            allowed, remaining, retry_us = await _sql.sql_gcra(
                engine, self.name, limit=self.limit, window_us=self.window_us, pg=self._pg
            )
            return decision(self.name, "postgres", allowed, remaining, retry_us)
        allowed, remaining, retry_us, request_id = await _sql.sql_log(
            engine, self.name, limit=self.limit, window_us=self.window_us
        )
        return decision(self.name, "postgres", allowed, remaining, retry_us, request_id)

    async def acquire(
        self,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> RateLimitDecision:
        """Try to admit one request now.

        ``clock`` drives the memory backend only (``RuntimeError`` there without it).
        Redis: one ``EVALSHA`` with the arguments encoded at construction; the fallback
        machinery runs only when Redis raised. Counted in ``taskq.rate_limit.decisions``
        under :attr:`metrics_name`, and traced (:mod:`taskq.telemetry`).
        """
        started = acquire_started()
        if self.backend == "memory":  # no I/O: not one more coroutine per acquire
            taken = self._take_memory(clock)
        else:
            taken = await self._take_stored(redis_client, pg_pool, settings)
        record_decision(self.metrics_name, taken, started, "sliding_window")
        return taken

    def _take_memory(self, clock: Clock | None) -> RateLimitDecision:
        if clock is None:
            raise missing_clock(self.name)
        now_us = to_us(clock.now())
        if self.style == "gcra":
            g = self._gcra.step(now_us, limit=self.limit, window_us=self.window_us, consume=True)
            if g.allowed:
                return RateLimitDecision(True, g.remaining, ALLOWED_WAIT, self.name, "memory")
            return decision(self.name, "memory", False, 0.0, g.retry_after_us)
        ok, remaining, retry_us = self._log.take(now_us, self.limit, self.window_us)
        if ok:
            return RateLimitDecision(
                True, remaining, ALLOWED_WAIT, self.name, "memory", new_request_id()
            )
        return RateLimitDecision(False, 0.0, retry(retry_us), self.name, "memory")

    async def _take_stored(
        self,
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
                    return await self._postgres(with_schema(engine, settings=settings))
            request_id = None if self.style == "gcra" else new_request_id()
            try:
                if ASYNC:
                    reply = await bounded(circuit.timeout_s, self._redis_take(client, request_id))
                else:
                    reply = self._redis_take(client, request_id)
            except rru.REDIS_DOWN as exc:
                engine = rru.fallback_engine(self.name, exc, pg_pool, settings)
                circuit.failed(self.name, exc, falls_back=engine is not None)
                if engine is None:
                    raise
                engine = with_schema(engine, settings=settings)
                return await self._postgres(engine)
            circuit.succeeded()
            return redis_decision(self.name, reply, request_id)
        return await self._postgres(
            with_schema(require_engine(pg_pool, self.name), settings=settings)
        )

    async def _redis_take(self, client: Any, request_id: str | None) -> Any:
        if request_id is None:
            return await rru.evalsha(client, GCRA, self._redis_args, self._gcra_call.command())
        return await rru.evalsha(client, LOG, (*self._redis_args, request_id.encode()))

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
        """Undo an allowed log-style decision: Redis ``ZREM`` of its ``request_id``, or
        on the SQL backend (``pg_pool``) the delete of its window entry.

        Every other case is a no-op: GCRA keeps no per-request state, the memory log does
        not support refunds, and a Postgres decision without ``pg_pool`` only logs a
        warning. ``count`` is accepted for symmetry with ``TokenBucket.refund``; one
        decision is one request.
        """
        if not decision.allowed or decision.request_id is None or self.style != "log":
            return
        if decision.backend == "redis":
            client = rru.require_redis(redis_client, self.name, settings)
            await client.zrem(self.redis_key, decision.request_id)
        elif decision.backend == "postgres":
            if pg_pool is None:
                _log.warning(
                    "ratelimit.refund_noop bucket=%s backend=postgres no pg_pool", self.name
                )
                return
            engine = with_schema(pg_pool, settings=settings)
            await _sql.sql_log_refund(engine, self.name, decision.request_id)

    async def peek(
        self,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> RateLimitState:
        """How many more requests the window would admit now, consuming nothing."""
        if self.backend == "memory":
            now_us = memory_now_us(clock, self.name)
            if self.style == "gcra":
                g = self._gcra.step(
                    now_us, limit=self.limit, window_us=self.window_us, consume=False
                )
                return self._state("memory", g.remaining, g.retry_after_us)
            _, remaining, retry_us, _ = self._log.step(
                now_us, limit=self.limit, window_us=self.window_us, consume=False
            )
            return self._state("memory", remaining, retry_us)
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
        args = self._redis_args if self.style == "gcra" else (*self._redis_args, b"")
        try:
            if ASYNC:
                reply = await bounded(
                    circuit.timeout_s, rru.evalsha(client, self._script, (*args, b"peek"))
                )
            else:
                reply = rru.evalsha(client, self._script, (*args, b"peek"))
        except rru.REDIS_DOWN as exc:
            engine = rru.fallback_engine(self.name, exc, pg_pool, settings)
            circuit.failed(self.name, exc, falls_back=engine is not None)
            if engine is None:
                raise
            engine = with_schema(engine, settings=settings)
            return await self._peek_postgres(engine)
        circuit.succeeded()
        parts = reply.split()
        return self._state("redis", float(parts[1]), float(parts[2]) if len(parts) > 2 else 0.0)

    async def _peek_postgres(self, engine: AsyncEngine) -> RateLimitState:
        if self.style == "gcra":
            _, _, tat, now_us = await _sql.sql_read(engine, self.name, "gcra")
            g = gcra_step(tat, now_us, limit=self.limit, window_us=self.window_us, consume=False)
            return self._state("postgres", g.remaining, g.retry_after_us)
        count, oldest, now_us = await _sql.sql_window_count(engine, self.name, self.window_us)
        allowed, _, retry_us = log_decide(
            count, oldest, now_us, limit=self.limit, window_us=self.window_us
        )
        return self._state("postgres", float(self.limit - count) if allowed else 0.0, retry_us)

    def _state(
        self, backend: Literal["redis", "postgres", "memory"], remaining: float, retry_us: float
    ) -> RateLimitState:
        exhausted = remaining < 1
        return RateLimitState(
            bucket_name=self.name,
            backend=backend,
            is_exhausted=exhausted,
            tokens_remaining=remaining,
            remaining=remaining,
            retry_after=retry(retry_us if exhausted else 0.0),
            capacity=None,
            limit=self.limit,
            window=self.window,
            style=self.style,
            refill_per_second=None,
        )

    async def reset(
        self,
        *,
        redis_client: Redis | None = None,
        pg_pool: AsyncEngine | None = None,
        clock: Clock | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        """Forget every request (idempotent): Redis ``DEL``, Postgres ``DELETE``."""
        if self.backend == "memory":
            self._gcra.reset()
            self._log.reset()
            return
        await rru.reset_stored(
            self.name,
            self.redis_key,
            backend=self.backend,
            redis_client=redis_client,
            pg_pool=with_schema(pg_pool, settings=settings) if pg_pool is not None else None,
            settings=settings,
        )
