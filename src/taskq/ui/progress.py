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

The stream itself is :class:`taskq.ops.progress_sse.ProgressFeed`, which
``taskq.contrib.starlette.progress_route`` serves too; this view adds the admin's
permission check and redaction.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import Response, StreamingResponse

from taskq.ops.progress_sse import SSE_HEADERS, ProgressFeed, format_event, parse_last_event_id
from taskq.ui import inputs
from taskq.ui.app import admin_of
from taskq.ui.inputs import BadInput

__all__ = ["format_event", "stream"]


def _last_event_id(request: Request) -> int:
    raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
    try:
        return parse_last_event_id(raw)
    except ValueError as exc:
        raise BadInput(str(exc)) from None


async def stream(request: Request) -> Response:
    """The SSE endpoint (``view`` permission)."""
    admin = admin_of(request)
    await admin.require(request, "view")
    job_id = inputs.job_id(request.path_params["job_id"])
    last = _last_event_id(request)
    feed = ProgressFeed(admin.stats, admin.redis_client, admin.progress_poll_s)
    first = await feed.snapshot(job_id)  # JobNotFoundError: the app's 404
    actor = (await admin.tq.jobs.detail(job_id)).job.actor

    def redact(state: dict[str, Any]) -> Any:
        return admin.redact(actor, "progress", state)

    body = feed.stream(first, last, redact=redact, is_disconnected=request.is_disconnected)
    if body is None:
        return Response(status_code=204)
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)
