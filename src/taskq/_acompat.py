"""Async/sync pairs the sync generator swaps between.

Hand-written code in ``taskq`` uses the async names; ``tools/generate_sync.py`` renames
each to its sync partner when it writes ``taskq_sync``. Both live here so the generated
modules import real objects, never copies.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, TypeVar

T = TypeVar("T")

ASYNC: Final = True
"""``if ASYNC:`` blocks keep their body in ``taskq``; the generator keeps the ``else``."""

ALock = asyncio.Lock
Lock = threading.Lock
AEvent = asyncio.Event
Event = threading.Event


async def asleep(seconds: float) -> None:
    """Sleep without blocking the event loop."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """Block the calling thread for ``seconds``."""
    time.sleep(seconds)


def amonotonic() -> float:
    """Monotonic clock (same in both worlds; paired for symmetry of generated code)."""
    return time.monotonic()


async def agather(*aws: Awaitable[T]) -> list[T]:
    """Run awaitables concurrently and return their results in order."""
    return list(await asyncio.gather(*aws))


def gather(*results: T) -> list[T]:
    """Sync partner of :func:`agather`: the calls already ran, one after another."""
    return list(results)


async def ato_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking function in a thread from async code."""
    return await asyncio.to_thread(fn, *args)


def to_thread(fn: Callable[..., T], *args: Any) -> T:
    """Sync partner of :func:`ato_thread`: just call it."""
    return fn(*args)


async def arun_sync(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sync_connection, *args)`` on an ``AsyncConnection`` (alembic, inspection)."""
    result: T = await conn.run_sync(fn, *args)
    return result


def run_sync(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """Sync partner of :func:`arun_sync`: the connection is already synchronous."""
    return fn(conn, *args)
