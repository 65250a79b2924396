# sync twin: src/taskq_sync/ratelimit/_redis_utils.py
"""Running the Lua scripts on Redis, and falling back to Postgres when Redis is down.

The hot path is ONE ``EVALSHA`` round trip (:func:`evalsha`), through redis-py's public
connection API. For a plain ``Redis`` client (redis-py >= 5.3, not a subclass, not
``single_connection_client``) the command, pre-encoded once per primitive
(:func:`taskq.ratelimit._lua.evalsha_command`), is sent with the connection's
``send_packed_command`` and its reply read with ``read_response`` (parsed by
``hiredis``, which the ``redis`` extra installs): redis-py's per-command machinery
(argument encoding and framing, the retry wrapper, event dispatch and its own metrics)
costs more client CPU than the script costs the server.

The connection is *held*: taken from the client's pool once (``get_connection``) and
kept idle, beside that pool, for the next acquire, instead of a pool checkout and
checkin per acquire. A redis-py checkout is not free: besides the pool lock and its
metrics, it probes the socket for unexpected data (three system calls) before every
command, which on a virtual machine costs as much as the script itself. A held
connection cannot have unread data: every path that could leave a reply unread (a
timeout, a cancelled task, a dead socket) disconnects it and gives it back to the pool
(``release``). At most :data:`HELD_IDLE_MAX` connections (and 1/16 of the pool's size)
stay held per pool (concurrent acquirers each take their own, and extra ones go back to
the pool after use); they stay counted as in use by the pool, so ``pool.disconnect()``
(``client.close()``) closes them too, and a closed one reconnects on its next command as
any redis-py connection does. Pools that wait for a free connection
(``BlockingConnectionPool``, a subclass) or allow fewer than 32 are never held from:
the checkout then happens per acquire. A forked child drops what it inherited.

Any other client (a cluster, a subclass, a single-connection client) goes through
``execute_command``. A connection error on the direct path drops that connection and
runs the command once more through ``execute_command``, which applies the client's own
retry policy (as redis-py would have). ``NOSCRIPT`` (the server lost its script cache)
is answered by ``SCRIPT LOAD`` and one more run (:func:`reload_and_run`); a connection
error that survives goes to :func:`fallback_engine`.
"""

from __future__ import annotations

import importlib.util
import logging
import os
from typing import TYPE_CHECKING, Any

from taskq._acompat import ASYNC
from taskq._compat import redis as compat_redis
from taskq.exceptions import RedisExtraMissing, RedisUnavailableError
from taskq.ratelimit import _sql
from taskq.ratelimit._common import require_engine
from taskq.ratelimit._lua import LuaScript, evalsha_command
from taskq.ratelimit.settings_redis import settings_redis
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
    type[BaseException], type[BaseException], tuple[type[BaseException], ...], Any, Any
]:
    try:
        from redis import __version__
        from redis.asyncio import ConnectionPool, Redis
        from redis.exceptions import ConnectionError as RedisConnectionError
        from redis.exceptions import NoScriptError, ResponseError
        from redis.exceptions import TimeoutError as RedisTimeoutError
    except ImportError:
        return _NeverRaised, _NeverRaised, (_NeverRaised,), None, None
    major, minor = (int(part) for part in __version__.split(".")[:2])
    direct = Redis if (major, minor) >= (5, 3) else None  # pool.get_connection() takes no args
    down = (RedisConnectionError, RedisTimeoutError)
    return NoScriptError, ResponseError, down, direct, ConnectionPool


NO_SCRIPT, _REPLY_ERROR, REDIS_DOWN, _DIRECT_CLIENT, _HOLDING_POOL = _errors()
"""``NOSCRIPT`` (reload and retry), an error reply, the errors that mean "Redis is down"
(fall back), the client class the direct path serves, and the one pool class whose
connections may be held (see the module doc)."""
HELD_IDLE_MAX = 8
"""Idle connections kept held per pool (and at most 1/16 of the pool's ``max_connections``:
6 of redis-py's default 100); more concurrent acquirers check out and return."""

_HOLD_MIN_POOL = 32
"""A pool bounded below this many connections is never held from (see the module doc)."""

_HELD_ATTRIBUTE = "_taskq_held_connections"
"""Where a pool keeps its held idle connections: on the pool object itself, so that they
live and die with it (a held connection refers back to its pool, so a table keyed by the
pool would keep every pool alive)."""

_FALLBACK_BY_DEFAULT: bool = TaskQSettings.model_fields["rate_limit_pg_fallback_enabled"].default
"""Whether a caller that passed no settings gets the fallback: the setting's default."""

