"""The actor of the cross-process tracing test (imported by the test and the worker app)."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel

from taskq import actor
from taskq.context import JobContext


class Order(BaseModel):
    n: int


@actor(name="otel_e2e_order")
async def order(payload: Order, ctx: JobContext[Order]) -> None:
    ctx.log.info("order-processed", n=payload.n)


registry: dict[str, Any] = {order.name: order}
