"""``GET /jobs/{id}/progress``: a job's progress stream as Server-Sent Events.

Each event's ``id:`` is the stream's ``seq`` (see :mod:`taskq.progress`) and its
``data:`` the event as JSON (``job_id``, ``seq``, ``event``, ``status``, ``terminal``,
``state``, ``error_class``). A client that reconnects sends ``Last-Event-ID`` (browsers'
``EventSource`` do it for you; ``?last_event_id=`` works too) and gets only what came
after. The stream starts with the job's current state when that is newer than what the
client has seen, and ends after the terminal event. A reconnect after the terminal event
is answered ``204 No Content``, which tells ``EventSource`` to stop.

With a Redis client the events come from the job's pub/sub channel as the worker
publishes them; the row is re-read after each quiet poll interval so a lost publish
still ends the stream. Without Redis the row is polled (progress updates coalesce to the
newest state; every status change is seen).
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from taskq.constants import TERMINAL_STATUSES
from taskq.exceptions import JobNotFoundError
from taskq.ops.stats import ProgressSnapshot
from taskq.progress import ProgressEvent, progress_channel
from taskq.ui import inputs
from taskq.ui.app import Admin, admin_of
from taskq.ui.inputs import BadInput

__all__ = ["format_event", "stream"]

_KEEPALIVE_S = 15.0


def _last_event_id(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    if raw is None or raw == "":
        return -1
    try:
        value = int(raw)
    except ValueError:
        raise BadInput(f"Last-Event-ID: {raw!r} is not an event number") from None
    if value < 0:
        raise BadInput("Last-Event-ID must not be negative")
    return value


def format_event(data: dict[str, Any], seq: int | None) -> str:
    """One SSE message: ``id:`` (when known) and ``data:`` lines, blank-line terminated."""
    head = f"id: {seq}\n" if seq is not None else ""
    return f"{head}data: {json.dumps(data, default=str, separators=(',', ':'))}\n\n"


def _from_row(snap: ProgressSnapshot, admin: Admin, actor: str) -> dict[str, Any]:
    terminal = snap.status in TERMINAL_STATUSES
    return {
        "job_id": str(snap.job_id),
        "seq": snap.seq,
        "event": snap.status if terminal or snap.status != "running" else "progress",
        "status": snap.status,
        "terminal": terminal,
        "state": admin.redact(actor, "progress", snap.state),
        "error_class": snap.error_class,
    }


def _from_message(event: ProgressEvent, admin: Admin, actor: str) -> dict[str, Any]:
    return {
        "job_id": str(event.job_id),
        "seq": event.seq,
        "event": event.event,
        "status": event.status,
        "terminal": event.terminal,
        "state": admin.redact(actor, "progress", event.state),
        "error_class": event.error_class,
    }


async def stream(request: Request) -> Response:
    """The SSE endpoint (``view`` permission)."""
    admin = admin_of(request)
    await admin.require(request, "view")
    job_id = inputs.job_id(request.path_params["job_id"])
    last = _last_event_id(request)
    snap = await admin.stats.progress(job_id)
    if snap is None:
        raise JobNotFoundError(job_id)
    actor = (await admin.tq.jobs.detail(job_id)).job.actor
    if snap.status in TERMINAL_STATUSES and snap.seq <= last:
        return Response(status_code=204)
    body = _events(request, admin, snap, last, actor)
    return StreamingResponse(
        body,
        media_type="text/event-stream",
        headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"},
    )


async def _events(
    request: Request, admin: Admin, first: ProgressSnapshot, last: int, actor: str
) -> AsyncIterator[str]:
    yield "retry: 1000\n\n"
    if admin.redis_client is not None:
        async for chunk in _redis_events(request, admin, first, last, actor):
            yield chunk
        return
    snap: ProgressSnapshot | None = first
    status = None
    while snap is not None:
        if snap.seq > last or (snap.status != status and status is not None):
            yield format_event(_from_row(snap, admin, actor), snap.seq if snap.seq > last else None)
            last = max(last, snap.seq)
        status = snap.status
        if snap.status in TERMINAL_STATUSES:
            return
        if await request.is_disconnected():
            return
        await asyncio.sleep(admin.progress_poll_s)
        snap = await admin.stats.progress(first.job_id)


async def _redis_events(
    request: Request, admin: Admin, first: ProgressSnapshot, last: int, actor: str
) -> AsyncIterator[str]:
    assert admin.redis_client is not None
    pubsub: Any = admin.redis_client.pubsub()  # redis-py leaves PubSub.aclose untyped
    try:
        await pubsub.subscribe(progress_channel(first.job_id))
        # Subscribed first, then the row re-read: an event published in between is on
        # the channel, and the row already holds anything published before.
        snap = await admin.stats.progress(first.job_id) or first
        if snap.seq > last:
            yield format_event(_from_row(snap, admin, actor), snap.seq)
            last = snap.seq
        if snap.status in TERMINAL_STATUSES:
            return
        quiet = 0.0
        while True:
            message = await pubsub.get_message(
                ignore_subscribe_messages=True, timeout=admin.progress_poll_s
            )
            if message is None:
                if await request.is_disconnected():
                    return
                quiet += admin.progress_poll_s
                row = await admin.stats.progress(first.job_id)
                if row is None:
                    return
                if row.status in TERMINAL_STATUSES:
                    if row.seq > last:
                        yield format_event(_from_row(row, admin, actor), row.seq)
                    return
                if quiet >= _KEEPALIVE_S:
                    quiet = 0.0
                    yield ": keep-alive\n\n"
                continue
            quiet = 0.0
            event = ProgressEvent.from_message(message["data"])
            if event.seq is None or event.seq <= last:
                continue
            last = event.seq
            yield format_event(_from_message(event, admin, actor), event.seq)
            if event.terminal:
                return
    finally:
        await pubsub.aclose()
