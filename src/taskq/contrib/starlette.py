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
* Progress over server-sent events is the admin UI's endpoint (``taskq.ui``), which can be
  mounted on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from typing import Any

from starlette.requests import Request
from starlette.responses import PlainTextResponse, Response

from taskq.client import TaskQ
from taskq.contrib.http import TOO_MANY_REQUESTS, retry_after_header
from taskq.ratelimit.decision import RateLimitDecision
from taskq.ratelimit.refs import KeyedRateLimitRef
from taskq.ratelimit.registry import registry

__all__ = ["acquire_rate_limit", "get_taskq", "lifespan", "too_many_requests"]


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
