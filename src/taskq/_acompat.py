"""Async/sync pairs the sync generator swaps between.

Hand-written code in ``taskq`` uses the async names; ``tools/generate_sync.py`` renames
each to its sync partner (its ``RENAMES`` table) when it writes ``taskq_sync``. Both live
here so the generated modules import real objects, never copies, and a reader can check
each pair side by side.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any, Final, TypeVar

T = TypeVar("T")

ASYNC: Final = True
"""``if ASYNC:`` blocks keep their body in ``taskq``; the generator keeps the ``else``."""


async def asleep(seconds: float) -> None:
    """Sleep without blocking the event loop."""
    await asyncio.sleep(seconds)


def sleep(seconds: float) -> None:
    """Block the calling thread for ``seconds``."""
    time.sleep(seconds)


async def arun_sync(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """Run ``fn(sync_connection, *args)`` on an ``AsyncConnection`` (alembic, inspection)."""
    result: T = await conn.run_sync(fn, *args)
    return result


def run_sync(conn: Any, fn: Callable[..., T], *args: Any) -> T:
    """Sync partner of :func:`arun_sync`: the connection is already synchronous."""
    return fn(conn, *args)


async def ato_thread(fn: Callable[..., T], *args: Any) -> T:
    """Run a blocking function in a thread from async code (a sync actor's body)."""
    return await asyncio.to_thread(fn, *args)
