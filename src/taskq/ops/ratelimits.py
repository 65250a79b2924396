# sync twin: src/taskq_sync/ops/ratelimits.py
"""Rate-limit state for operators (``tq.rate_limits``): list with peek state, peek, reset.

The buckets are the registry's (``taskq.ratelimit.registry`` unless another is given:
whatever the application registered, plus the primitives its actors declare, see
:meth:`RateLimitsClient.register_actors`) and the rows published to
``rate_limit_buckets`` (Postgres-backed buckets and keyed buckets materialised by
workers), rebuilt from their stored configuration. Peeking consumes nothing. A reset
refills a bucket at once and is logged at WARNING: it lets through a burst the limit
was there to stop.
"""

from __future__ import annotations

import builtins
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import transaction
from taskq.db.tables import rate_limit_buckets
from taskq.ratelimit import _sql
from taskq.ratelimit.decision import RateLimitState
from taskq.ratelimit.registry import RateLimitRegistry
from taskq.ratelimit.sliding_window import SlidingWindow
from taskq.ratelimit.token_bucket import TokenBucket
from taskq.settings import TaskQSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis

    from taskq.actor import ActorRef

__all__ = ["RateLimitInfo", "RateLimitsClient"]

_log = logging.getLogger("taskq.ratelimit")

RateLimit = TokenBucket | SlidingWindow


@dataclass(frozen=True, slots=True)
class RateLimitInfo:
    """One rate limit: where it comes from and, unless the peek failed, its state."""

    name: str
    kind: str
    """``token_bucket`` or ``sliding_window``."""
    backend: str
    source: str
    """``registry`` (declared in code) or ``stored`` (rebuilt from ``rate_limit_buckets``)."""
    state: RateLimitState | None
    error: str | None = None
    """Why there is no state (Redis unreachable, no Redis URL, ...)."""

    def to_json(self) -> dict[str, Any]:
        """The limit and its peek state as a JSON object."""
        state = self.state
        return {
            "name": self.name,
            "kind": self.kind,
            "backend": self.backend,
            "source": self.source,
            "error": self.error,
            "state": None
            if state is None
            else {
                "is_exhausted": state.is_exhausted,
                "tokens_remaining": state.tokens_remaining,
                "remaining": state.remaining,
                "retry_after_s": state.retry_after.total_seconds()
                if state.retry_after is not None
                else None,
                "capacity": state.capacity,
                "limit": state.limit,
                "window_s": state.window.total_seconds() if state.window is not None else None,
                "style": state.style,
                "refill_per_second": state.refill_per_second,
                "backend": state.backend,
            },
        }


def _rebuild(row: Any) -> RateLimit | None:
    """A primitive equal to the one that wrote ``row``, when the row says enough."""
    config = row["config"] if isinstance(row["config"], dict) else {}
    try:
        if row["kind"] == "token_bucket":
            return TokenBucket(
                row["bucket_name"],
                float(row["capacity"]),
                float(row["refill_per_second"]),
                backend=config.get("backend", "postgres"),
            )
        if row["window_s"] is not None:
            return SlidingWindow(
                row["bucket_name"],
                int(row["capacity"]),
                timedelta(seconds=float(row["window_s"])),
                backend="postgres",
                style=row["kind"],
            )
    except (TypeError, ValueError):
        return None
    return None


class RateLimitsClient:
    """Peek and reset rate limits on ``engine`` (Postgres-backed state) and ``redis_client``."""

    def __init__(
        self,
        engine: AsyncEngine,
        *,
        registry: RateLimitRegistry | None = None,
        redis_client: Redis | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        from taskq.ratelimit.registry import registry as default_registry

        self.engine = engine
        self.registry = registry if registry is not None else default_registry
        self.redis_client = redis_client
        self.settings = settings
        self._rows: dict[str, dict[str, Any]] = {}

    def register_actors(self, actors: Iterable[ActorRef[Any, Any]]) -> None:
        """Register the rate-limit primitives ``actors`` declare (as a worker does at boot)."""
        for ref in actors:
            for item in ref.rate_limits:
                if isinstance(item, TokenBucket | SlidingWindow):
                    self.registry.register(item)

    async def _primitives(self) -> dict[str, tuple[RateLimit, str]]:
        found: dict[str, tuple[RateLimit, str]] = {
            name: (p, "registry") for name, p in self.registry.rate_limits().items()
        }
        self._rows = {}
        async with transaction(self.engine, readonly=True) as conn:
            rows = (await conn.execute(select(rate_limit_buckets))).mappings().all()
        for row in rows:
            name = str(row["bucket_name"])
            self._rows[name] = dict(row)
            if name not in found:
                rebuilt = _rebuild(row)
                if rebuilt is not None:
                    found[name] = (rebuilt, "stored")
        return dict(sorted(found.items()))

    async def _info(self, primitive: RateLimit, source: str) -> RateLimitInfo:
        kind = "token_bucket" if isinstance(primitive, TokenBucket) else "sliding_window"
        try:
            state: RateLimitState | None = await primitive.peek(
                redis_client=self.redis_client, pg_pool=self.engine, settings=self.settings
            )
            error = None
        except Exception as exc:  # one unreadable bucket never hides the others
            state, error = None, f"{type(exc).__name__}: {exc}"
        return RateLimitInfo(primitive.name, kind, primitive.backend, source, state, error)

    async def list(self) -> builtins.list[RateLimitInfo]:
        """Every known rate limit with its peek state, by name."""
        return [await self._info(p, src) for p, src in (await self._primitives()).values()]

    async def peek(self, name: str) -> RateLimitInfo:
        """One rate limit's state; ``KeyError`` when no registered or stored limit has ``name``."""
        found = (await self._primitives()).get(name)
        if found is None:
            raise KeyError(f"no rate limit named {name!r} is registered or stored")
        return await self._info(*found)

    async def reset(self, name: str) -> RateLimitInfo:
        """Refill ``name`` to full at once (idempotent), logged at WARNING; returns the new
        state. ``KeyError`` when there is no such limit (nothing is changed)."""
        found = (await self._primitives()).get(name)
        if found is None:
            raise KeyError(f"no rate limit named {name!r} is registered or stored")
        primitive, source = found
        row = self._rows.get(name)
        await primitive.reset(
            redis_client=self.redis_client, pg_pool=self.engine, settings=self.settings
        )
        if row is not None:
            # A Postgres reset deletes the bucket's row; put its configuration back (state
            # empty: full) so the bucket stays listed, as it was before the reset.
            await _sql.sql_publish(
                self.engine,
                name,
                kind=row["kind"],
                capacity=row["capacity"],
                refill_per_second=row["refill_per_second"],
                window_s=row["window_s"],
                config=row["config"] if isinstance(row["config"], dict) else {},
            )
        _log.warning(
            "ratelimit-reset bucket=%s backend=%s source=%s", name, primitive.backend, source
        )
        return await self._info(primitive, source)
