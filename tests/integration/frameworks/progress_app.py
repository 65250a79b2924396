"""A FastAPI app whose only taskq route is the progress stream (no admin UI), and the
actor its worker runs.

``GET /jobs/{job_id}/progress`` is :func:`progress_route` in the FastAPI app (Redis
pub/sub from the app's settings); ``/store/{job_id}`` is :func:`progress_app` mounted, on
the job's row only (``use_redis=False``). ``sse_steps`` reports ``before`` progress
updates, waits for its gate file, then reports ``after`` more and succeeds.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

from fastapi import FastAPI
from pydantic import BaseModel

from taskq import actor
from taskq.context import JobContext
from taskq.contrib.starlette import lifespan, progress_app, progress_route


class Steps(BaseModel):
    before: int
    after: int
    gate: str


@actor(name="sse_contrib_steps")
async def sse_steps(payload: Steps, ctx: JobContext[Steps]) -> None:
    for i in range(payload.before):
        await ctx.progress(step=i + 1)
    # a file another process creates: polled (a stat, in a test actor)
    while not Path(payload.gate).exists():  # noqa: ASYNC110, ASYNC240
        await asyncio.sleep(0.05)
    for i in range(payload.before, payload.before + payload.after):
        await ctx.progress(step=i + 1)


ACTORS = [sse_steps]


def create_app(**taskq_options: Any) -> FastAPI:
    app = FastAPI(lifespan=lifespan(**taskq_options))
    app.router.routes.append(progress_route(poll_interval=0.05))
    app.mount("/store", progress_app(use_redis=False, poll_interval=0.05))
    return app
