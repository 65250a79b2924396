"""taskq in Starlette and FastAPI: a lifespan, a dependency, rate limits as 429s.

* ``lifespan()`` opens one ``taskq.TaskQ`` when the app starts (``app.state.taskq``) and
  closes it when the app stops; it wraps the app's own lifespan if given:
  ``FastAPI(lifespan=taskq_lifespan(settings=..., wrap=my_lifespan))``.
* :func:`get_taskq` is the dependency: ``tq: TaskQ = Depends(get_taskq)``.
* Enqueue in the request's transaction by passing its connection:
  ``async with tq.engine.begin() as conn: ...; await tq.enqueue(..., connection=conn)``
  (any SQLAlchemy ``AsyncConnection`` or psycopg ``AsyncConnection`` of the same database).
* :func:`acquire_rate_limit` / :func:`too_many_requests`: a bucket taken with the app's
  settings (its ``TASKQ_REDIS_URL``), a denial as a 429 with ``Retry-After``.
* :func:`progress_route` / :func:`progress_app`: a job's progress as server-sent events,
  on its own (the admin UI's stream, :class:`taskq.ops.progress_sse.ProgressFeed`, without
  the admin UI): ``id:`` is the progress ``seq``, a reconnect resumes after
  ``Last-Event-ID``, the stream ends after the terminal event; fed by Redis pub/sub when a
  Redis client is given or ``TASKQ_REDIS_URL`` is set, by the job's row otherwise.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import TYPE_CHECKING, Any
from uuid import UUID

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response, StreamingResponse
from starlette.routing import Route, Router

from taskq.client import TaskQ
from taskq.contrib.http import TOO_MANY_REQUESTS, retry_after_header
from taskq.exceptions import JobNotFoundError
from taskq.ops.progress_sse import SSE_HEADERS, ProgressFeed, parse_last_event_id
from taskq.ops.stats import StatsClient
from taskq.ratelimit.decision import RateLimitDecision
from taskq.ratelimit.refs import KeyedRateLimitRef
from taskq.ratelimit.registry import registry
from taskq.ratelimit.settings_redis import settings_redis

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "acquire_rate_limit",
    "get_taskq",
    "lifespan",
    "progress_app",
    "progress_route",
    "too_many_requests",
]

Authorize = Callable[[Request, UUID], "bool | Awaitable[bool]"]
"""``authorize(request, job_id)``: may this request watch this job's progress?"""
RedactProgress = Callable[[str, dict[str, Any]], Any]
"""``redact(actor, state)``: what the client sees of a progress state."""


def lifespan(
    *,
    wrap: Callable[[Any], AbstractAsyncContextManager[Any]] | None = None,
    **taskq_options: Any,
) -> Callable[[Any], AbstractAsyncContextManager[Any]]:
    """A lifespan that keeps a ``TaskQ(**taskq_options)`` in ``app.state.taskq`` while the
    app runs (and runs the app's own lifespan ``wrap`` inside it)."""

    @asynccontextmanager
    async def run(app: Any) -> AsyncIterator[Any]:
        async with TaskQ(**taskq_options) as tq:
            app.state.taskq = tq
            try:
                if wrap is None:
                    yield None
                else:
                    async with wrap(app) as state:
                        yield state
            finally:
                del app.state.taskq

    return run


def get_taskq(request: Request) -> TaskQ:
    """The app's ``TaskQ`` (a FastAPI dependency: ``Depends(get_taskq)``)."""
    try:
        tq: TaskQ = request.app.state.taskq
    except AttributeError:
        raise RuntimeError(
            "no TaskQ on this app: create it with lifespan=taskq.contrib.starlette.lifespan()"
        ) from None
    return tq


def too_many_requests(decision: RateLimitDecision, body: str = "Too Many Requests") -> Response:
    """A 429 response with ``Retry-After`` (whole seconds) for a denied ``decision``."""
    return PlainTextResponse(
        body, status_code=TOO_MANY_REQUESTS, headers=retry_after_header(decision)
    )


