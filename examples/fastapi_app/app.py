"""FastAPI + taskq: a view writes an order and enqueues its shipping job in one
transaction; the job calls a rate-limited outgoing API; each user is limited on their own.

Run it with the two commands of README.md.
"""

from __future__ import annotations

import asyncio
import os
import urllib.request
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel
from sqlalchemy import text

from taskq import TaskQ, actor
from taskq.contrib.starlette import acquire_rate_limit, get_taskq, lifespan, too_many_requests
from taskq.db.engine import make_engine
from taskq.db.migrate import upgrade
from taskq.ratelimit import KeyedRateLimitRef, TokenBucket

DATABASE_URL = os.environ.get(
    "TASKQ_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres"
)
API_URL = os.environ.get("SHIPPING_API_URL", "http://127.0.0.1:8000/shipping-api")

SHIPPING_API = TokenBucket("shipping_api", capacity=2, refill_per_second=2, backend="postgres")


class Ship(BaseModel):
    order_id: int


class Caller(BaseModel):
    user: str


PER_USER = KeyedRateLimitRef.typed(
    Caller,
    base_name="orders_per_user",
    key_fn=lambda c: c.user,
    capacity=5,
    refill_per_second=0.5,
    backend="postgres",
)


@actor(name="fastapi_example_ship", queue="shipping", rate_limits=[SHIPPING_API])
async def ship(payload: Ship) -> None:
    """Book the shipment with the (rate-limited) shipping API."""

    def call() -> None:
        with urllib.request.urlopen(f"{API_URL}?order={payload.order_id}", timeout=10) as reply:
            reply.read()

    await asyncio.to_thread(call)


ACTORS = [ship]


@asynccontextmanager
async def _startup(app: FastAPI) -> AsyncIterator[None]:
    engine = make_engine(DATABASE_URL)
    await upgrade(engine)  # taskq's tables (the same as `taskq migrate up`)
    async with engine.begin() as conn:
        await conn.execute(
            text("CREATE TABLE IF NOT EXISTS orders (id serial PRIMARY KEY, item text)")
        )
    await engine.dispose()
    yield


app = FastAPI(lifespan=lifespan(dsn=DATABASE_URL, wrap=_startup))


@app.post("/orders")
async def place_order(
    request: Request,
    user: str,
    item: str = "book",
    tq: TaskQ = Depends(get_taskq),  # noqa: B008
) -> Response:
    decision = await acquire_rate_limit(request, PER_USER, key=user)
    if not decision.allowed:
        return too_many_requests(decision)
    async with tq.engine.begin() as conn:  # the order and its job: one transaction
        order_id = (
            await conn.execute(
                text("INSERT INTO orders (item) VALUES (:item) RETURNING id"), {"item": item}
            )
        ).scalar_one()
        job = await tq.enqueue(ship, Ship(order_id=order_id), connection=conn)
    return JSONResponse({"order": order_id, "job": str(job.job_id)})


@app.get("/shipping-api")
async def shipping_api(order: int) -> dict[str, int]:
    return {"booked": order}
