"""Running the Lua scripts on Redis, and falling back to Postgres when Redis is down.

The hot path is ONE ``EVALSHA`` round trip (:func:`evalsha`). For a plain ``Redis``
client (redis-py >= 5.3, not a subclass, not ``single_connection_client``) the command,
pre-encoded once per primitive (:func:`taskq.ratelimit._lua.evalsha_command`), is
written straight to a redis-py connection and the reply read back: redis-py's
per-command machinery (argument encoding and framing, the retry wrapper, event dispatch
and its own metrics) costs more client CPU than the script costs the server.

The write itself skips what redis-py's ``socket_timeout`` costs every write
(:func:`_send`): in asyncio, a task and one more turn of the event loop
(``asyncio.wait_for``); on a blocking socket, a ``poll`` before the ``send``. The reply
is read straight from the stream or socket too (:func:`_receive`).

The connection is *held*: taken from the client's pool once and kept idle, beside that
pool, for the next acquire, instead of a pool checkout and checkin per acquire. A
redis-py checkout is not free: besides the pool lock and its metrics, it probes the
socket for unexpected data (three system calls) before every command, which on a
virtual machine costs as much as the script itself. A held connection cannot have
unread data: every path that could leave a reply unread (a timeout, a cancelled task, a
dead socket) disconnects it and gives it back to the pool. At most
:data:`HELD_IDLE_MAX` connections (and 1/16 of the pool's size) stay held per pool
(concurrent acquirers each take their own, and extra ones go back to the pool after
use); they stay counted as in use
by the pool, so ``pool.disconnect()`` (``client.close()``) closes them too, and a closed
one reconnects on its next command as any redis-py connection does. Pools that wait
for a free connection (``BlockingConnectionPool``, a subclass) or allow fewer than 32
are never held from: the checkout then happens per acquire. A forked child drops what it inherited.

Any other client (a cluster, a subclass, a single-connection client) goes through
``execute_command``. A connection error on the direct path drops that connection and
runs the command once more through ``execute_command``, which applies the client's own
retry policy (as redis-py would have). ``NOSCRIPT`` (the server lost its script cache)
is answered by ``SCRIPT LOAD`` and one more run (:func:`reload_and_run`); a connection
error that survives goes to :func:`fallback_engine`.
"""

from __future__ import annotations

import asyncio
import importlib.util
import logging
import os
import socket
from typing import TYPE_CHECKING, Any

from taskq._acompat import ASYNC
from taskq.exceptions import RedisExtraMissing, RedisUnavailableError
from taskq.ratelimit import _sql
from taskq.ratelimit._common import require_engine
from taskq.ratelimit._lua import LuaScript, evalsha_command
from taskq.ratelimit._resp import IncompleteReply, ProtocolError, Push, parse_reply
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
_CONNECTION_ERROR = REDIS_DOWN[0]
"""redis-py's ``ConnectionError``: what a failed write or read raises (see :func:`_send`)."""
_TIMEOUT_ERROR = REDIS_DOWN[-1]
"""redis-py's ``TimeoutError``: what a read past ``socket_timeout`` raises (:func:`_receive`)."""


def _python_readers() -> tuple[Any, ...]:
    """redis-py's pure-Python reply readers (RESP2 and RESP3) of this flavour, whose
    replies :func:`_receive` reads itself; none without redis-py or where it keeps them
    elsewhere."""
    try:
        from redis._parsers import resp2, resp3
    except ImportError:
        return ()
    if ASYNC:
        return (resp2._AsyncRESP2Parser, resp3._AsyncRESP3Parser)
    return (resp2._RESP2Parser, resp3._RESP3Parser)


_PYTHON_READERS = _python_readers()
_READ_SIZE = 65536
"""Bytes asked of the socket per read (redis-py's default ``socket_read_size``)."""
_FD_WRITES = os.name == "posix"
"""Whether a blocking connection's command may be written to its socket's descriptor."""
_write = os.write
"""The descriptor write :func:`_send` makes (a test replaces it to fake a full socket)."""

HELD_IDLE_MAX = 8
"""Idle connections kept held per pool (and at most 1/16 of the pool's ``max_connections``:
6 of redis-py's default 100); more concurrent acquirers check out and return."""

_HOLD_MIN_POOL = 32
"""A pool bounded below this many connections is never held from (see the module doc)."""

_HELD_ATTRIBUTE = "_taskq_held_connections"
"""Where a pool keeps its held idle connections: on the pool object itself, so that they
live and die with it (a held connection refers back to its pool, so a table keyed by the
pool would keep every pool alive)."""

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
            await _send(conn, command)
            reply = await _receive(conn)
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