_fork_generation = 0
"""Bumped in a forked child: what a pool held before the fork belongs to the parent."""


def _after_fork_in_child() -> None:
    global _fork_generation
    _fork_generation += 1


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Held(list[Any]):
    """The idle connections held from one pool, how many it may keep, and in which process."""

    __slots__ = ("cap", "generation")

    def __init__(self, cap: int) -> None:
        super().__init__()
        self.cap = cap
        self.generation = _fork_generation


def redis_down_errors() -> tuple[type[BaseException], ...]:
    """The redis-py errors that trigger the Postgres fallback."""
    return REDIS_DOWN


def require_redis(client: Redis | None, name: str, settings: TaskQSettings | None = None) -> Redis:
    """The client, else the one of ``settings`` / ``TASKQ_REDIS_URL``
    (:func:`~taskq.ratelimit.settings_redis.settings_redis`), or a clear error saying
    what to pass or install."""
    if client is not None:
        return client
    configured = settings_redis(settings)
    if configured is not None:
        return configured
    if importlib.util.find_spec("redis") is None:  # pragma: no cover - dev env has it
        raise RedisExtraMissing(
            f'{name!r} uses backend="redis" but the redis package is not installed: '
            'pip install "taskq-py[redis]" (or use backend="postgres")'
        )
    raise RedisUnavailableError(
        f'{name!r} uses backend="redis": pass redis_client= (a redis-py client), '
        'set TASKQ_REDIS_URL, or use backend="postgres" or "memory"'
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
        held = getattr(pool, _HELD_ATTRIBUTE, None)
        if held is None or held.generation != _fork_generation:
            held = _holdable(pool)
            setattr(pool, _HELD_ATTRIBUTE, held)
        conn = held.pop() if held else await pool.get_connection()
        try:
            if ASYNC:
                # redis-py's asyncio write costs a task per command: see taskq._compat.redis
                if not compat_redis.write(conn, command):
                    await conn.send_packed_command((command,))
            else:
                await conn.send_packed_command((command,))  # chunks, as both flavours take
            reply = await conn.read_response()
        except _REPLY_ERROR:
            await _checkin(pool, held, conn)
            raise
        except REDIS_DOWN:
            await conn.disconnect()
            await pool.release(conn)
            return await client.execute_command("EVALSHA", script.sha, b"1", *args)
        except BaseException:
            await conn.disconnect()
            await pool.release(conn)
            raise
        await _checkin(pool, held, conn)
        return reply
    except NO_SCRIPT:
        return await reload_and_run(client, script, args)


def _holdable(pool: Any) -> _Held:
    """A new held list for ``pool``: empty, and allowed none where the pool cannot spare any."""
    size = pool.max_connections
    if pool.__class__ is _HOLDING_POOL and size >= _HOLD_MIN_POOL:
        return _Held(min(HELD_IDLE_MAX, size // 16))
    return _Held(0)


async def _checkin(pool: Any, held: _Held, conn: Any) -> None:
    """Keep ``conn`` held for the next acquire, or give it back to ``pool``."""
    if len(held) < held.cap:
        held.append(conn)
    else:
        await pool.release(conn)


def fallback_engine(
    name: str,
    exc: BaseException | None,
    pg_pool: AsyncEngine | None,
    settings: TaskQSettings | None,
) -> AsyncEngine | None:
    """The engine to retry on after Redis failed with ``exc`` (``None``: would fail over
    now, the circuit being open), or ``None`` to re-raise.

    Falls back only when the caller's ``settings`` enable it
    (``TASKQ_RATE_LIMIT_PG_FALLBACK_ENABLED``; without settings, its default: true) and a
    ``pg_pool`` was given. Logs nothing: the client's circuit
    (:mod:`taskq.ratelimit.circuit`) logs the outage once per state change. The
    environment is read where the settings were loaded, never here.
    """
    if pg_pool is None:
        return None
    enabled = (
        settings.rate_limit_pg_fallback_enabled if settings is not None else _FALLBACK_BY_DEFAULT
    )
    return pg_pool if enabled else None


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
    client = require_redis(redis_client, name, settings)
    try:
        await client.delete(redis_key)
    except REDIS_DOWN as exc:
        from taskq.ratelimit.circuit import circuit_for  # the circuit imports this module

        engine = fallback_engine(name, exc, pg_pool, settings)
        circuit_for(client, settings).failed(name, exc, falls_back=engine is not None)
        if engine is None:
            raise
        await _sql.sql_reset(engine, name)
