"""aiosqlite's connection thread: a call queued there without waiting for it.

Why: when a task is cancelled while aiosqlite runs one of its statements, SQLAlchemy
closes the connection at once, and taskq must first roll back its transaction and close
the abandoned statement's cursor (see :func:`taskq.db.dialect.install_sqlite_hooks`) on
the connection's own thread, after the statement still running there and before the
close SQLAlchemy queues next. aiosqlite's public ``rollback()`` and ``Cursor.close()``
are coroutines that wait for the statement in flight, and a cancelled task must not wait
for the statement it was cancelled in; aiosqlite has no public way to queue a call
without waiting. So, for the versions in :data:`TESTED_VERSIONS`, the call goes on
aiosqlite's private call queue (``Connection._tx``, which its own ``stop()`` feeds the
same way). For any other version :data:`SUPPORTED` is false, the functions here return
``False`` and the caller takes the public, waiting path.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from typing import Final

import aiosqlite

TESTED_VERSIONS: Final = ((0, 22),)
"""aiosqlite ``(major, minor)`` versions whose internals this module was checked against."""


def _version() -> tuple[int, int]:
    major, minor = (int(part) for part in aiosqlite.__version__.split(".")[:2])
    return major, minor


SUPPORTED: Final = _version() in TESTED_VERSIONS
"""Whether the installed aiosqlite is one whose call queue this module knows."""


def call_soon(driver: aiosqlite.Connection, call: Callable[[sqlite3.Connection], object]) -> bool:
    """Queue ``call(connection)`` on ``driver``'s thread, after whatever is queued there,
    without waiting; ``False`` (nothing queued) where this aiosqlite is not supported.

    ``call`` gets the ``sqlite3`` connection and is skipped if it was closed by then.
    """
    if not SUPPORTED:
        return False

    def on_thread() -> None:
        connection = driver._connection
        if connection is not None:  # not closed in the meantime
            call(connection)

    # A call with no future to report to: the worker thread runs it and moves on.
    driver._tx.put_nowait((None, on_thread))
    return True


def cursor_parts(cursor: aiosqlite.Cursor) -> tuple[aiosqlite.Connection, sqlite3.Cursor] | None:
    """The connection ``cursor`` belongs to and the ``sqlite3`` cursor it wraps (to close
    it on that connection's thread with :func:`call_soon`); ``None`` where this aiosqlite
    is not supported."""
    if not SUPPORTED:
        return None
    return cursor._conn, cursor._cursor
