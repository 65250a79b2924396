# sync twin: src/taskq_sync/db/caller_connection.py
"""The caller's connection for ``enqueue(..., connection=...)``, whatever kind it is.

A web framework hands out its own connection: a SQLAlchemy ``AsyncConnection``
(``Connection`` in ``taskq_sync``; Flask-SQLAlchemy's ``db.session.connection()``), or
a raw psycopg connection (Django's ``connection.connection``, a ``psycopg_pool``
checkout). taskq's statements run on it, inside the caller's transaction:

* a SQLAlchemy connection is used as it is;
* a psycopg connection is wrapped, for the length of the call, in a SQLAlchemy
  connection of a shared borrowing engine whose pool hands out exactly that connection.
  The wrapper's ``commit``, ``rollback`` and ``close`` do nothing: the caller's
  transaction is the caller's to end, and the connection stays open. Cursors taskq opens
  on it decode ``json``/``jsonb`` with psycopg's own loaders (on the cursor's adapters,
  so the caller's connection keeps the loaders it has: Django's return JSON as text);
* a SQLite connection (``sqlite3``, Django's) is a ``TypeError`` saying SQLite is not
  supported and pointing at ``enqueue_on_commit``;
* anything else is a ``TypeError`` that names what is accepted.
"""

from __future__ import annotations

import contextvars
import sqlite3
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.adapt import AdaptersMap
from psycopg.types.json import JsonbBinaryLoader, JsonBinaryLoader, JsonbLoader, JsonLoader
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from sqlalchemy.pool import NullPool

from taskq._acompat import ASYNC

__all__ = ["CallerConnection", "accepted_connection", "caller_connection"]

CallerConnection = AsyncConnection | psycopg.AsyncConnection[Any]
"""What ``connection=`` accepts (in ``taskq_sync``: ``Connection`` or ``psycopg.Connection``)."""

if ASYNC:
    _ACCEPTED = "a SQLAlchemy AsyncConnection or a psycopg AsyncConnection"
else:
    _ACCEPTED = "a SQLAlchemy Connection or a psycopg Connection"

_LENT: contextvars.ContextVar[psycopg.AsyncConnection[Any] | None] = contextvars.ContextVar(
    "taskq_lent_connection", default=None
)
"""The psycopg connection the borrowing engine hands out in this context."""

_ENGINE: list[AsyncEngine] = []
"""The one borrowing engine, made on first use."""


def accepted_connection(connection: object) -> None:
    """Raise ``TypeError`` unless ``connection`` is a kind ``connection=`` accepts.

    Called before anything is validated or written, so a wrong object changes nothing.
    """
    if isinstance(connection, (AsyncConnection, psycopg.AsyncConnection)):
        return
    kind = f"{type(connection).__module__}.{type(connection).__qualname__}"
    if isinstance(connection, sqlite3.Connection) or _is_sqlite(connection):
        # Not supported on purpose: the caller's sqlite3 connection belongs to its thread
        # and its transaction mode, which taskq's async driver and its up-front write lock
        # cannot share.
        raise TypeError(
            f"connection= does not support SQLite connections (got {kind}): a transactional "
            "enqueue needs PostgreSQL. On SQLite, use taskq.contrib.django.enqueue_on_commit "
            "(Django) or enqueue without connection= after your transaction commits"
        )
    hint = ""
    if type(connection).__module__.startswith("django."):
        hint = " (Django's connection: use taskq.contrib.django's enqueue, or pass connection.connection)"
    raise TypeError(f"connection= takes {_ACCEPTED}, got {kind}{hint}")


def _is_sqlite(connection: object) -> bool:
    """An aiosqlite connection, or Django's SQLite one (``django.db.connection``)."""
    module = type(connection).__module__
    if module.startswith("aiosqlite"):
        return True
    return module.startswith("django.") and getattr(connection, "vendor", None) == "sqlite"


@asynccontextmanager
async def caller_connection(connection: object) -> AsyncIterator[AsyncConnection]:
    """``connection`` as a SQLAlchemy connection, in the caller's transaction.

    A SQLAlchemy connection is yielded as it is; a psycopg one through the borrowing
    engine (see the module's docstring). Nothing here commits, rolls back or closes it.
    """
    accepted_connection(connection)
    if isinstance(connection, AsyncConnection):
        yield connection
        return
    assert isinstance(connection, psycopg.AsyncConnection)
    token = _LENT.set(connection)
    try:
        async with _borrowing_engine().connect() as conn:
            yield conn
    finally:
        _LENT.reset(token)


def _borrowing_engine() -> AsyncEngine:
    if not _ENGINE:
        if ASYNC:
            engine = create_async_engine(
                "postgresql+psycopg://",
                async_creator=_lend,
                poolclass=NullPool,
                use_native_hstore=False,
            )
        else:
            engine = create_async_engine(
                "postgresql+psycopg://", creator=_lend, poolclass=NullPool, use_native_hstore=False
            )
        _ENGINE.append(engine)
    return _ENGINE[0]


async def _lend() -> Any:
    """The borrowing engine's creator: the connection lent in this context, wrapped."""
    lent = _LENT.get()
    if lent is None:  # only caller_connection checks out of the borrowing engine
        raise RuntimeError("taskq's borrowing engine used outside caller_connection()")
    return _Lent(lent)


def _decode_json(adapters: AdaptersMap) -> None:
    adapters.register_loader("json", JsonLoader)
    adapters.register_loader("jsonb", JsonbLoader)
    adapters.register_loader("json", JsonBinaryLoader)
    adapters.register_loader("jsonb", JsonbBinaryLoader)


class _Lent:
    """The caller's psycopg connection as the borrowing engine's pool sees it.

    Everything is the connection's own except ending it: ``commit``, ``rollback`` and
    ``close`` are no-ops (SQLAlchemy calls them when its wrapper is closed), and no
    notice handler is added per use. Cursors get psycopg's JSON loaders.
    """

    def __init__(self, conn: psycopg.AsyncConnection[Any]) -> None:
        self._conn = conn

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)

    async def commit(self) -> None:
        """Not taskq's to do: the caller ends its transaction."""

    async def rollback(self) -> None:
        """Not taskq's to do: the caller ends its transaction."""

    async def close(self) -> None:
        """Not taskq's to do: the caller owns the connection."""

    def add_notice_handler(self, handler: Any) -> None:
        """SQLAlchemy adds one on every checkout; the caller's connection keeps its own."""

    def cursor(self, *args: Any, **kwargs: Any) -> Any:
        """A cursor of the caller's connection that decodes JSON columns."""
        cur = self._conn.cursor(*args, **kwargs)
        _decode_json(cur.adapters)
        return cur
