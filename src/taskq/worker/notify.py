"""Wake-ups: LISTEN/NOTIFY on Postgres, plain polling everywhere else.

The listener holds one dedicated psycopg ``AsyncConnection`` (autocommit, outside the
engine's pool: a pooled connection would be recycled under the LISTEN) and sets the
dispatcher's wake event on each notification. When the connection drops it reconnects
with backoff; meanwhile the dispatcher's poll interval keeps jobs flowing.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable

import psycopg
import structlog
from sqlalchemy.engine import URL

from taskq.db.queries.dispatch import notify_channel
from taskq.db.queries.handover import SLOT_FREED_PREFIX

__all__ = ["Listener"]

_log = structlog.get_logger("taskq.worker.notify")


class Listener:
    """Sets ``wake`` whenever a job is enqueued on one of ``queues`` (Postgres only), and
    tells ``on_slot`` the name of each static reservation slot released (``slot <name>``
    payloads)."""

    def __init__(
        self,
        url: URL,
        schema: str,
        queues: tuple[str, ...],
        wake: asyncio.Event,
        on_slot: Callable[[str], None] | None = None,
    ) -> None:
        self._dsn = url.set(drivername="postgresql").render_as_string(hide_password=False)
        self._channel = notify_channel(schema)
        self._queues = frozenset(queues)
        self._wake = wake
        self._on_slot = on_slot
        self.connected = asyncio.Event()

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after any connection error."""
        backoff = 0.1
        while True:
            try:
                conn = await psycopg.AsyncConnection.connect(self._dsn, autocommit=True)
            except (psycopg.Error, OSError) as exc:
                _log.warning("worker-listen-connect-failed", error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 5.0)
                continue
            try:
                await conn.execute(
                    psycopg.sql.SQL("LISTEN {}").format(psycopg.sql.Identifier(self._channel))
                )
                backoff = 0.1
                self.connected.set()
                # A notification may have been missed while reconnecting: look once.
                self._wake.set()
                async for note in conn.notifies():
                    payload = note.payload
                    if payload.startswith(SLOT_FREED_PREFIX):
                        if self._on_slot is not None:
                            self._on_slot(payload[len(SLOT_FREED_PREFIX) :])
                    elif payload in self._queues or not payload:
                        self._wake.set()
            except (psycopg.Error, OSError) as exc:
                _log.warning("worker-listen-lost", error=str(exc))
            finally:
                self.connected.clear()
                with contextlib.suppress(Exception):
                    await conn.close()
            await asyncio.sleep(backoff)
