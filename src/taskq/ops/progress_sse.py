"""A job's progress stream as Server-Sent Events, for any HTTP surface.

The admin UI's ``GET /jobs/{id}/progress`` (:mod:`taskq.ui.progress`) and the route
``taskq.contrib.starlette`` mounts on its own both serve :class:`ProgressFeed`, so the two
cannot drift apart. Nothing here knows a web framework: a surface parses the request
(:func:`parse_last_event_id`), asks :meth:`ProgressFeed.open` for the stream and sends
its chunks as a ``text/event-stream`` body with :data:`SSE_HEADERS`.

Each event's ``id:`` is the stream's ``seq`` (see :mod:`taskq.progress`) and its
``data:`` the event as JSON (``job_id``, ``seq``, ``event``, ``status``, ``terminal``,
``state``, ``error_class``). A client that reconnects sends ``Last-Event-ID`` and gets only
what came after. The stream starts with the job's current state when that is newer than
what the client has seen, and ends after the terminal event; a reconnect after the
terminal event gets no stream at all (``open`` returns ``None``: answer ``204 No
Content``, which tells ``EventSource`` to stop).

With a Redis client the events come from the job's pub/sub channel as the worker
publishes them; the row is re-read after each quiet poll interval so a lost publish
still ends the stream. Without Redis the row is polled (progress updates coalesce to the
newest state; every status change is seen).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any
from uuid import UUID

from taskq._ids import as_job_id
from taskq.constants import TERMINAL_STATUSES
from taskq.exceptions import JobNotFoundError
from taskq.ops.stats import ProgressSnapshot, StatsClient
from taskq.progress import ProgressEvent, progress_channel
from taskq.progress_pubsub import confirmed, pending

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "KEEPALIVE_S",
    "SSE_HEADERS",
    "ProgressFeed",
    "RedactState",
    "format_event",
    "parse_last_event_id",
]

KEEPALIVE_S = 15.0
"""Seconds of silence after which the stream sends an SSE comment (proxies keep it open)."""

SSE_HEADERS = {"Cache-Control": "no-store", "X-Accel-Buffering": "no"}
"""Headers of a progress response besides ``Content-Type: text/event-stream`` (no caching;
nginx must not buffer the stream)."""

RedactState = Callable[[dict[str, Any]], Any]
"""What a client may see of a progress ``state`` (the identity when nothing is hidden)."""

Disconnected = Callable[[], Awaitable[bool]]


def parse_last_event_id(raw: str | None) -> int:
    """The ``Last-Event-ID`` a client sent (``-1``: none, the stream starts at the
    beginning); ``ValueError`` for anything but a non-negative integer."""
    if raw is None or raw == "":
        return -1
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"Last-Event-ID: {raw!r} is not an event number") from None
    if value < 0:
        raise ValueError("Last-Event-ID must not be negative")
    return value


def format_event(data: dict[str, Any], seq: int | None) -> str:
    """One SSE message: ``id:`` (when known) and ``data:`` lines, blank-line terminated."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}data: {json.dumps(data, default=str, separators=(',', ':'))}\n\n"


def _identity(state: dict[str, Any]) -> Any:
    return state


async def _connected() -> bool:
    return False


def _from_row(snap: ProgressSnapshot, redact: RedactState) -> dict[str, Any]:
    terminal = snap.status in TERMINAL_STATUSES
    return {
        "job_id": str(snap.job_id),
        "seq": snap.seq,
        "event": snap.status if terminal or snap.status != "running" else "progress",
        "status": snap.status,
        "terminal": terminal,
        "state": redact(snap.state),
        "error_class": snap.error_class,
    }


def _from_message(event: ProgressEvent, redact: RedactState) -> dict[str, Any]:
    return {
        "job_id": str(event.job_id),
        "seq": event.seq,
        "event": event.event,
        "status": event.status,
        "terminal": event.terminal,
        "state": redact(event.state),
        "error_class": event.error_class,
    }


