# sync twin: src/taskq_sync/backends/held.py
"""``HeldConnections``: the autocommit connections the plain enqueue keeps between calls.

Checking a connection out of the SQLAlchemy pool and back in around every enqueue
(greenlet hand-offs, pool events, the switch to autocommit and back) cost as much client
CPU as the one statement it ran; see :class:`HeldConnections` for what is kept, for how
long, and how a dead or long-idle connection is handled.
"""

from __future__ import annotations

import os
import threading
import time
from types import TracebackType

from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine
from sqlalchemy.pool import QueuePool

import taskq.db.dialect as dialects
from taskq.db.fork import forked_since, inherited

__all__ = ["HeldConnections", "Lease", "held_connections_cap"]

_HELD_MAX = 4
"""At most this many idle connections are kept by :class:`HeldConnections`."""


def held_connections_cap(engine: AsyncEngine) -> int:
    """How many idle autocommit connections the plain enqueue may keep checked out.

    A quarter of what the pool can hand out (``pool_size + max_overflow``), at most
    :data:`_HELD_MAX`, so the rest of the application always finds connections in the
    pool: taskq's own engines (``pool_size=10``, as much overflow) keep up to 4. None
    for a pool that is not a ``QueuePool`` (``NullPool`` users asked for no idle
    connections) or that is too small to share.
    """
    pool = engine.pool
    if not isinstance(pool, QueuePool):
        return 0
    overflow: int = getattr(pool, "_max_overflow", 0)
    if overflow < 0:
        return _HELD_MAX
    return min(_HELD_MAX, (pool.size() + overflow) // 4)


class HeldConnections:
    """Autocommit connections the plain enqueue keeps checked out between calls.

    Checking a connection out of the SQLAlchemy pool and back in for every enqueue
    (greenlet hand-offs, pool events, switching it to autocommit and back) cost about
    as much client CPU as the one statement it ran. The backend instead keeps up to
    ``keep`` idle connections, already in autocommit:

    * :meth:`acquire` hands the caller one of them for its exclusive use (the most
      recently used), or checks out a new one when none is idle; so concurrent
      enqueues each run on their own connection, and the pool's limits apply to every
      connection taken.
    * :meth:`release` keeps it for the next call while fewer than ``keep`` are idle,
      and otherwise returns it to the pool.
    * A held connection idle for ``IDLE_PING_AFTER_S`` or longer is not used: it goes
      back to the pool (marked with the time it went idle) and the call checks one
      out, so the pool's idle ping (``taskq.db.dialect``) applies as it would have.
    * :meth:`lease` does both around a block: released after it, discarded if it raised.
    * :meth:`discard` returns a connection that failed; :meth:`drop_idle` returns every
      idle one (after a disconnect, when the pool has been invalidated).
    * :meth:`aclose` returns them all; a connection released after it is returned too.

    Idle ones are taken and put back under a plain lock held only around list
    operations, so threads (the generated sync facade) share it safely as well.
    """

    def __init__(self, engine: AsyncEngine, keep: int) -> None:
        self.engine = engine
        """The autocommit engine new connections are checked out of."""
        self.keep = keep
        """How many idle connections are kept at most."""
        self._idle: list[tuple[AsyncConnection, float]] = []
        self._lock = threading.Lock()
        self._closed = False
        self._pid = os.getpid()

    def _after_fork(self) -> None:
        """In a forked child: forget the parent's connections without touching them
        (:mod:`taskq.db.fork`); the child checks out its own."""
        with self._lock:
            if forked_since(self._pid):
                inherited(self._idle)
                self._idle = []
                self._lock = threading.Lock()
                self._pid = os.getpid()

    @property
    def idle(self) -> int:
        """How many connections are held idle right now."""
        return len(self._idle)

    async def acquire(self) -> AsyncConnection:
        """A connection for the caller alone: a held idle one, else a new checkout."""
        if forked_since(self._pid):
            self._after_fork()
        stale: list[tuple[AsyncConnection, float]] = []
        conn: AsyncConnection | None = None
        now = time.monotonic()
        with self._lock:
            if self._idle:
                held, since = self._idle.pop()
                if now - since < dialects.IDLE_PING_AFTER_S:
                    conn = held
                else:  # the others went idle even earlier
                    stale = [*self._idle, (held, since)]
                    self._idle.clear()
        for held, since in stale:
            await _return_to_pool(held, since)
        if conn is not None:
            return conn
        return await self.engine.connect()

    async def release(self, conn: AsyncConnection) -> None:
        """Keep ``conn`` for the next caller, or return it to the pool if enough are kept."""
        if forked_since(self._pid):  # checked out in the parent: never the child's to return
            inherited([conn])
            return
        if not conn.invalidated:
            with self._lock:
                if not self._closed and len(self._idle) < self.keep:
                    self._idle.append((conn, time.monotonic()))
                    return
        await conn.close()

    def lease(self) -> Lease:
        """:meth:`acquire` a connection for the block; :meth:`release` it when the block
        ends normally, :meth:`discard` it when the block raises (its state is unknown)."""
        return Lease(self)

    async def discard(self, conn: AsyncConnection) -> None:
        """Return ``conn`` to the pool (it failed, or its state is unknown)."""
        await conn.close()

    async def drop_idle(self) -> None:
        """Return every idle connection to the pool (which re-checks them after a disconnect)."""
        if forked_since(self._pid):
            self._after_fork()
        with self._lock:
            idle, self._idle = self._idle, []
        for held, since in idle:
            await _return_to_pool(held, since)

    async def aclose(self) -> None:
        """Return every held connection to the pool; later releases return theirs too."""
        self._closed = True
        await self.drop_idle()


class Lease:
    """The context manager :meth:`HeldConnections.lease` returns.

    A class rather than a generator-based context manager: it runs on every plain
    enqueue, and a generator per call (in asyncio, an async generator and the event
    loop's hooks for it) cost a few microseconds of client CPU more.
    """

    __slots__ = ("_conn", "_held")

    def __init__(self, held: HeldConnections) -> None:
        self._held = held
        self._conn: AsyncConnection | None = None

    async def __aenter__(self) -> AsyncConnection:
        self._conn = await self._held.acquire()
        return self._conn

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        conn, self._conn = self._conn, None
        assert conn is not None
        if exc_type is None:
            await self._held.release(conn)
        else:
            await self._held.discard(conn)


async def _return_to_pool(conn: AsyncConnection, idle_since: float) -> None:
    """Check ``conn`` in, telling the pool's idle ping when it really went idle."""
    if not conn.invalidated:
        conn.info[dialects.IDLE_SINCE_OVERRIDE] = idle_since
    await conn.close()
