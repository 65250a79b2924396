"""The dispatcher's gates (:mod:`taskq.worker.admission`) on an injected clock: what a
round may claim, what is paid before the claim and given back after it, how a hot key's
backlog is spread."""

from __future__ import annotations

from datetime import timedelta
from typing import Any
from uuid import uuid4

import pytest
from pydantic import BaseModel

from taskq.actor import actor
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit import (
    ConcurrencyReservation,
    KeyedRateLimitRef,
    RateLimitRegistry,
    TokenBucket,
)
from taskq.ratelimit.decision import RateLimitDecision
from taskq.worker.admission import Admission, RateGate

BUCKET = TokenBucket("adm.bucket", capacity=4, refill_per_second=2, backend="memory")
SLOTS = ConcurrencyReservation("adm.slots", slots=2, lease=30.0)


class P(BaseModel):
    tenant: str = "a"


@actor(name="adm_limited", rate_limits=[BUCKET], reservations=[SLOTS])
async def limited(payload: P) -> None:
    return None


KEYED = KeyedRateLimitRef(
    payload_type=P,
    base_name="adm.keyed",
    key_fn=lambda p: p.tenant,
    capacity=1,
    refill_per_second=2,
)


@actor(name="adm_keyed", rate_limits=[KEYED])
async def keyed(payload: P) -> None:
    return None


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class Store:
    """A bucket the test controls: ``tokens`` left; records every call."""

    def __init__(self, tokens: float) -> None:
        self.tokens = tokens
        self.calls: list[tuple[str, float]] = []
        self.free_slots = 2
        self.slot_calls: list[str] = []

    async def acquire(self, primitive: Any, count: float) -> RateLimitDecision:
        self.calls.append(("acquire", count))
        if self.tokens + 1e-9 >= count:
            self.tokens -= count
            return RateLimitDecision(True, self.tokens, timedelta(0), primitive.name, "memory")
        wait = timedelta(seconds=(count - self.tokens) / 2)
        return RateLimitDecision(False, self.tokens, wait, primitive.name, "memory")

    async def refund(self, primitive: Any, decision: RateLimitDecision, count: float) -> None:
        self.calls.append(("refund", count))
        self.tokens += count

    async def take_slot(self, reservation: Any) -> int:
        self.slot_calls.append("take")
        if self.free_slots <= 0:
            raise ReservationUnavailable(reservation.name, timedelta(seconds=7))
        self.free_slots -= 1
        return self.free_slots

    async def give_slot(self, reservation: Any, index: int) -> None:
        self.slot_calls.append("give")
        self.free_slots += 1


def _admission(store: Store, clock: Clock) -> Admission:
    return Admission(
        {limited.name: limited, keyed.name: keyed},
        RateLimitRegistry(),
        {},
        acquire=store.acquire,
        refund=store.refund,
        take_slot=store.take_slot,
        give_slot=store.give_slot,
        clock=clock,
    )


async def test_a_round_pays_for_what_it_claims_and_gives_back_the_rest() -> None:
    store, clock = Store(tokens=4), Clock()
    adm = _admission(store, clock)
    assert adm.throttled(limited.name)
    assert not adm.throttled(keyed.name)  # keyed limits are taken per job
    assert adm.allowance(limited.name) == 2  # two slots, four tokens
    paid = await adm.prepay(limited.name, 10)
    assert paid.granted == 2
    assert store.calls == [("acquire", 2.0)]  # one acquire for both tokens
    assert store.free_slots == 0
    one = paid.take_one(uuid4(), uuid4())
    assert {type(h).__name__ for h in one} == {"ReservationHandle", "RateLimitHandle"}
    await adm.settle(paid)  # the claim found one job: the other's slot and token go back
    assert store.free_slots == 1
    assert store.calls[-1] == ("refund", 1.0)
    assert adm.slot_gates[SLOTS.name].held == 1


async def test_a_spent_bucket_leaves_the_actor_out_until_it_refills() -> None:
    store, clock = Store(tokens=0), Clock()
    adm = _admission(store, clock)
    paid = await adm.prepay(limited.name, 2)
    assert paid.granted == 0
    assert store.free_slots == 2  # the slots taken first were given back
    assert adm.allowance(limited.name) == 0  # no store call needed to know
    nxt = adm.next_change(batch=1)
    assert nxt is not None
    assert nxt == pytest.approx(clock.t + 0.5)
    clock.t += 0.5
    assert adm.allowance(limited.name) == 1


async def test_a_full_reservation_waits_for_a_release() -> None:
    store, clock = Store(tokens=4), Clock()
    store.free_slots = 0
    adm = _admission(store, clock)
    paid = await adm.prepay(limited.name, 2)
    assert paid.granted == 0
    assert store.calls == []  # no token taken for a job that has no slot
    assert adm.allowance(limited.name) == 0
    assert adm.waiting_slots() == [SLOTS.name]
    adm.seen_free([SLOTS.name])  # the store shows a slot free again
    assert adm.allowance(limited.name) == 2