@dataclass(frozen=True, slots=True)
class ProgressFeed:
    """Progress streams of the jobs in ``stats``' store: from ``redis_client``'s pub/sub
    when given, else by polling the row every ``poll_interval`` seconds (with Redis, the
    row is re-read after each quiet interval)."""

    stats: StatsClient
    redis_client: Redis | None = None
    poll_interval: float = 0.5

    def __post_init__(self) -> None:
        if self.poll_interval <= 0:
            raise ValueError("poll_interval must be > 0")

    async def snapshot(self, job_id: UUID | str) -> ProgressSnapshot:
        """The job's progress row now; ``JobNotFoundError`` when there is no such job."""
        job_id = as_job_id(job_id)
        snap = await self.stats.progress(job_id)
        if snap is None:
            raise JobNotFoundError(job_id)
        return snap

    def stream(
        self,
        first: ProgressSnapshot,
        last: int,
        *,
        redact: RedactState | None = None,
        is_disconnected: Disconnected = _connected,
    ) -> AsyncIterator[str] | None:
        """The SSE chunks after event ``last`` of the job whose row was ``first``;
        ``None`` when the job has ended and the client has seen its last event.
        ``redact`` filters each event's ``state``; ``is_disconnected`` ends the stream
        early when the client has gone."""
        if first.status in TERMINAL_STATUSES and first.seq <= last:
            return None
        return self._events(first, last, redact or _identity, is_disconnected)

    async def open(
        self,
        job_id: UUID | str,
        last: int = -1,
        *,
        redact: RedactState | None = None,
        is_disconnected: Disconnected = _connected,
    ) -> AsyncIterator[str] | None:
        """:meth:`snapshot` then :meth:`stream`: the SSE chunks after event ``last``."""
        first = await self.snapshot(job_id)
        return self.stream(first, last, redact=redact, is_disconnected=is_disconnected)

    async def _events(
        self, first: ProgressSnapshot, last: int, redact: RedactState, gone: Disconnected
    ) -> AsyncIterator[str]:
        yield "retry: 1000\n\n"
        if self.redis_client is not None:
            async for chunk in self._redis_events(first, last, redact, gone):
                yield chunk
            return
        snap: ProgressSnapshot | None = first
        status = None
        while snap is not None:
            if snap.seq > last or (snap.status != status and status is not None):
                yield format_event(_from_row(snap, redact), snap.seq if snap.seq > last else None)
                last = max(last, snap.seq)
            status = snap.status
            if snap.status in TERMINAL_STATUSES:
                return
            if await gone():
                return
            await asyncio.sleep(self.poll_interval)
            snap = await self.stats.progress(first.job_id)

    async def _redis_events(
        self, first: ProgressSnapshot, last: int, redact: RedactState, gone: Disconnected
    ) -> AsyncIterator[str]:
        assert self.redis_client is not None
        pubsub: Any = self.redis_client.pubsub()  # redis-py leaves PubSub.aclose untyped
        try:
            await pubsub.subscribe(progress_channel(first.job_id))
            # Subscribed first (confirmed: SUBSCRIBE only takes effect when Redis has run
            # it), then the row re-read: an event published in between is on the channel,
            # and the row already holds anything published before.
            await confirmed(pubsub)
            snap = await self.stats.progress(first.job_id) or first
            if snap.seq > last:
                yield format_event(_from_row(snap, redact), snap.seq)
                last = snap.seq
            if snap.status in TERMINAL_STATUSES:
                return
            quiet = 0.0
            while True:
                message = await pubsub.get_message(
                    ignore_subscribe_messages=True, timeout=self.poll_interval
                )
                if message is None:
                    if await gone():
                        return
                    quiet += self.poll_interval
                    row = await self.stats.progress(first.job_id)
                    if row is None:
                        return
                    if row.status in TERMINAL_STATUSES:
                        # The row ended while the channel was quiet for us, but events the
                        # worker published before that end may still be unread on it:
                        # send them first (in order, once each), never jump to the end.
                        async for event in pending(pubsub, self.poll_interval):
                            if event.seq is None or event.seq <= last:
                                continue
                            last = event.seq
                            yield format_event(_from_message(event, redact), event.seq)
                            if event.terminal:
                                return
                        if row.seq > last:
                            yield format_event(_from_row(row, redact), row.seq)
                        return
                    if quiet >= KEEPALIVE_S:
                        quiet = 0.0
                        yield ": keep-alive\n\n"
                    continue
                quiet = 0.0
                event = ProgressEvent.from_message(message["data"])
                if event.seq is None or event.seq <= last:
                    continue
                last = event.seq
                yield format_event(_from_message(event, redact), event.seq)
                if event.terminal:
                    return
        finally:
            await pubsub.aclose()
