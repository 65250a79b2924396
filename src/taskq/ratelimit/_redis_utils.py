"""Running the Lua scripts on Redis, and falling back to Postgres when Redis is down.

The hot path is ONE ``EVALSHA`` round trip (:func:`evalsha`). For a plain ``Redis``
client (redis-py >= 5.3, not a subclass, not ``single_connection_client``) the command,
pre-encoded once per primitive (:func:`taskq.ratelimit._lua.evalsha_command`), is
written straight to a connection borrowed from the client's pool and the reply read
back: redis-py's per-command machinery (argument encoding and framing, the retry
wrapper, event dispatch and its own metrics) costs more client CPU than the script
costs the server, and is what kept an acquire well below a raw ``EVALSHA``. Any other
client (a cluster, a subclass, a single-connection client) goes through
``execute_command``. A connection error on the direct path drops that connection and
runs the command once more through ``execute_command``, which applies the client's own
retry policy (as redis-py would have). ``NOSCRIPT`` (the server lost its script cache)
is answered by ``SCRIPT LOAD`` and one more run (:func:`reload_and_run`); a connection
error that survives goes to :func:`fallback_engine`.
"""

from __future__ import annotations

import importlib.util
import logging
from typing import TYPE_CHECKING, Any

from taskq.exceptions import RedisExtraMissing, RedisUnavailableError
from taskq.ratelimit import _sql
from taskq.ratelimit._common import require_engine
from taskq.ratelimit._lua import LuaScript, evalsha_command
from taskq.settings import TaskQSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis
    from sqlalchemy.ext.asyncio import AsyncEngine

__all__ = [
    "NO_SCRIPT",
    "REDIS_DOWN",
    "evalsha",
    "fallback_engine",
    "redis_down_errors",
    "reload_and_run",
    "require_redis",
]

_log = logging.getLogger("taskq.ratelimit")


class _NeverRaised(Exception):
    """Stands in for redis-py's exceptions when redis-py is not installed."""


def _errors() -> tuple[
    type[BaseException], type[BaseException], tuple[type[BaseException], ...], Any
]:
    try:
        from redis import __version__
        from redis.asyncio import Redis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import NoScriptError, ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:
        return _NeverRaised, _NeverRaised, (_NeverRaised,), None
    major, minor = (int(part) for part in __version__.split(".")[:2])
    direct = Redis if (major, minor) >= (5, 3) else None  # pool.get_connection() takes no args
    return NoScriptError, ResponseError, (RedisConnectionError, RedisTimeoutError), direct


NO_SCRIPT, _REPLY_ERROR, REDIS_DOWN, _DIRECT_CLIENT = _errors()
"""``NOSCRIPT`` (reload and retry), an error reply, the errors that mean "Redis is down"
(fall back), and the client class the direct path serves."""


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


async def evalsha(
    client: Any, script: LuaScript, args: tuple[bytes, ...], command: bytes | None = None
) -> Any:
    """Run ``script`` with ``args`` (the key first): one ``EVALSHA``, reloading on ``NOSCRIPT``.

    ``command`` is the same call pre-encoded with the script's current ``sha`` (see
    :func:`~taskq.ratelimit._lua.evalsha_command`); it is built here when not given. On
    the direct path (see the module doc) an error reply leaves the connection usable;
    anything else (a dead connection, a timeout, a cancelled task with the reply still
    unread) disconnects it before it goes back to the pool.
    """
    try:
        if client.__class__ is not _DIRECT_CLIENT or client.connection is not None:
            return await client.execute_command("EVALSHA", script.sha, b"1", *args)
        if command is None:
            command = evalsha_command(script.sha, *args)
        pool = client.connection_pool
        conn = await pool.get_connection()
        try:
            await conn.send_packed_command((command,))  # an iterable of chunks (sync and async)
            reply = await conn.read_response()
        except _REPLY_ERROR:
            await pool.release(conn)
            raise
        except REDIS_DOWN:
            await conn.disconnect()
            await pool.release(conn)
            return await client.execute_command("EVALSHA", script.sha, b"1", *args)
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        await pool.release(conn)
        return reply
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


async def reset_stored(
    name: str,
    redis_key: str,
    *,
    backend: str,
    redis_client: Redis | None,
    pg_pool: AsyncEngine | None,
    settings: TaskQSettings | None,
) -> None:
    """Forget a primitive's stored state: Postgres ``DELETE``, or Redis ``DEL`` with fallback.

    Shared by every primitive whose memory state is reset by the caller.
    """
    if backend == "postgres":
        await _sql.sql_reset(require_engine(pg_pool, name), name)
        return
    client = require_redis(redis_client, name)
    try:
        await client.delete(redis_key)
    except REDIS_DOWN as exc:
        engine = fallback_engine(name, exc, pg_pool, settings)
        if engine is None:
            raise
        await _sql.sql_reset(engine, name)