async def _send(conn: Any, command: bytes) -> None:
    """Write one pre-encoded command on a redis-py connection, open and without health
    checks, at the cost of one system call; anything else: ``send_packed_command``.

    redis-py gives its connections a ``socket_timeout`` (5 s by default since redis-py
    8), and what that timeout costs each write is larger than the write itself:

    - asyncio: ``send_packed_command`` runs the write under ``asyncio.wait_for``, a new
      task and one more turn of the event loop per command. The command goes straight to
      the connection's stream instead. Nothing has to wait: a connection carries one
      command at a time, so what the socket cannot take yet stays in the transport's
      buffer (sent when it can), and the reply's read, under ``socket_timeout``, bounds
      the whole round trip.
    - blocking: a socket with a timeout polls before every ``send``, one more system
      call per command (about 8 µs on a virtual machine). The command is written to the
      socket's descriptor (POSIX, plain TCP or Unix sockets: never a TLS one), which
      takes the ~100 bytes at once into an idle connection's buffer; whatever it does
      not take goes through ``send_packed_command``, under the timeout. A write error is
      redis-py's ``ConnectionError``, as from ``send_packed_command``.
    """
    if ASYNC:
        writer = getattr(conn, "_writer", None)
        if (
            type(writer) is asyncio.StreamWriter
            and not conn.health_check_interval
            and not writer.transport.is_closing()
        ):
            writer.write(command)
            return
    else:
        sock = getattr(conn, "_sock", None)
        if _FD_WRITES and type(sock) is socket.socket and not conn.health_check_interval:
            try:
                sent = _write(sock.fileno(), command)
            except BlockingIOError:
                sent = 0
            except OSError as exc:
                raise _CONNECTION_ERROR(
                    f"Error {exc.errno} while writing to socket. {exc.strerror}."
                ) from exc
            if sent == len(command):
                return
            command = command[sent:]
    await conn.send_packed_command((command,))  # an iterable of chunks (sync and async)


async def _receive(conn: Any) -> Any:
    """Read the reply to the command :func:`_send` wrote, as ``conn.read_response()`` does.

    A connection with one of redis-py's own pure-Python readers (RESP2 or RESP3; not
    hiredis's) on a plain socket (blocking) or stream (asyncio), without health checks,
    is read here instead (:func:`_read_reply`): one read of the socket or stream under
    ``socket_timeout``, the reply parsed from its bytes
    (:func:`taskq.ratelimit._resp.parse_reply`), a fraction of the client work of
    redis-py's buffered line-by-line reader. Anything else: ``read_response``.
    """
    if conn._parser.__class__ in _PYTHON_READERS and not conn.health_check_interval:
        if ASYNC:
            source = getattr(conn, "_reader", None)
            if type(source) is asyncio.StreamReader:
                return await _read_reply(conn, source)
        else:
            source = getattr(conn, "_sock", None)
            if type(source) is socket.socket:
                return await _read_reply(conn, source)
    return await conn.read_response()


async def _read_reply(conn: Any, source: Any) -> Any:
    """The reply on ``source``, the stream (asyncio) or socket (blocking) of ``conn``,
    read and parsed here.

    The values and errors are ``read_response``'s: strings through the connection's
    decoder, a RESP3 push message before the reply handed to the reader's push handler
    (as redis-py's reader does), an error reply raised as redis-py's exception for it
    (the connection stays usable, unless redis-py counts that error as a connection
    error), no reply within ``socket_timeout`` as redis-py's ``TimeoutError`` and a
    failed read or a closed connection as its ``ConnectionError``, each after
    disconnecting. Bytes that are not one whole reply and nothing more mean the
    connection lost its place in the stream: it is disconnected and the error is a
    ``ConnectionError`` too.
    """
    try:
        if ASYNC:
            async with asyncio.timeout(conn.socket_timeout):
                reply = await _read_parsed(conn, source)
        else:
            reply = await _read_parsed(conn, source)  # the socket's own timeout bounds it
    except TimeoutError:
        await _disconnect(conn)
        raise _TIMEOUT_ERROR("Timeout reading from socket") from None
    except OSError as exc:
        await _disconnect(conn)
        raise _CONNECTION_ERROR(f"Error while reading from socket: {exc.args}") from exc
    except ProtocolError as exc:
        await _disconnect(conn)
        raise _CONNECTION_ERROR(str(exc)) from exc
    except BaseException:
        await _disconnect(conn)
        raise
    if isinstance(reply, BaseException):
        if isinstance(reply, _CONNECTION_ERROR):
            await _disconnect(conn)
        raise reply
    return reply


async def _read_parsed(conn: Any, source: Any) -> Any:
    """Read ``source`` until it holds one whole reply, hand any push message before it
    to the reader's push handler, and return the reply (an error reply as its exception,
    not raised)."""
    parser = conn._parser
    decode = conn.encoder.decode
    data = b""
    start = 0
    while True:
        if ASYNC:
            chunk = await source.read(_READ_SIZE)
        else:
            chunk = source.recv(_READ_SIZE)
        if not chunk:
            raise _CONNECTION_ERROR("Connection closed by server.")
        data += chunk
        try:
            reply, end = parse_reply(data, decode, parser.parse_error, start)
            while reply.__class__ is Push:
                push = getattr(parser, "handle_push_response", None)
                if push is None:
                    raise ProtocolError("Protocol Error: a push message on a RESP2 connection")
                await push(list(reply))
                start = end
                reply, end = parse_reply(data, decode, parser.parse_error, start)
        except IncompleteReply:
            continue
        if end != len(data):
            raise ProtocolError(f"Protocol Error: {len(data) - end} bytes after the reply")
        return reply


async def _disconnect(conn: Any) -> None:
    """Drop ``conn``'s socket as redis-py does after a failed read."""
    if ASYNC:
        await conn.disconnect(nowait=True)
    else:
        conn.disconnect()


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
    client = require_redis(redis_client, name, settings)
    try:
        await client.delete(redis_key)
    except REDIS_DOWN as exc:
        engine = fallback_engine(name, exc, pg_pool, settings)
        if engine is None:
            raise
        await _sql.sql_reset(engine, name)
