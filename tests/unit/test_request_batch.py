"""``RequestBatch`` (requests made a chunk at a time) and the client's ``_Items`` that
makes an ``enqueue_many``'s requests: what is known before any payload is validated."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from pydantic import BaseModel

from taskq import actor
from taskq.client import _Items
from taskq.exceptions import PayloadValidationError
from taskq.records import EnqueueArgs, EnqueueRequest, build_request, request_template
from taskq.request_batch import RequestBatch
from tests.support.producer import first_error


class Body(BaseModel):
    n: int


@actor(name="batch_plain", queue="batch_q", priority=4)
async def batch_plain(payload: Body) -> None: ...


@actor(name="batch_other", queue="batch_r")
async def batch_other(payload: Body) -> None: ...


@actor(name="batch_singleton", singleton=True)
async def batch_singleton(payload: Body) -> None: ...


@actor(name="batch_capped", max_pending=10)
async def batch_capped(payload: Body) -> None: ...


@actor(name="batch_unique", unique_for=timedelta(minutes=1))
async def batch_unique(payload: Body) -> None: ...


def _batch(items: list[Any]) -> tuple[_Items, RequestBatch]:
    made = _Items(items)
    return made, made.batch()


def test_pairs_of_plain_actors_are_known_before_anything_is_made() -> None:
    calls: list[tuple[int, int]] = []
    made, batch = _batch([(batch_plain, Body(n=1)), ("batch_other", {"n": 2})] * 5)
    real = batch._make

    def spy(start: int, stop: int) -> list[EnqueueRequest]:
        calls.append((start, stop))
        return real(start, stop)

    batch._make = spy
    assert batch.plain
    assert batch.actors == {"batch_plain", "batch_other"}
    assert batch.queues == ("batch_q", "batch_r")
    assert made.refs == [batch_plain, batch_other] * 5
    chunks = batch.chunks(4)
    first = next(chunks)
    assert calls == [(0, 4)]  # one chunk at a time, when asked for
    rest = list(chunks)
    assert calls == [(0, 4), (4, 8), (8, 10)]
    again = [len(chunk) for chunk in batch.chunks(4, first=1)]
    assert again == [1, 4, 4, 1]
    assert calls == [(0, 4), (4, 8), (8, 10)]  # made once
    requests = first + [req for chunk in rest for req in chunk]
    assert requests == batch.all() == batch.made
    assert [req.payload for req in requests] == [{"n": 1}, {"n": 2}] * 5
    assert len({req.job_id for req in requests}) == 10


def test_a_made_request_equals_the_one_build_request_makes() -> None:
    _, batch = _batch([(batch_plain, Body(n=3)), (batch_other, {"n": 4})])
    for req, (ref, payload) in zip(
        batch.all(), [(batch_plain, Body(n=3)), (batch_other, {"n": 4})], strict=True
    ):
        built = build_request(ref, payload, job_id=req.job_id)
        assert req == built


@pytest.mark.parametrize(
    "items",
    [
        [(batch_plain, {"n": 1}), (batch_singleton, {"n": 2})],
        [(batch_plain, {"n": 1}), (batch_capped, {"n": 2})],
        [(batch_plain, {"n": 1}), EnqueueArgs(batch_plain, {"n": 2})],
        [(batch_plain, {"n": 1}), ("batch_nobody", {"n": 2})],
        [(batch_plain, {"n": 1}), [batch_plain, {"n": 2}]],
        [(batch_plain, {"n": 1}), (batch_plain, {"n": 2}, "extra")],
        [(batch_plain, {"n": 1}), (42, {"n": 2})],
    ],
    ids=["singleton", "max_pending", "options", "unknown", "list", "triple", "not-an-actor"],
)
def test_anything_else_is_not_known_until_made(items: list[Any]) -> None:
    _, batch = _batch(items)
    assert not batch.plain
    assert batch.actors == frozenset()
    assert batch.queues == ()


def test_unique_for_without_identity_is_plain() -> None:
    """A pair carries no identity_key, so unique_for has nothing to deduplicate on."""
    _, batch = _batch([(batch_unique, {"n": 1})])
    assert batch.plain


def test_the_first_bad_item_raises_and_keeps_what_was_made() -> None:
    items: list[Any] = [(batch_plain, Body(n=i)) for i in range(6)]
    items[4] = (batch_plain, {"n": "bad"})
    items[5] = (batch_plain, {"n": "worse"})
    _, batch = _batch(items)
    chunks = batch.chunks(3)
    assert len(next(chunks)) == 3
    with pytest.raises(PayloadValidationError) as caught:
        next(chunks)
    assert first_error(caught.value)["input"] == "bad"
    assert len(batch.made) == 3


def test_a_batch_of_made_requests() -> None:
    template = request_template(batch_plain)
    requests: list[EnqueueRequest] = [
        build_request(batch_plain, {"n": 1}),
        build_request(batch_other, {"n": 2}, queue="batch_z"),
    ]
    batch = RequestBatch.of(requests)
    assert batch.plain
    assert batch.size == 2
    assert batch.queues == ("batch_q", "batch_z")
    assert [req for chunk in batch.chunks(1) for req in chunk] == requests == batch.all()
    assert [len(chunk) for chunk in batch.chunks(5, first=1)] == [1, 1]
    assert (template.payload, template.queue, template.priority) == ({}, "batch_q", 4)
    assert not RequestBatch.of([build_request(batch_plain, {"n": 1}, idempotency_key="k")]).plain