def test_a_hot_keys_backlog_is_parked_one_refill_interval_apart() -> None:
    store, clock = Store(tokens=0), Clock()
    adm = _admission(store, clock)
    until = adm.denied("adm.keyed:hot", 0.5, clock.t, slot=False, keyed=KEYED)
    assert until == pytest.approx(clock.t + 0.5)
    parks = [adm.keyed_block(["adm.keyed:hot"]) for _ in range(3)]
    assert [p[0] for p in parks if p] == ["adm.keyed:hot"] * 3
    times = [p[1] for p in parks if p]
    assert times == pytest.approx([clock.t + 1.0, clock.t + 1.5, clock.t + 2.0])
    assert adm.keyed_block(["adm.keyed:cold"]) is None  # another key is not held back


def test_a_job_refused_again_is_parked_behind_the_backlog_not_on_another_jobs_turn() -> None:
    """A parked job whose turn was taken (another worker got that token) is refused when
    it wakes. It is parked behind the key's backlog, on a turn no other job holds: each
    later turn (one token) admits its one job, and nobody is refused again. Parked on the
    key's next token instead, it would share that turn with the job parked there, and one
    of the two would be refused on every period for the rest of the backlog."""
    store, clock = Store(tokens=0), Clock()
    adm = _admission(store, clock)
    name = "adm.keyed:hot"
    park = {0: adm.denied(name, 0.5, clock.t, slot=False, keyed=KEYED)}
    for job in range(1, 8):
        blocked = adm.keyed_block([name])
        assert blocked is not None
        park[job] = blocked[1]
    # Job 0's turn comes, but its token is gone: refused again.
    clock.t = park[0]
    park[0] = adm.denied(name, 0.5, clock.t, slot=False, keyed=KEYED)
    assert park[0] > max(at for job, at in park.items() if job != 0)
    # Run the turns: the bucket refills one token per 0.5 s (capacity 1); the jobs due
    # ask in turn order, a refused one is parked again as the worker parks it.
    refused = dict.fromkeys(park, 0)
    tokens, last = 0.0, clock.t
    while park:
        clock.t = min(park.values())
        tokens, last = min(1.0, tokens + 2 * (clock.t - last)), clock.t
        due = sorted((at, j) for j, at in park.items() if at <= clock.t + 1e-9)
        for _at, job in due:
            if tokens + 1e-9 >= 1.0:
                tokens -= 1.0
                del park[job]
            else:
                refused[job] += 1
                park[job] = adm.denied(name, (1.0 - tokens) / 2, clock.t, slot=False, keyed=KEYED)
    assert refused == dict.fromkeys(refused, 0)


def test_a_rate_gate_follows_the_stores_decisions() -> None:
    gate = RateGate.of(BUCKET, now=0.0)
    assert gate.available(0.0) == 4
    gate.observe(RateLimitDecision(True, 0.5, timedelta(0), BUCKET.name, "memory"), 1.0, 3.0)
    assert gate.available(1.0) == pytest.approx(0.5)
    assert gate.available(1.25) == pytest.approx(1.0)
    assert gate.ready_at(2.0, 1.0) == pytest.approx(1.75)
    denied = RateLimitDecision(False, 0.2, timedelta(seconds=0.4), BUCKET.name, "memory")
    gate.observe(denied, 2.0)
    assert gate.available(2.3) == 0.0
    assert gate.available(2.4) == pytest.approx(1.0)


async def test_a_kept_slot_pays_for_the_next_claim_without_a_statement() -> None:
    """A finished job's slot of a reservation taken in the claim's transaction is kept:
    the next round counts it, the claim takes it without a statement (``take`` is not
    called) and marks it adopted; a kept slot no round used is released afterwards."""
    store, clock = Store(tokens=4), Clock()
    adm = Admission(
        {limited.name: limited},
        RateLimitRegistry(),
        {},
        acquire=store.acquire,
        refund=store.refund,
        take_slot=store.take_slot,
        give_slot=store.give_slot,
        in_claim=lambda reservation: True,
        clock=clock,
    )
    gate = adm.slot_gates[SLOTS.name]
    gate.held = 2  # both slots held by this worker's running jobs
    gate.denied(30.0, clock.t)  # and the store said so
    assert adm.allowance(limited.name) == 0
    assert adm.keep(SLOTS.name, 1)  # one of them ended
    assert adm.allowance(limited.name) == 1  # kept: usable although the gate is full
    assert adm.kept_actors() == [limited.name]  # a hand-over can claim for it at once
    taken: list[str] = []

    async def take(reservation: Any) -> int | None:
        taken.append(reservation.name)
        return None

    paid = await adm.prepay(limited.name, 1, kept_only=True)
    assert await adm.take_in_claim(paid, take) == 1
    assert taken == []  # no statement for the kept slot
    assert paid.adopted == {(SLOTS.name, 1)}
    assert (gate.held, gate.kept) == (2, [])
    assert adm.keep(SLOTS.name, 0)
    clock.t += 1
    await adm.release_kept(before=clock.t - 2)  # kept after that round began: stays
    assert len(gate.kept) == 1
    await adm.release_kept(before=clock.t)
    assert (gate.kept, gate.held, store.slot_calls) == ([], 1, ["give"])
    assert adm.allowance(limited.name) == 1
