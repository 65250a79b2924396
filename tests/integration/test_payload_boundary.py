"""Bad payloads get a clear error at the boundary and nothing is written.

NaN and infinities inside ``Any``-typed fields (which pydantic's JSON-mode dump silently
turns into ``null``), lone surrogates, nesting deeper than the serialiser goes, and
payloads over ``TASKQ_PAYLOAD_MAX_BYTES``: single enqueues, ``enqueue_many``, and results.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.actor import payload_max_bytes
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.exceptions import PayloadValidationError
from tests.support.workers import count_jobs


class Loose(BaseModel):
    data: Any = None
    n: int = 0


class LooseResult(BaseModel):
    echo: Any = None


@actor(name="boundary_loose")
async def loose(payload: Loose) -> LooseResult:
    return LooseResult(echo=payload.data)


DEEP = json.loads("[" * 300 + "]" * 300)


def _first(exc: PayloadValidationError) -> Any:
    assert not isinstance(exc.errors, str)
    return exc.errors[0]


@pytest.fixture
def client(engine: AsyncEngine) -> JobsClient:
    return JobsClient(SqlBackend(engine))


@pytest.mark.parametrize(
    ("data", "kind", "loc"),
    [
        ([1.0, {"x": float("nan")}], "finite_number", ("data", 1, "x")),
        ({"y": float("inf")}, "finite_number", ("data", "y")),
        (float("-inf"), "finite_number", ("data",)),
        ("a\ud800b", "string_surrogate", ("data",)),
        (DEEP, "too_deep", ("data",)),
    ],
)
async def test_a_bad_value_in_an_any_field_is_refused_and_nothing_is_written(
    client: JobsClient, engine: AsyncEngine, data: Any, kind: str, loc: tuple[Any, ...]
) -> None:
    with pytest.raises(PayloadValidationError) as info:
        await client.enqueue(loose, Loose(data=data))
    assert info.value.actor == "boundary_loose"
    error = _first(info.value)
    assert (error["type"], tuple(error["loc"])) == (kind, loc)
    assert await count_jobs(engine) == 0


async def test_one_nan_in_a_300_item_enqueue_many_writes_nothing(
    client: JobsClient, engine: AsyncEngine
) -> None:
    items = [(loose, Loose(data={"v": float(i)}, n=i)) for i in range(300)]
    items[150] = (loose, Loose(data={"v": float("nan")}, n=150))
    with pytest.raises(PayloadValidationError) as info:
        await client.enqueue_many(items)
    assert _first(info.value)["type"] == "finite_number"
    assert await count_jobs(engine) == 0
    await client.enqueue_many(items[:150])  # the good ones still go in
    assert await count_jobs(engine) == 150


async def test_one_lone_surrogate_in_an_enqueue_many_writes_nothing(
    client: JobsClient, engine: AsyncEngine
) -> None:
    items = [(loose, Loose(n=i)) for i in range(50)] + [(loose, Loose(data="\udfff"))]
    with pytest.raises(PayloadValidationError) as info:
        await client.enqueue_many(items)
    assert _first(info.value)["type"] == "string_surrogate"
    assert await count_jobs(engine) == 0


@pytest.fixture
def small_limit(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    monkeypatch.setenv("TASKQ_PAYLOAD_MAX_BYTES", "1000")
    payload_max_bytes.cache_clear()
    yield 1000
    monkeypatch.delenv("TASKQ_PAYLOAD_MAX_BYTES")
    payload_max_bytes.cache_clear()


async def test_a_payload_over_the_size_limit_is_refused(
    client: JobsClient, engine: AsyncEngine, small_limit: int
) -> None:
    with pytest.raises(PayloadValidationError) as info:
        await client.enqueue(loose, Loose(data="x" * 2000))
    error = _first(info.value)
    assert error["type"] == "too_large"
    assert "TASKQ_PAYLOAD_MAX_BYTES" in error["msg"]
    with pytest.raises(PayloadValidationError):
        await client.enqueue_many([(loose, Loose(n=1)), (loose, Loose(data="x" * 2000))])
    assert await count_jobs(engine) == 0
    await client.enqueue(loose, Loose(data="x" * 100))
    assert await count_jobs(engine) == 1


def test_a_result_with_a_nan_in_an_any_value_cannot_be_stored() -> None:
    with pytest.raises(ValueError, match="cannot be stored"):
        loose.dump_result(LooseResult(echo=[float("nan")]))
    assert loose.dump_result(LooseResult(echo=[1.5])) == {"echo": [1.5]}
