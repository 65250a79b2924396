"""Running the Lua scripts on Redis, and falling back to Postgres when Redis is down.

Scripts run through redis-py's ``Script`` (``EVALSHA``, re-``SCRIPT LOAD`` on
``NOSCRIPT``): one round trip per operation in the steady state.
"""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, cast

from taskq.exceptions import RedisExtraMissing, RedisUnavailableError
from taskq.settings import TaskQSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from redis.commands.core import AsyncScript
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "fallback_engine",
    "redis_down_errors",
    "require_redis",
    "run_script",
]

_log = logging.getLogger("taskq.ratelimit")

_SCRIPTS: dict[bytes, AsyncScript] = {}


def _script(lua: bytes) -> AsyncScript:
    script = _SCRIPTS.get(lua)
    if script is None:
        from redis.commands.core import AsyncScript

        # bytes source: the sha needs no client's encoder, so one object serves every client.
        script = _SCRIPTS[lua] = AsyncScript(cast(Any, None), lua)
    return script


def require_redis(client: Redis | None, name: str) -> Redis:
    """The client, or a clear error saying what to pass or install."""
    if client is not None:
        return client
    if importlib.util.find_spec("redis") is None:  # pragma: no cover - dev env has it
        raise RedisExtraMissing(
            f'{name!r} uses backend="redis" but the redis package is not installed: '
            'pip install "taskq-py[redis]" (or use backend="postgres")'
        )
    raise RedisUnavailableError(
        f'{name!r} uses backend="redis": pass redis_client= (a redis-py client), '
        'or use backend="postgres" or "memory"'
    )


async def run_script(
    client: Redis, lua: bytes, key: str, args: Sequence[Any]
) -> tuple[bool, float, float]:
    """Run one of the scripts on ``key``: ``(allowed, value, wait_us)``.

    NOSCRIPT reloads are redis-py's job.
    """
    reply = await _script(lua)(keys=[key], args=args, client=client)
    allowed, value, wait = reply.split()
    return allowed == b"1" or allowed == "1", float(value), float(wait)


def redis_down_errors() -> tuple[type[BaseException], ...]:
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    return (RedisConnectionError, RedisTimeoutError)


def fallback_engine(
    name: str,
    exc: BaseException,
    pg_pool: AsyncEngine | None,
    settings: TaskQSettings | None,
) -> AsyncEngine | None:
    """The engine to retry on after Redis failed with ``exc``, or ``None`` to re-raise.

    Falls back only when ``TASKQ_RATE_LIMIT_PG_FALLBACK_ENABLED`` (default true) and a
    ``pg_pool`` was given; logs a WARNING with ``backend="redis"``, ``fallback="postgres"``.
    """
    enabled = (settings or TaskQSettings.load()).rate_limit_pg_fallback_enabled
    if not enabled or pg_pool is None:
        return None
    _log.warning(
        "ratelimit.redis_fallback bucket=%s backend=redis fallback=postgres error=%s",
        name,
        exc,
        extra={"bucket": name, "backend": "redis", "fallback": "postgres"},
    )
    return pg_pool
