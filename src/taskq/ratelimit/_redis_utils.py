"""Running the Lua scripts on Redis, and falling back to Postgres when Redis is down.

The hot path is ONE ``EVALSHA`` round trip: the primitives call
``client.execute_command("EVALSHA", script.sha, b"1", key, spec)`` themselves, with the
key and the configuration encoded once at construction, and come here only on the
rare paths: :func:`reload_and_run` after a ``NOSCRIPT`` (the server lost its script
cache: ``SCRIPT LOAD`` and run again) and :func:`fallback_engine` after a connection
error. redis-py's ``Script`` helper is not used: it costs an import, a tuple
concatenation and two extra calls per run, on every acquire.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from taskq.exceptions import RedisExtraMissing, RedisUnavailableError
from taskq.ratelimit._lua import LuaScript
from taskq.settings import TaskQSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "NO_SCRIPT",
    "REDIS_DOWN",
    "fallback_engine",
    "redis_down_errors",
    "reload_and_run",
    "require_redis",
    "run",
]

_log = logging.getLogger("taskq.ratelimit")


class _NeverRaised(Exception):
    """Stands in for redis-py's exceptions when redis-py is not installed."""


def _errors() -> tuple[type[BaseException], tuple[type[BaseException], ...]]:
    try:
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import NoScriptError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:
        return _NeverRaised, (_NeverRaised,)
    return NoScriptError, (RedisConnectionError, RedisTimeoutError)


NO_SCRIPT, REDIS_DOWN = _errors()
"""``NOSCRIPT`` (reload and retry), and the errors that mean "Redis is down" (fall back)."""


def redis_down_errors() -> tuple[type[BaseException], ...]:
    """The redis-py errors that trigger the Postgres fallback."""
    return REDIS_DOWN


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


async def reload_and_run(client: Redis, script: LuaScript, args: tuple[Any, ...]) -> Any:
    """``SCRIPT LOAD`` the script (the server answered ``NOSCRIPT``) and run it again."""
    sha = await client.script_load(script.source)
    script.sha = sha.encode() if isinstance(sha, str) else sha
    runner: Any = client  # redis-py leaves execute_command untyped
    return await runner.execute_command("EVALSHA", script.sha, b"1", *args)


async def run(client: Redis, script: LuaScript, args: tuple[Any, ...]) -> Any:
    """Run ``script`` with ``args`` (the key first): one ``EVALSHA``, reloading on ``NOSCRIPT``.

    The acquire paths inline this; peek, refund and the sliding-window log use it.
    """
    runner: Any = client  # redis-py leaves execute_command untyped
    try:
        return await runner.execute_command("EVALSHA", script.sha, b"1", *args)
    except NO_SCRIPT:
        return await reload_and_run(client, script, args)


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
