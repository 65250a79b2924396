# ruff: noqa
"""The actors page's "Testing actors without a database" example, as written."""

import pytest
from datetime import datetime, timezone
from pydantic import BaseModel
from taskq import actor
from taskq.client import JobsClient
from taskq.testing.in_memory import InMemoryBackend
from taskq.testing.clock import FakeClock


class MyPayload(BaseModel):
    value: int


class MyResult(BaseModel):
    doubled: int


@actor
async def double_value(payload: MyPayload) -> MyResult:
    return MyResult(doubled=payload.value * 2)


async def test_double_value():
    clock = FakeClock(start=datetime.now(timezone.utc))
    backend = InMemoryBackend(clock=clock)
    client = JobsClient(backend)

    # Register a stub so run_until_drained knows how to execute the actor.
    # Pass the ActorRef, not the bare name: the ref carries the declared
    # payload model, so the stub validates payloads against it (a bare name
    # falls back to the permissive PassthroughPayload and emits a warning).
    backend.register_stub(
        double_value,
        lambda payload, ctx: {"doubled": payload.value * 2},
    )

    handle = await client.enqueue(double_value, MyPayload(value=21))
    await backend.run_until_drained()
    result = await handle.wait()
    assert result.doubled == 42


async def test_actor_direct():
    result = await double_value(MyPayload(value=21))
    assert result.doubled == 42
