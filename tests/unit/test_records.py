"""``request_like``: the per-item shortcut of ``enqueue_many`` must equal a full ``build_request``."""

from __future__ import annotations

import dataclasses
from datetime import timedelta

from pydantic import BaseModel

from taskq import actor
from taskq.records import build_request, request_like
from taskq.retry import RetryPolicy


class Item(BaseModel):
    n: int


@actor(
    name="records_like",
    queue="q1",
    priority=4,
    retry=RetryPolicy(max_attempts=7),
    start_to_close=timedelta(seconds=9),
    unique_for=timedelta(minutes=1),
    max_pending=50,
    singleton=True,
)
async def like(payload: Item) -> None: ...


def test_request_like_equals_a_full_build() -> None:
    template = build_request(like, Item(n=1), start_to_close=timedelta(seconds=1))
    made = request_like(template, like.dump_payload(Item(n=2)))
    full = build_request(like, Item(n=2), start_to_close=timedelta(seconds=1))
    assert made.job_id not in (template.job_id, full.job_id)
    assert dataclasses.replace(made, job_id=full.job_id) == full
    assert made.metadata == {"singleton": True}
    assert made.metadata is not template.metadata
