"""A real FastAPI app for the framework tests (and its worker's actors).

``POST /orders`` writes an order and enqueues ``fastapi_ship`` (queue ``fastapi``) on the
same connection, in one transaction; ``?fail=1`` raises after both. ``GET /me/{user}``
is limited per user by a keyed bucket (3 each). ``ACTORS`` is the worker's.
"""

from __future__ import annotations

import os
from typing import Any

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy import text

from taskq import TaskQ, actor
from taskq.contrib.starlette import acquire_rate_limit, get_taskq, lifespan, too_many_requests
from taskq.ratelimit import KeyedRateLimitRef


class ShipOrder(BaseModel):
    order_id: int


@actor(name="fastapi_ship", queue="fastapi")
def fastapi_ship(payload: ShipOrder) -> None:
    with open(os.environ["FASTAPI_RUNS_FILE"], "a") as out:
        out.write(f"{payload.order_id}\n")


ACTORS = [fastapi_ship]


class User(BaseModel):
    user: str


def create_app(bucket: str, **taskq_options: Any) -> FastAPI:
    per_user = KeyedRateLimitRef.typed(
        User, base_name=bucket, key_fn=lambda u: u.user, capacity=3, refill_per_second=0.0001
    )
    app = FastAPI(lifespan=lifespan(**taskq_options))

    @app.post("/orders")
    async def place_order(fail: int = 0, tq: TaskQ = Depends(get_taskq)) -> Response:  # noqa: B008
        async with tq.engine.begin() as conn:
            order_id = (
                await conn.execute(text("INSERT INTO fastapi_orders DEFAULT VALUES RETURNING id"))
            ).scalar_one()
            handle = await tq.enqueue(fastapi_ship, ShipOrder(order_id=order_id), connection=conn)
            if fail:
                raise RuntimeError("the view failed after the enqueue")
        return JSONResponse({"order": order_id, "job": str(handle.job_id)})

    @app.get("/me/{user}")
    async def me(user: str, request: Request) -> Response:
        decision = await acquire_rate_limit(request, per_user, key=user)
        if not decision.allowed:
            return too_many_requests(decision)
        return JSONResponse({"user": user})

    return app
