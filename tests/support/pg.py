"""Small direct-to-Postgres helpers for tests that check what a store really holds."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.engine import URL

from taskq.db.queries.dispatch import notify_channel


def libpq(url: URL) -> str:
    """``url`` as a libpq connection string (psycopg's own, outside SQLAlchemy)."""
    return url.set(drivername="postgresql").render_as_string(hide_password=False)


def count_jobs(url: URL, actor: str) -> int:
    """How many ``taskq.jobs`` rows ``actor`` has, read on a connection of its own."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        row = conn.execute("SELECT count(*) FROM taskq.jobs WHERE actor = %s", [actor]).fetchone()
    assert row is not None
    return int(row[0])


@contextmanager
def refusing(url: URL, text: str) -> Iterator[None]:
    """A ``CHECK`` on ``taskq.jobs`` (as an operator might add) that refuses a payload
    whose ``"text"`` is ``text``: a value every client-side check lets through and the
    server refuses (``psycopg.errors.CheckViolation``), for tests of a failed statement.
    Dropped after (the database is the xdist worker's, shared by its tests)."""
    check = sql.SQL(
        "ALTER TABLE taskq.jobs ADD CONSTRAINT test_refused "
        "CHECK (payload->>'text' IS DISTINCT FROM {})"
    ).format(sql.Literal(text))
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        conn.execute(check)
    try:
        yield
    finally:
        with psycopg.connect(libpq(url), autocommit=True) as conn:
            conn.execute("ALTER TABLE taskq.jobs DROP CONSTRAINT test_refused")


def kill_other_backends(url: URL) -> int:
    """Terminate every other session on ``url``'s database (the pools' connections die);
    how many were terminated."""
    with psycopg.connect(libpq(url), autocommit=True) as conn:
        rows = conn.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchall()
    return len(rows)


async def listen(url: URL, schema: str) -> psycopg.AsyncConnection[Any]:
    """A connection of its own LISTENing on the wake-up channel of ``schema``."""
    listener = await psycopg.AsyncConnection.connect(libpq(url), autocommit=True)
    channel = psycopg.sql.Identifier(notify_channel(schema))
    await listener.execute(psycopg.sql.SQL("LISTEN {}").format(channel))
    return listener


async def notes_until(listener: psycopg.AsyncConnection[Any], until: str) -> list[str]:
    """The payloads ``listener`` receives, in order, up to and including ``until`` (5 s)."""
    seen: list[str] = []

    async def collect() -> None:
        async for note in listener.notifies():
            seen.append(note.payload)
            if note.payload == until:
                return

    await asyncio.wait_for(collect(), timeout=5)
    return seen