async def acquire_rate_limit(
    request: Request,
    limit: str | KeyedRateLimitRef[Any],
    *,
    key: str | None = None,
    count: float = 1.0,
) -> RateLimitDecision:
    """Take from ``limit`` (a name, or a keyed ref with ``key=``) with the app's taskq
    settings (Redis) and engine (Postgres-backed buckets); :func:`too_many_requests` a
    denial."""
    tq = get_taskq(request)
    async with registry.acquire(
        limit, key=key, count=count, pg_pool=tq.engine, settings=tq.settings
    ) as decision:
        return decision


def progress_route(
    path: str = "/jobs/{job_id}/progress",
    *,
    tq: TaskQ | None = None,
    redis_client: Redis | None = None,
    use_redis: bool = True,
    poll_interval: float = 0.5,
    authorize: Authorize | None = None,
    redact: RedactProgress | None = None,
    name: str | None = "taskq-progress",
) -> Route:
    """``GET path`` (with a ``{job_id}`` parameter): the job's progress as server-sent
    events, the admin UI's stream without the admin UI.

    ``tq`` is the ``TaskQ`` whose store is read (default: the app's, from :func:`lifespan`).
    Events come from Redis pub/sub on ``redis_client``, else on the client of ``tq``'s
    settings (``TASKQ_REDIS_URL``) when one is configured and ``use_redis``, else from the
    job's row, polled every ``poll_interval`` seconds. ``authorize(request, job_id)`` (sync
    or async) answers 403 when false; ``redact(actor, state)`` filters what is sent.

    Answers: 200 ``text/event-stream`` (``id:`` = the progress ``seq``, events after
    ``Last-Event-ID``, or ``?last_event_id=``; the stream ends after the terminal event),
    204 after the terminal event was seen, 400 for a bad ``Last-Event-ID``, 404 for an
    unknown job or a job id that is not a UUID.
    """
    if "{job_id" not in path:
        raise ValueError(f"path must contain {{job_id}}, got {path!r}")
    if poll_interval <= 0:
        raise ValueError("poll_interval must be > 0")

    async def endpoint(request: Request) -> Response:
        try:
            job_id = UUID(str(request.path_params["job_id"]))
        except ValueError:
            return PlainTextResponse("not a job id", status_code=404)
        if authorize is not None:
            verdict = authorize(request, job_id)
            if inspect.isawaitable(verdict):
                verdict = await verdict
            if not verdict:
                return PlainTextResponse("forbidden", status_code=403)
        raw = request.headers.get("last-event-id") or request.query_params.get("last_event_id")
        try:
            last = parse_last_event_id(raw)
        except ValueError as exc:
            return PlainTextResponse(str(exc), status_code=400)
        source = tq if tq is not None else get_taskq(request)
        client = redis_client
        if client is None and use_redis:
            client = settings_redis(source.settings)
        feed = ProgressFeed(StatsClient(source.engine), client, poll_interval)
        try:
            first = await feed.snapshot(job_id)
        except JobNotFoundError:
            return PlainTextResponse(f"no job {job_id}", status_code=404)
        keep = _redactor(redact, await source.jobs.detail(job_id)) if redact else None
        body = feed.stream(first, last, redact=keep, is_disconnected=request.is_disconnected)
        if body is None:
            return Response(status_code=204)
        return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)

    return Route(path, endpoint, methods=["GET"], name=name)


def _redactor(redact: RedactProgress, detail: Any) -> Callable[[dict[str, Any]], Any]:
    actor: str = detail.job.actor
    return lambda state: redact(actor, state)


def progress_app(*, tq: TaskQ | None = None, **options: Any) -> Router:
    """An ASGI app serving only :func:`progress_route` at ``/{job_id}``:
    ``app.mount("/progress", progress_app())`` answers ``GET /progress/<job id>``.
    ``options`` are :func:`progress_route`'s. Without ``tq`` the mounting app's
    ``TaskQ`` is used (its :func:`lifespan`): a plain ``Router``, not an app of its own,
    so requests keep the mounting app (and its ``app.state``)."""
    return Router(routes=[progress_route("/{job_id}", tq=tq, **options)])
