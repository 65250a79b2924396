"""Producer-side behaviour, once per store (Postgres, SQLite, in-memory) and client (async, sync)."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from structlog.testing import capture_logs

from taskq import actor
from taskq.exceptions import (
    JobCancelledError,
    JobFailedError,
    JobNotFoundError,
    MaxPendingExceededError,
    PayloadValidationError,
    SingletonCollisionError,
    WaitTimeout,
)
from taskq.records import EnqueueArgs
from tests.support.producer import Env, first_error


class Item(BaseModel):
    n: int


class Doubled(BaseModel):
    doubled: int


@actor(name="prod_plain", queue="work", priority=3)
async def plain(payload: Item) -> Doubled:
    return Doubled(doubled=payload.n * 2)


@actor(name="prod_unique", unique_for=timedelta(minutes=10))
async def unique(payload: Item) -> None: ...


@actor(
    name="prod_unique_active",
    unique_for=timedelta(minutes=10),
    unique_states=("pending", "scheduled", "running"),
)
async def unique_active(payload: Item) -> None: ...


@actor(name="prod_singleton", singleton=True)
async def single(payload: Item) -> None: ...


@actor(name="prod_capped", max_pending=2)
async def capped(payload: Item) -> None: ...


@actor(name="prod_closed", max_pending=0)
async def closed(payload: Item) -> None: ...


@actor(name="prod_hundred", max_pending=100)
async def hundred(payload: Item) -> None: ...


@actor(name="prod_single_capped", singleton=True, max_pending=0)
async def single_capped(payload: Item) -> None: ...


@actor(name="prod_unique_capped", unique_for=timedelta(minutes=10), max_pending=1)
async def unique_capped(payload: Item) -> None: ...


@actor(name="prod_percall_tighter", max_pending=100)
async def percall_tighter(payload: Item) -> None: ...


@actor(name="prod_percall_wider", max_pending=100)
async def percall_wider(payload: Item) -> None: ...


@actor(name="prod_timed", start_to_close=timedelta(seconds=30))
async def timed(payload: Item) -> None: ...


class Tagged(BaseModel):
    n: int
    tag: str = "t"


class MoreItem(Item):
    extra: str = "dropped"


class Measured(BaseModel):
    x: float
    values: list[float] = []
    label: str = ""
    extra: dict[str, Any] = {}


@actor(name="prod_measured")
async def measured(payload: Measured) -> None: ...


@actor(name="prod_other", queue="other")
async def other(payload: Tagged) -> None: ...


async def test_enqueue_creates_a_pending_job_with_actor_defaults(producer_env: Env) -> None:
    env = producer_env
    handle = await env.enqueue(plain, Item(n=1))
    assert handle.was_existing is False
    assert handle.deduplicated_onto_terminal is False
    record = await env.call(handle.refresh)
    assert (record.actor, record.queue, record.priority, record.status) == (
        "prod_plain",
        "work",
        3,
        "pending",
    )
    assert record.payload == {"n": 1}
    assert record.max_attempts == 3
    assert await env.call(handle.status) == "pending"
    assert await env.call(handle.attempts) == []


async def test_enqueue_options_are_stored(producer_env: Env) -> None:
    env = producer_env
    handle = await env.enqueue(
        plain,
        {"n": 2},
        queue="other",
        priority=-5,
        delay=timedelta(hours=1),
        identity_key="id-1",
        idempotency_key="idem-1",
        tags=["a", "b"],
        metadata={"k": "v"},
        start_to_close=timedelta(seconds=30),
        schedule_to_close=timedelta(minutes=5),
    )
    record = await env.call(handle.refresh)
    assert record.status == "scheduled"
    assert record.queue == "other"
    assert record.priority == -5
    assert record.created_at + timedelta(minutes=59) < record.scheduled_at
    assert (record.identity_key, record.idempotency_key) == ("id-1", "idem-1")
    assert record.tags == ["a", "b"]
    assert record.metadata == {"k": "v"}
    assert record.start_to_close_s == 30.0
    assert record.schedule_to_close_s == 300.0
    assert record.deadline_at is not None

    at = datetime(2031, 1, 1, tzinfo=UTC)
    later = await env.call((await env.enqueue(plain, Item(n=3), scheduled_at=at)).refresh)
    assert (later.status, later.scheduled_at) == ("scheduled", at)


async def test_wait_returns_the_typed_result(producer_env: Env) -> None:
    env = producer_env
    handle = await env.enqueue(plain, Item(n=21))
    await env.finish(handle.job_id, "succeeded", result={"doubled": 42})
    result = await env.call(handle.wait, timeout=5)
    assert result == Doubled(doubled=42)

    again = await env.call(env.client.get, handle.job_id, result_adapter=plain.result_adapter)
    assert (await env.call(again.wait)).doubled == 42


async def test_wait_raises_the_jobs_failure(producer_env: Env) -> None:
    env = producer_env
    failed = await env.enqueue(plain, Item(n=1))
    await env.finish(failed.job_id, "failed", error_class="ValueError")
    with pytest.raises(JobFailedError) as info:
        await env.call(failed.wait, timeout=5)
    assert (info.value.status, info.value.error_class) == ("failed", "ValueError")

    cancelled = await env.enqueue(plain, Item(n=2))
    record = await env.call(cancelled.cancel)
    assert (record.status, record.error_class) == ("cancelled", "CancelledBeforeStart")
    with pytest.raises(JobCancelledError):
        await env.call(cancelled.wait, timeout=5)


async def test_wait_times_out_and_unknown_jobs_are_reported(producer_env: Env) -> None:
    env = producer_env
    handle = await env.enqueue(plain, Item(n=1))
    with pytest.raises(WaitTimeout):
        await env.call(handle.wait, timeout=0.05)
    missing = type(handle.job_id)(int=1)
    with pytest.raises(JobNotFoundError):
        await env.call(env.client.get, missing)


async def test_wait_wakes_when_the_job_finishes(producer_env: Env) -> None:
    env = producer_env
    handle = await env.enqueue(plain, Item(n=5))
    waiter = asyncio.ensure_future(env.call(handle.wait, timeout=10))
    await asyncio.sleep(0)  # let the waiter start polling/waiting before the job finishes
    await env.finish(handle.job_id, "succeeded", result={"doubled": 10})
    assert (await waiter).doubled == 10


async def test_unique_for_dedupes_by_identity_key(producer_env: Env) -> None:
    env = producer_env
    first = await env.enqueue(unique, Item(n=1), identity_key="acct_123")
    second = await env.enqueue(unique, Item(n=2), identity_key="acct_123")
    other = await env.enqueue(unique, Item(n=3), identity_key="acct_456")
    assert second.was_existing
    assert second.job_id == first.job_id
    assert not second.deduplicated_onto_terminal
    assert not other.was_existing
    assert other.job_id != first.job_id
    assert await env.count("prod_unique") == 2


async def test_unique_for_without_identity_key_is_a_noop(producer_env: Env) -> None:
    env = producer_env
    from taskq import records

    records._warned_unique_ignored.discard("prod_unique")
    with capture_logs() as logs:
        a = await env.enqueue(unique, Item(n=1))
        b = await env.enqueue(unique, Item(n=1))
    assert a.job_id != b.job_id
    warnings = [e for e in logs if e["event"] == "actor_config_unique_for_ignored"]
    assert len(warnings) == 1
    assert warnings[0]["log_level"] == "warning"


async def test_unique_for_matches_succeeded_and_reports_terminal(producer_env: Env) -> None:
    env = producer_env
    first = await env.enqueue(unique, Item(n=1), identity_key="k")
    await env.finish(first.job_id, "succeeded")
    with capture_logs() as logs:
        again = await env.enqueue(unique, Item(n=1), identity_key="k")
    assert again.was_existing
    assert again.deduplicated_onto_terminal
    assert again.job_id == first.job_id
    [line] = [e for e in logs if e["event"] == "enqueue_deduplicated"]
    assert (line["log_level"], line["matched_status"]) == ("warning", "succeeded")


async def test_unique_for_ignores_failed_and_respects_unique_states(producer_env: Env) -> None:
    env = producer_env
    first = await env.enqueue(unique, Item(n=1), identity_key="k")
    await env.finish(first.job_id, "failed")
    fresh = await env.enqueue(unique, Item(n=1), identity_key="k")
    assert not fresh.was_existing

    active = await env.enqueue(unique_active, Item(n=1), identity_key="k")
    await env.finish(active.job_id, "succeeded")
    after = await env.enqueue(unique_active, Item(n=1), identity_key="k")
    assert not after.was_existing
    assert after.job_id != active.job_id


async def test_singleton_blocks_a_second_active_job(producer_env: Env) -> None:
    env = producer_env
    first = await env.enqueue(single, Item(n=1), metadata={"singleton": False, "x": 1})
    record = await env.call(first.refresh)
    assert record.metadata == {"singleton": True, "x": 1}
    with pytest.raises(SingletonCollisionError) as info:
        await env.enqueue(single, Item(n=2), identity_key="different")
    assert info.value.blocking_job_id == first.job_id
    assert info.value.retry_after is None
    await env.finish(first.job_id, "succeeded")
    second = await env.enqueue(single, Item(n=3))
    assert second.job_id != first.job_id


async def test_max_pending_rejects_at_the_cap(producer_env: Env) -> None:
    env = producer_env
    await env.enqueue(capped, Item(n=1))
    await env.enqueue(capped, Item(n=2), delay=timedelta(hours=1))  # scheduled counts too
    with pytest.raises(MaxPendingExceededError) as info:
        await env.enqueue(capped, Item(n=3))
    assert (info.value.actor, info.value.current_count, info.value.max_pending) == (
        "prod_capped",
        2,
        2,
    )
    with pytest.raises(MaxPendingExceededError):
        await env.enqueue(closed, Item(n=1))
    assert await env.count("prod_capped") == 2
    assert await env.count("prod_closed") == 0


async def test_stored_max_pending_overrides_the_literal(producer_env: Env) -> None:
    env = producer_env
    await env.set_stored_max_pending("prod_hundred", 1)
    await env.enqueue(hundred, Item(n=1))
    with pytest.raises(MaxPendingExceededError) as info:
        await env.enqueue(hundred, Item(n=2))
    assert info.value.max_pending == 1


async def test_a_per_call_max_pending_is_resolved_against_the_stored_cap(
    producer_env: Env,
) -> None:
    """The actors page: against a stored cap the tighter of the two wins (a caller may shed
    load, never widen the operator's cap); with nothing stored the per-call value wins
    over the literal in both directions. Per-call caps travel in ``EnqueueArgs``."""
    env = producer_env
    many = env.client.enqueue_many
    await env.set_stored_max_pending("prod_percall_tighter", 50)
    await env.enqueue(percall_tighter, Item(n=1))
    with pytest.raises(MaxPendingExceededError) as tighter:
        await env.call(many, [EnqueueArgs(percall_tighter, Item(n=2), {"max_pending": 1})])
    assert (tighter.value.current_count, tighter.value.max_pending) == (1, 1)

    await env.set_stored_max_pending("prod_percall_wider", 1)
    await env.enqueue(percall_wider, Item(n=1))
    with pytest.raises(MaxPendingExceededError) as wider:
        await env.call(many, [EnqueueArgs(percall_wider, Item(n=2), {"max_pending": 10})])
    assert wider.value.max_pending == 1

    await env.enqueue(capped, Item(n=1))
    await env.enqueue(capped, Item(n=2))
    await env.call(many, [EnqueueArgs(capped, Item(n=3), {"max_pending": 3})])  # loosened
    with pytest.raises(MaxPendingExceededError):
        await env.enqueue(capped, Item(n=4))  # the literal, 2, again
    assert await env.count("prod_percall_tighter") == 1
    assert await env.count("prod_percall_wider") == 1
    assert await env.count("prod_capped") == 3


async def test_each_item_of_a_batch_has_its_own_per_call_cap(producer_env: Env) -> None:
    """Items of one actor with and without a per-call cap, in either order: each is held
    to its own cap (the literal, 100, for the plain one)."""
    env = producer_env
    many = env.client.enqueue_many
    await env.enqueue(percall_wider, Item(n=0))
    capped_second = [
        (percall_wider, Item(n=1)),
        EnqueueArgs(percall_wider, Item(n=2), {"max_pending": 1}),
    ]
    with pytest.raises(MaxPendingExceededError) as second:
        await env.call(many, capped_second)
    assert second.value.max_pending == 1
    capped_first = [
        EnqueueArgs(percall_wider, Item(n=1), {"max_pending": 1}),
        (percall_wider, Item(n=2)),
    ]
    with pytest.raises(MaxPendingExceededError) as first:
        await env.call(many, capped_first)
    assert first.value.max_pending == 1
    assert await env.count("prod_percall_wider") == 1  # all or nothing, both times
    loose = [EnqueueArgs(percall_wider, Item(n=3), {"max_pending": 5}), (percall_wider, Item(n=4))]
    await env.call(many, loose)
    assert await env.count("prod_percall_wider") == 3


async def test_enqueue_many_rejects_an_unknown_item_option(producer_env: Env) -> None:
    env = producer_env
    items: list[Any] = [(plain, Item(n=1)), EnqueueArgs(plain, Item(n=2), {"job_id": None})]  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="item 1: unknown option"):
        await env.call(env.client.enqueue_many, items)
    assert await env.count("prod_plain") == 0


async def test_only_the_per_enqueue_start_to_close_is_stored(producer_env: Env) -> None:
    """The actor's default and ``TASKQ_DEFAULT_START_TO_CLOSE`` are the worker's to apply
    when the attempt runs (so a changed actor default reaches queued jobs)."""
    env = producer_env
    defaulted = await env.call((await env.enqueue(timed, Item(n=1))).refresh)
    assert defaulted.start_to_close_s is None
    chosen = await env.enqueue(timed, Item(n=2), start_to_close=timedelta(seconds=5))
    assert (await env.call(chosen.refresh)).start_to_close_s == 5.0
    [bulk] = await env.call(env.client.enqueue_many, [(timed, Item(n=3))])
    assert (await env.call(bulk.refresh)).start_to_close_s is None


async def test_singleton_retry_after_is_the_time_left_to_the_blockers_deadline(
    producer_env: Env,
) -> None:
    env = producer_env
    first = await env.enqueue(single, Item(n=1), schedule_to_close=timedelta(hours=2))
    if env.memory is not None:
        env.memory.clock.advance(timedelta(minutes=30))  # type: ignore[attr-defined]
    with pytest.raises(SingletonCollisionError) as info:
        await env.enqueue(single, Item(n=2))
    assert info.value.blocking_job_id == first.job_id
    retry_after = info.value.retry_after
    assert retry_after is not None
    if env.memory is not None:
        assert retry_after == timedelta(hours=1, minutes=30)
        env.memory.clock.advance(timedelta(hours=3))  # type: ignore[attr-defined]
        with pytest.raises(SingletonCollisionError) as late:
            await env.enqueue(single, Item(n=3))
        assert late.value.retry_after == timedelta(0)  # past its deadline, still active
    else:
        assert timedelta(hours=2) - timedelta(minutes=1) < retry_after <= timedelta(hours=2)


async def test_the_singleton_metadata_key_is_the_librarys(producer_env: Env) -> None:
    env = producer_env
    handle = await env.enqueue(plain, Item(n=1), metadata={"singleton": True, "x": 1})
    assert (await env.call(handle.refresh)).metadata == {"x": 1}


async def test_evaluation_order(producer_env: Env) -> None:
    env = producer_env
    # No active singleton job: the pre-flight passes and the cap of 0 rejects.
    with pytest.raises(MaxPendingExceededError):
        await env.enqueue(single_capped, Item(n=1))
    # A unique_for hit bypasses max_pending.
    first = await env.enqueue(unique_capped, Item(n=1), identity_key="k")
    again = await env.enqueue(unique_capped, Item(n=1), identity_key="k")
    assert again.was_existing
    assert again.job_id == first.job_id
    with pytest.raises(MaxPendingExceededError):
        await env.enqueue(unique_capped, Item(n=1), identity_key="other")


async def test_singleton_fires_before_max_pending(producer_env: Env) -> None:
    env = producer_env
    await env.enqueue(single, Item(n=1))
    await env.set_stored_max_pending("prod_singleton", 0)
    with pytest.raises(SingletonCollisionError):
        await env.enqueue(single, Item(n=2))


async def test_idempotency_key_returns_the_existing_job(producer_env: Env) -> None:
    env = producer_env
    first = await env.enqueue(plain, Item(n=1), idempotency_key="order-9")
    await env.finish(first.job_id, "succeeded", result={"doubled": 2})
    again = await env.enqueue(plain, Item(n=1), idempotency_key="order-9")
    assert again.was_existing
    assert again.job_id == first.job_id
    assert await env.count("prod_plain") == 1


async def test_enqueue_many(producer_env: Env) -> None:
    env = producer_env
    items: list[Any] = [(plain, Item(n=i)) for i in range(50)]
    items.append(EnqueueArgs(unique, Item(n=0), {"identity_key": "u"}))
    items.append(EnqueueArgs(unique, Item(n=1), {"identity_key": "u"}))
    handles = await env.call(env.client.enqueue_many, items)
    assert len(handles) == 52
    assert len({h.job_id for h in handles[:50]}) == 50
    assert handles[51].was_existing
    assert handles[51].job_id == handles[50].job_id
    assert await env.count("prod_plain") == 50
    assert await env.call(env.client.enqueue_many, []) == []


async def test_enqueue_many_keeps_each_item_in_its_place(producer_env: Env) -> None:
    """Interleaved actors and payload kinds (model instances, which ``enqueue_many`` dumps
    per actor in one go; mappings and other models, validated in turn) come back in
    order, each with its own payload, ids increasing along the batch."""
    env = producer_env
    items: list[Any] = []
    expected: list[tuple[str, dict[str, Any]]] = []
    for i in range(12):
        if i % 3 == 0:
            items.append((other, Tagged(n=i, tag=f"x{i}")))
            expected.append(("prod_other", {"n": i, "tag": f"x{i}"}))
        elif i % 3 == 1:
            items.append((plain, Item(n=i)))
            expected.append(("prod_plain", {"n": i}))
        elif i % 4 == 2:
            items.append((plain, {"n": str(i)}))  # coerced by validation
            expected.append(("prod_plain", {"n": i}))
        else:
            items.append((plain, MoreItem(n=i)))  # another model: re-validated, extra dropped
            expected.append(("prod_plain", {"n": i}))
    handles = await env.call(env.client.enqueue_many, items)
    ids = [h.job_id for h in handles]
    assert ids == sorted(ids)
    records = [await env.call(h.refresh) for h in handles]
    assert [(r.actor, r.payload) for r in records] == expected
    assert [r.queue for r in records[:3]] == ["other", "work", "work"]


async def test_enqueue_many_reports_the_first_bad_item(producer_env: Env) -> None:
    env = producer_env
    items: list[Any] = [(plain, Item(n=1)), (other, Tagged(n=2)), (other, Tagged(n=3))]
    items += [(other, {"n": "bad"}), (plain, Item(n=4)), (plain, {"n": "worse"})]
    with pytest.raises(PayloadValidationError) as caught:
        await env.call(env.client.enqueue_many, items)
    assert caught.value.actor == "prod_other"
    assert await env.count("prod_plain") == 0
    assert await env.count("prod_other") == 0


async def test_enqueue_many_is_all_or_nothing(producer_env: Env) -> None:
    env = producer_env
    with pytest.raises(PayloadValidationError):
        await env.call(env.client.enqueue_many, [(plain, Item(n=1)), (plain, {"n": "x"})])
    await env.enqueue(single, Item(n=1))
    with pytest.raises(SingletonCollisionError):
        await env.call(env.client.enqueue_many, [(plain, Item(n=1)), (single, Item(n=2))])
    assert await env.count("prod_plain") == 0


@pytest.mark.parametrize(
    ("args", "options", "error"),
    [
        pytest.param(
            ("prod_plain", {"n": "not a number"}), {}, PayloadValidationError, id="payload"
        ),
        pytest.param(("no_such_actor", {"n": 1}), {}, LookupError, id="unknown-actor"),
        pytest.param(("prod_plain", {"n": 1}), {"priority": 40_000}, ValueError, id="priority"),
        pytest.param(
            ("prod_plain", {"n": 1}), {"identity_key": "k" * 201}, ValueError, id="identity"
        ),
        pytest.param(
            ("prod_plain", {"n": 1}), {"metadata": {"when": object()}}, TypeError, id="metadata"
        ),
        pytest.param(("prod_plain", {"n": 1}), {"queue": "a:b"}, ValueError, id="queue"),
        pytest.param(
            ("prod_plain", {"n": 1}), {"metadata": {"v": float("nan")}}, TypeError, id="meta-nan"
        ),
        pytest.param(
            ("prod_plain", {"n": 1}), {"metadata": {"v": "a\x00"}}, ValueError, id="meta-nul"
        ),
        pytest.param(
            ("prod_plain", {"n": 1}), {"identity_key": "k\x00"}, ValueError, id="identity-nul"
        ),
        pytest.param(
            ("prod_plain", {"n": 1}), {"idempotency_key": "\x00"}, ValueError, id="idem-nul"
        ),
        pytest.param(("prod_plain", {"n": 1}), {"tags": ["ok", "t\x00"]}, ValueError, id="tag-nul"),
    ],
)
async def test_bad_input_is_rejected_and_nothing_written(
    producer_env: Env,
    args: tuple[str, dict[str, object]],
    options: dict[str, object],
    error: type[Exception],
) -> None:
    env = producer_env
    with pytest.raises(error):
        await env.enqueue(*args, **options)
    assert await env.count("prod_plain") == 0
    assert await env.count("no_such_actor") == 0


async def test_concurrent_unique_for_enqueues_create_one_job(producer_env: Env) -> None:
    env = producer_env
    handles = await asyncio.gather(
        *(env.enqueue(unique, Item(n=i), identity_key="race") for i in range(32))
    )
    assert len({h.job_id for h in handles}) == 1
    assert sum(not h.was_existing for h in handles) == 1
    assert await env.count("prod_unique") == 1


async def test_concurrent_singleton_enqueues_create_one_active_job(producer_env: Env) -> None:
    env = producer_env
    results = await asyncio.gather(
        *(env.enqueue(single, Item(n=i)) for i in range(32)), return_exceptions=True
    )
    created = [r for r in results if not isinstance(r, BaseException)]
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(created) == 1
    assert all(isinstance(e, SingletonCollisionError) for e in errors)
    assert await env.count("prod_singleton", ("pending", "scheduled", "running")) == 1


async def test_concurrent_max_pending_enqueues_stop_at_the_cap(producer_env: Env) -> None:
    env = producer_env
    results = await asyncio.gather(
        *(env.enqueue(hundred, Item(n=i)) for i in range(200)), return_exceptions=True
    )
    errors = [r for r in results if isinstance(r, BaseException)]
    assert len(errors) == 100
    assert all(isinstance(e, MaxPendingExceededError) for e in errors)
    assert await env.count("prod_hundred", ("pending",)) == 100


_INF, _NAN = float("inf"), float("nan")


@pytest.mark.parametrize(
    ("payload", "kind", "loc"),
    [
        pytest.param(Measured(x=_INF), "finite_number", ("x",), id="inf"),
        pytest.param(Measured(x=1.0, values=[0.5, _NAN]), "finite_number", ("values", 1), id="nan"),
        pytest.param({"x": "-Infinity"}, "finite_number", ("x",), id="parsed-from-a-string"),
        pytest.param(Measured(x=1.0, label="a\x00b"), "string_nul", ("label",), id="nul"),
        pytest.param(
            Measured(x=1.0, extra={"k\x00": 1}), "string_nul", ("extra", "k\x00"), id="key"
        ),
    ],
)
async def test_an_unstorable_payload_is_rejected_and_nothing_written(
    producer_env: Env, payload: Any, kind: str, loc: tuple[Any, ...]
) -> None:
    """An infinite or NaN float, or a NUL character, passes pydantic but not every
    engine's JSON: every store refuses it before writing, saying where it is, for one
    enqueue, a batch that takes the per-request path and one held column by column."""
    env = producer_env
    with pytest.raises(PayloadValidationError) as caught:
        await env.enqueue(measured, payload)
    assert (caught.value.actor, first_error(caught.value)["type"]) == ("prod_measured", kind)
    assert first_error(caught.value)["loc"] == loc
    mixed: list[Any] = [(measured, {"x": 1.0}), (measured, payload), (plain, Item(n=1))]
    with pytest.raises(PayloadValidationError):
        await env.call(env.client.enqueue_many, mixed)
    if isinstance(payload, Measured):
        bulk = [(measured, Measured(x=i)) for i in range(300)]
        bulk[280] = (measured, payload)
        with pytest.raises(PayloadValidationError) as caught:
            await env.call(env.client.enqueue_many, bulk)
        assert first_error(caught.value)["loc"] == loc
    assert await env.count("prod_measured") == 0
    assert await env.count("prod_plain") == 0


async def test_the_words_infinity_and_nan_in_strings_are_stored_as_they_are(
    producer_env: Env,
) -> None:
    """The check's quick search finds the letters inside strings too; those are kept."""
    env = producer_env
    label = 'NaN, -Infinity and "Infinity" \\u0000'
    handle = await env.enqueue(measured, Measured(x=2.5, label=label, extra={"NaN": [1.5]}))
    record = await env.call(handle.refresh)
    assert record.payload == {"x": 2.5, "values": [], "label": label, "extra": {"NaN": [1.5]}}
    handles = await env.call(
        env.client.enqueue_many, [(measured, Measured(x=i, label=label)) for i in range(300)]
    )
    last = await env.call(handles[-1].refresh)
    assert last.payload["label"] == label
    assert await env.count("prod_measured") == 301
