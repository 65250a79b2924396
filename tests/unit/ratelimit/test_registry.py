"""RateLimitRegistry: namespaces, idempotency, composition, keyed refs and eviction."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from pydantic import BaseModel, Field

from taskq.constants import DEFAULT_RESERVATION_BACKOFF
from taskq.exceptions import PayloadValidationError, ReservationUnavailable
from taskq.ratelimit import (
    ConcurrencyReservation,
    KeyedRateLimitRef,
    KeyedReservationRef,
    RateLimitHandle,
    RateLimitRef,
    RateLimitRegistry,
    ReservationHandle,
    SlidingWindow,
    TokenBucket,
    registry,
)
from taskq.testing.clock import FakeClock

START = datetime(2025, 1, 1, tzinfo=UTC)


class Tenant(BaseModel):
    tenant_id: str = Field(alias="tenantId")
    region: str = "eu"


def tb(name: str, capacity: float = 2, refill: float = 0) -> TokenBucket:
    return TokenBucket(name, capacity=capacity, refill_per_second=refill, backend="memory")


def test_register_is_idempotent_for_identical_config_and_rejects_conflicts() -> None:
    reg = RateLimitRegistry()
    reg.register(tb("a"))
    reg.register(tb("a"))  # same config: no-op
    with pytest.raises(ValueError):
        reg.register(tb("a", capacity=3))
    with pytest.raises(ValueError):
        reg.register(SlidingWindow("a", limit=1, window=timedelta(seconds=1), backend="memory"))
    reg.register(ConcurrencyReservation("a", slots=1, lease=1))  # separate namespace
    assert isinstance(reg.get_rate_limit("a"), TokenBucket)
    assert isinstance(reg.get_reservation("a"), ConcurrencyReservation)
    with pytest.raises(KeyError):
        reg.get_rate_limit("missing")
    with pytest.raises(KeyError):
        reg.get_reservation("missing")


@pytest.mark.parametrize(
    "thing",
    [
        "a_name",
        RateLimitRef(name="x"),
        KeyedRateLimitRef.typed(
            Tenant, base_name="k", key_fn=lambda p: p.tenant_id, capacity=1, refill_per_second=1
        ),
    ],
)
def test_register_takes_primitives_only(thing: Any) -> None:
    with pytest.raises(TypeError):
        RateLimitRegistry().register(thing)


def test_clear_and_the_module_singleton() -> None:
    reg = RateLimitRegistry()
    reg.register(tb("a"))
    reg.clear()
    with pytest.raises(KeyError):
        reg.get_rate_limit("a")
    assert isinstance(registry, RateLimitRegistry)


async def test_acquire_for_actor_order_and_reverse_rollback() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock)
    calls: list[str] = []

    class Spy(ConcurrencyReservation):
        async def acquire(self, job_id: Any, worker_id: Any, pool: Any = None) -> int:
            calls.append(f"acquire {self.name}")
            return await super().acquire(job_id, worker_id, pool)

        async def release(self, slot_index: int, worker_id: Any, pool: Any = None) -> None:
            calls.append(f"release {self.name}")
            await super().release(slot_index, worker_id, pool)

    class SpyBucket(TokenBucket):
        async def acquire(self, count: float = 1.0, **kw: Any) -> Any:
            calls.append(f"acquire {self.name}")
            return await super().acquire(count, **kw)

        async def refund(self, decision: Any, **kw: Any) -> None:
            calls.append(f"refund {self.name}")
            await super().refund(decision, **kw)

    r1 = Spy("r1", slots=1, lease=60, clock=clock)
    r2 = Spy("r2", slots=1, lease=60, clock=clock)
    t1 = SpyBucket("t1", capacity=5, refill_per_second=0, backend="memory")
    t2 = SpyBucket("t2", capacity=1, refill_per_second=0, backend="memory")
    for p in (r1, r2, t1, t2):
        reg.register(p)
    actor = SimpleNamespace(name="act", rate_limits=["t1", t2], reservations=[r1, "r2"])
    worker = uuid.uuid4()
    got = await reg.acquire_for_actor(actor, {}, job_id=uuid.uuid4(), worker_id=worker, clock=clock)
    assert calls == ["acquire r1", "acquire r2", "acquire t1", "acquire t2"]
    assert [type(h) for h in got] == [
        ReservationHandle,
        ReservationHandle,
        RateLimitHandle,
        RateLimitHandle,
    ]
    await reg.release_for_actor(got, worker_id=worker, clock=clock)
    assert calls[4:] == ["release r2", "release r1"]  # tokens are kept
    calls.clear()
    with pytest.raises(ReservationUnavailable) as info:
        await reg.acquire_for_actor(actor, {}, job_id=None, worker_id=worker, clock=clock)
    assert info.value.bucket_name == "t2"
    assert info.value.retry_after == DEFAULT_RESERVATION_BACKOFF  # fixed quota: None -> 5 s
    assert calls == [
        "acquire r1",
        "acquire r2",
        "acquire t1",
        "acquire t2",
        "refund t1",
        "release r2",
        "release r1",
    ]
    assert (await t1.peek(clock=clock)).tokens_remaining == 4  # refund restored the token


async def test_retry_after_zero_is_not_replaced_by_the_default() -> None:
    # A denial's timedelta(0)-or-more wait must be kept as is (no truthiness coalesce).
    clock = FakeClock(START)
    reg = RateLimitRegistry()
    reg.register(TokenBucket("fast", capacity=1, refill_per_second=1_000_000, backend="memory"))
    actor = SimpleNamespace(name="a", rate_limits=["fast"], reservations=[])
    await reg.acquire_for_actor(actor, {}, job_id=None, worker_id=uuid.uuid4(), clock=clock)
    with pytest.raises(ReservationUnavailable) as info:
        await reg.acquire_for_actor(actor, {}, job_id=None, worker_id=uuid.uuid4(), clock=clock)
    assert info.value.retry_after == timedelta(microseconds=1)


async def test_keyed_refs_validate_payload_and_reuse_concrete_primitives() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock)
    keyed_tb = KeyedRateLimitRef.typed(
        Tenant,
        base_name="api-per-tenant",
        key_fn=lambda p: p.tenant_id,
        capacity=2,
        refill_per_second=0,
        backend="memory",
    )
    keyed_res = KeyedReservationRef.typed(
        Tenant,
        base_name="session-slots",
        key_fn=lambda p: p.region,
        slots=1,
        lease=timedelta(minutes=5),
    )
    actor = SimpleNamespace(name="call_api", rate_limits=[keyed_tb], reservations=[keyed_res])
    w = uuid.uuid4()
    got = await reg.acquire_for_actor(
        actor, {"tenantId": "t1"}, job_id=None, worker_id=w, clock=clock
    )
    assert [h.name for h in got] == ["session-slots:eu", "api-per-tenant:t1"]
    bucket = reg.get_rate_limit("api-per-tenant:t1")
    await reg.release_for_actor(got, worker_id=w, clock=clock)
    # the model instance works too, and the same concrete bucket is reused
    await reg.acquire_for_actor(actor, Tenant(tenantId="t1"), job_id=None, worker_id=w, clock=clock)
    assert reg.get_rate_limit("api-per-tenant:t1") is bucket
    assert (await bucket.peek(clock=clock)).tokens_remaining == 0
    with pytest.raises(PayloadValidationError) as info:
        await reg.acquire_for_actor(
            actor, {"tenant_id": "t1"}, job_id=None, worker_id=w, clock=clock
        )
    assert info.value.actor == "call_api"
    assert len(await reg.get_reservation("session-slots:eu").held()) == 1  # call 2's, nothing more


def test_keyed_ref_needs_a_payload_type_and_a_non_empty_key() -> None:
    with pytest.raises(TypeError):
        KeyedRateLimitRef(
            base_name="api", key_fn=lambda p: p["t"], capacity=10, refill_per_second=1.0
        )  # type: ignore[call-arg]
    ref = KeyedRateLimitRef.typed(
        Tenant, base_name="api", key_fn=lambda p: "", capacity=1, refill_per_second=1
    )
    with pytest.raises(ValueError):
        ref.concrete_name({"tenantId": "x"})
    bad = KeyedRateLimitRef.typed(
        Tenant, base_name="api", key_fn=lambda p: "a b", capacity=1, refill_per_second=1
    )
    with pytest.raises(ValueError):
        bad.concrete_name({"tenantId": "x"})


async def test_keyed_collisions_share_identical_config_and_reject_different() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock)

    class P(BaseModel):
        k: str

    a = KeyedRateLimitRef.typed(
        P, base_name="a", key_fn=lambda p: p.k, capacity=1, refill_per_second=0, backend="memory"
    )
    ab = KeyedRateLimitRef.typed(
        P, base_name="a:b", key_fn=lambda p: p.k, capacity=1, refill_per_second=0, backend="memory"
    )
    ab_diff = KeyedRateLimitRef.typed(
        P, base_name="a:b", key_fn=lambda p: p.k, capacity=5, refill_per_second=0, backend="memory"
    )
    w = uuid.uuid4()
    await reg.acquire_for_actor(
        SimpleNamespace(rate_limits=[a]), {"k": "b:c"}, job_id=None, worker_id=w, clock=clock
    )
    with pytest.raises(ReservationUnavailable):  # shared a:b:c, already drained
        await reg.acquire_for_actor(
            SimpleNamespace(rate_limits=[ab]), {"k": "c"}, job_id=None, worker_id=w, clock=clock
        )
    with pytest.raises(ValueError):
        await reg.acquire_for_actor(
            SimpleNamespace(rate_limits=[ab_diff]),
            {"k": "c"},
            job_id=None,
            worker_id=w,
            clock=clock,
        )


async def test_idle_eviction_spares_static_names_and_consumed_memory_quotas() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock)

    class P(BaseModel):
        k: str

    refilling = KeyedRateLimitRef.typed(
        P, base_name="r", key_fn=lambda p: p.k, capacity=1, refill_per_second=1, backend="memory"
    )
    fixed = KeyedRateLimitRef.typed(
        P, base_name="f", key_fn=lambda p: p.k, capacity=1, refill_per_second=0, backend="memory"
    )
    static = TokenBucket("r:static", capacity=1, refill_per_second=1, backend="memory")
    reg.register(static)
    w = uuid.uuid4()
    for ref, key in ((refilling, "x"), (fixed, "x"), (refilling, "static")):
        await reg.acquire_for_actor(
            SimpleNamespace(rate_limits=[ref]), {"k": key}, job_id=None, worker_id=w, clock=clock
        )
    clock.advance(timedelta(minutes=30))
    assert reg.evict_idle_keyed_rate_limits() == 0  # 1 h default threshold
    clock.advance(timedelta(minutes=31))
    assert reg.evict_idle_keyed_rate_limits() == 1  # only r:x
    assert reg.get_rate_limit("r:static") is static
    assert reg.get_rate_limit("f:x")  # fixed quota consumed: kept
    with pytest.raises(KeyError):
        reg.get_rate_limit("r:x")
    await reg.get_rate_limit("f:x").reset()
    assert reg.evict_idle_keyed_rate_limits(idle_for=timedelta(0)) == 1


async def test_keyed_caps_evict_opportunistically_at_most_once_per_30s() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock, max_keyed_rate_limits=2)

    class P(BaseModel):
        k: str

    ref = KeyedRateLimitRef.typed(
        P, base_name="t", key_fn=lambda p: p.k, capacity=5, refill_per_second=1, backend="memory"
    )
    w = uuid.uuid4()

    async def hit(key: str) -> None:
        await reg.acquire_for_actor(
            SimpleNamespace(rate_limits=[ref]), {"k": key}, job_id=None, worker_id=w, clock=clock
        )

    await hit("a")
    await hit("b")
    clock.advance(3590)
    with pytest.raises(ReservationUnavailable) as info:
        await hit("c")  # at the cap; the scan finds nothing idle for 1 h yet
    assert info.value.bucket_name == "t:c"
    assert info.value.retry_after == DEFAULT_RESERVATION_BACKOFF
    await hit("a")  # an existing key is never refused, and counts as use
    clock.advance(20)  # b is idle now, but the last scan was 20 s ago: no rescan
    with pytest.raises(ReservationUnavailable):
        await hit("c")
    clock.advance(10)  # 30 s since the last scan: scan again, evict b, admit c
    await hit("c")
    assert set(reg.rate_limits()) == {"t:a", "t:c"}


async def test_keyed_reservation_cap_is_independent_of_the_rate_limit_cap() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock, max_keyed_rate_limits=1, max_keyed_reservations=2)

    class P(BaseModel):
        k: str

    ref = KeyedRateLimitRef.typed(
        P, base_name="t", key_fn=lambda p: p.k, capacity=5, refill_per_second=1, backend="memory"
    )
    res = KeyedReservationRef.typed(P, base_name="s", key_fn=lambda p: p.k, slots=5, lease=60)
    w = uuid.uuid4()
    await reg.acquire_for_actor(
        SimpleNamespace(rate_limits=[ref]), {"k": "a"}, job_id=None, worker_id=w, clock=clock
    )
    for key in ("a", "b"):
        await reg.acquire_for_actor(
            SimpleNamespace(reservations=[res]), {"k": key}, job_id=None, worker_id=w, clock=clock
        )
    with pytest.raises(ReservationUnavailable):
        await reg.acquire_for_actor(
            SimpleNamespace(reservations=[res]), {"k": "c"}, job_id=None, worker_id=w, clock=clock
        )
    clock.advance(timedelta(hours=2))  # their 60 s leases lapsed long ago
    assert reg.evict_idle_keyed_reservations() == 2
    long = KeyedReservationRef.typed(
        P, base_name="l", key_fn=lambda p: p.k, slots=1, lease=timedelta(hours=5)
    )
    await reg.acquire_for_actor(
        SimpleNamespace(reservations=[long]), {"k": "x"}, job_id=None, worker_id=w, clock=clock
    )
    clock.advance(timedelta(hours=2))
    assert reg.evict_idle_keyed_reservations() == 0  # a live memory slot is never evicted
    assert len(reg.rate_limits()) == 1  # the rate-limit namespace was untouched


async def test_a_static_name_a_keyed_ref_resolves_to_is_reused_as_is() -> None:
    clock = FakeClock(START)
    reg = RateLimitRegistry(clock=clock)

    class P(BaseModel):
        k: str

    static = TokenBucket("api:vip", capacity=100, refill_per_second=0, backend="memory")
    reg.register(static)
    ref = KeyedRateLimitRef.typed(
        P, base_name="api", key_fn=lambda p: p.k, capacity=1, refill_per_second=0, backend="memory"
    )
    for _ in range(3):  # the static 100-token bucket, not a 1-token keyed one
        await reg.acquire_for_actor(
            SimpleNamespace(rate_limits=[ref]),
            {"k": "vip"},
            job_id=None,
            worker_id=uuid.uuid4(),
            clock=clock,
        )
    assert reg.get_rate_limit("api:vip") is static
    assert (await static.peek(clock=clock)).tokens_remaining == 97
    clock.advance(timedelta(days=1))
    assert reg.evict_idle_keyed_rate_limits(idle_for=timedelta(0)) == 0
