"""Admission: what the dispatcher knows about its actors' limits, so it claims only what
they can admit now.

Every static primitive an actor declares (token buckets, sliding windows, reservations)
and every queue cap gets a *gate*: the worker's estimate of what the primitive can admit
at this moment. A rate gate tracks tokens (the last decision's ``remaining`` plus the
refill since); a slot gate tracks the slots this worker holds and whether a denial said
the rest are taken ("until a release"). The dispatcher leaves an actor out of a claim
while a gate says zero, and claims no more of its jobs than the gates allow.

Static rate limits are paid **before** the claim (:meth:`Admission.prepay`): the worker
takes the tokens for the jobs it is about to claim in one acquire per primitive, claims
at most that many jobs, and refunds what it could not use. A denial then costs one
Redis (or SQL) round trip and touches no job row; two workers on one bucket never claim
a job the bucket will refuse. The store's atomic acquire stays the arbiter: a gate only
decides when it is worth asking.

Keyed limits depend on the payload, so they are taken per claimed job
(:meth:`taskq.worker.resources.Limits.acquire`). A key that denied gets a gate of its own:
the next jobs of that key are parked without asking the store, each at the projected
moment the key admits it (one refill interval apart), so a hot key's backlog is parked
once, in order, while other keys keep flowing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from taskq.actor import ActorRef
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit.composition import AcquiredResource, ReservationHandle
from taskq.ratelimit.decision import RateLimitDecision
from taskq.worker.gates import EPS as _EPS
from taskq.worker.gates import ActorGates, Prepaid, RateGate, SlotGate

__all__ = ["Admission", "Prepaid", "RateGate", "SlotGate"]

_MAX_KEYED_GATES = 10_000


Refund = Callable[[Any, RateLimitDecision, float], Any]
Acquire = Callable[[Any, float], Any]
TakeSlot = Callable[[Any], Any]
GiveSlot = Callable[[Any, int], Any]


class Admission:
    """Per-worker admission state: gates for every static primitive and queue cap, and
    for the keys that denied."""

    def __init__(
        self,
        actors: Mapping[str, ActorRef[Any, Any]],
        registry: Any,
        queue_caps: Mapping[str, Any],
        *,
        acquire: Acquire,
        refund: Refund,
        take_slot: TakeSlot,
        give_slot: GiveSlot,
        in_claim: Callable[[Any], bool] = lambda reservation: False,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        from taskq.ratelimit import (
            ConcurrencyReservation,
            KeyedRateLimitRef,
            KeyedReservationRef,
        )

        self._clock = clock
        self._acquire = acquire
        self._refund = refund
        self._take_slot = take_slot
        self._give_slot = give_slot
        self._in_claim_reservation = in_claim
        now = clock()
        self.rate_gates: dict[str, RateGate] = {}
        self.slot_gates: dict[str, SlotGate] = {}
        self.keyed_gates: dict[str, RateGate | SlotGate] = {}
        self.actors: dict[str, ActorGates] = {}
        for name, ref in actors.items():
            rate: list[RateGate] = []
            slots: list[SlotGate] = []
            keyed = False
            for entry in ref.rate_limits:
                if isinstance(entry, KeyedRateLimitRef):
                    keyed = True
                    continue
                primitive = registry.get_rate_limit(entry) if isinstance(entry, str) else entry
                gate = self.rate_gates.get(primitive.name)
                if gate is None:
                    gate = self.rate_gates[primitive.name] = RateGate.of(primitive, now)
                rate.append(gate)
            for entry in ref.reservations:
                if isinstance(entry, KeyedReservationRef):
                    keyed = True
                    continue
                res = registry.get_reservation(entry) if isinstance(entry, str) else entry
                if isinstance(res, ConcurrencyReservation):
                    slots.append(self._slot_gate(res))
            if rate or slots or keyed:
                self.actors[name] = ActorGates(rate, slots, keyed)
        self.static_slots = frozenset(g.name for a in self.actors.values() for g in a.slots)
        """Reservations taken before the claim: no job is ever parked on them."""
        self.queue_gates: dict[str, SlotGate] = {
            queue: self._slot_gate(res) for queue, res in queue_caps.items()
        }

    def _slot_gate(self, reservation: Any) -> SlotGate:
        gate = self.slot_gates.get(reservation.name)
        if gate is None:
            gate = self.slot_gates[reservation.name] = SlotGate(reservation, reservation.slots)
        return gate

    # -- what a round may claim -------------------------------------------------------

    def throttled(self, actor: str) -> bool:
        """True when ``actor`` has static limits the claim must respect."""
        gates = self.actors.get(actor)
        return gates is not None and bool(gates.rate or gates.slots)

    def allowance(self, actor: str) -> float:
        """How many jobs of ``actor`` its static limits can admit now (``inf``: no limit)."""
        gates = self.actors.get(actor)
        if gates is None:
            return math.inf
        now = self._clock()
        out = math.inf
        for gate in gates.rate:
            out = min(out, math.floor(gate.available(now) + _EPS))
        for slot in gates.slots:
            out = min(out, slot.available(now))
        return out

    def queue_allowance(self, queue: str) -> float:
        """How many jobs the cap of ``queue`` can admit now (``inf``: no cap)."""
        gate = self.queue_gates.get(queue)
        return math.inf if gate is None else gate.available(self._clock())

    def waiting_slots(self) -> list[str]:
        """Reservations and caps a denial marked full: the dispatcher looks them up."""
        return [name for name, gate in self.slot_gates.items() if gate.waiting]

    def next_change(self, batch: int = 1, skip: Iterable[str] = ()) -> float | None:
        """The soonest monotonic time a throttled actor (not in ``skip``) may be claimed
        again: every gate of it open, a rate gate holding ``batch`` tokens (at most half
        its capacity, at least one: fewer, larger claims at high rates). A gate whose
        slots this worker holds opens on its release, not at a time."""
        now = self._clock()
        skipped = set(skip)
        times: list[float] = []
        for actor, gates in self.actors.items():
            if actor in skipped or not (gates.rate or gates.slots):
                continue
            at = now
            for gate in gates.rate:
                want = max(1.0, min(float(batch), math.floor(gate.capacity / 2)))
                at = max(at, gate.ready_at(want, now))
            for slot in gates.slots:
                if slot.available(now) < 1:
                    at = max(at, slot.blocked_until if slot.waiting else math.inf)
            times.append(at)
        times += [gate.blocked_until for gate in self.queue_gates.values() if gate.waiting]
        finite = [t for t in times if t < math.inf]
        return min(finite) if finite else None

    # -- paying before the claim ------------------------------------------------------

    def kept_actors(self) -> list[str]:
        """Actors (sorted) of which every static reservation has a kept slot: a hand-over
        can claim one of their jobs at once."""
        return sorted(
            name
            for name, gates in self.actors.items()
            if gates.slots and all(slot.kept for slot in gates.slots)
        )

    async def prepay(self, actor: str, want: int, *, kept_only: bool = False) -> Prepaid:
        """Take, for up to ``want`` jobs of ``actor``, a slot of each static reservation
        and then a token of each static rate limit.

        Slots come first (giving one back is exact; a token refund is a no-op on the SQL
        backend). Each primitive grants what the store allows; what a later one refuses
        is given back to the earlier ones, so all end up paying for the same
        ``granted`` jobs.
        """
        paid = Prepaid(actor, want, kept_only=kept_only)
        gates = self.actors.get(actor)
        if gates is None or want <= 0:
            return paid
        try:
            for slot in gates.slots:
                if paid.granted <= 0:
                    break
                paid.slot_gates[slot.name] = slot
                paid.slots[slot.name] = []
                if self._in_claim(slot):
                    paid.deferred.append(slot)
                    paid.granted = min(paid.granted, slot.available(self._clock()))
                    continue
                await self._take_slots(slot, paid.granted, paid.slots[slot.name])
                paid.granted = min(paid.granted, len(paid.slots[slot.name]))
            for gate in gates.rate:
                if paid.granted <= 0:
                    break
                units = await self._take(gate, paid.granted)
                paid.gates[gate.name] = gate
                paid.units[gate.name] = units
                paid.granted = min(paid.granted, len(units))
        except BaseException:
            # A store failed part-way: give back what was taken, then let the caller know.
            paid.granted = 0
            await self._trim(paid)
            raise
        await self._trim(paid)
        return paid

    def _in_claim(self, gate: SlotGate) -> bool:
        return bool(self._in_claim_reservation(gate.reservation))

    async def take_in_claim(self, paid: Prepaid, take: Callable[[Any], Any]) -> int:
        """Take the deferred slots of ``paid`` with ``take`` (one slot per call, ``None``
        when none is free: a statement of the claim's transaction). Returns how many jobs
        may now be claimed; a reservation found full is marked so (until a release, or
        one lease at the latest)."""
        for gate in paid.deferred:
            indexes = paid.slots[gate.name]
            while len(indexes) < paid.granted:
                if gate.kept:  # already this worker's in the store: no statement
                    index, _ = gate.kept.pop()
                    paid.adopted.add((gate.name, index))
                    indexes.append(index)
                    continue
                if paid.kept_only:
                    break
                index = await take(gate.reservation)
                if index is None:
                    gate.denied(float(gate.reservation.lease_s), self._clock())
                    break
                indexes.append(index)
                gate.held += 1
            paid.granted = min(paid.granted, len(indexes))
        paid.deferred = []
        return paid.granted

    def keep(self, name: str, index: int) -> bool:
        """Keep a slot of static reservation ``name`` that a finished job held, for the
        next claim (True), instead of releasing it; only for reservations whose slots are
        taken in the claim's transaction."""
        gate = self.slot_gates.get(name)
        if gate is None or not self._in_claim(gate) or name not in self.static_slots:
            return False
        gate.kept.append((index, self._clock()))
        return True

    async def release_kept(self, before: float = math.inf) -> None:
        """Release the kept slots kept at or before ``before`` (monotonic; all by default):
        the claim rounds since had no job for them."""
        for gate in self.slot_gates.values():
            stale = [index for index, at in gate.kept if at <= before]
            if stale:
                gate.kept = [(index, at) for index, at in gate.kept if at > before]
                await self._give_slots(gate, stale)

    async def _take_slots(self, gate: SlotGate, want: int, taken: list[int]) -> None:
        for _ in range(min(want, gate.available(self._clock()))):
            try:
                taken.append(await self._take_slot(gate.reservation))
            except ReservationUnavailable as exc:
                gate.denied(exc.retry_after.total_seconds(), self._clock())
                break
            gate.held += 1

    async def _take(self, gate: RateGate, want: int) -> list[RateLimitDecision]:
        now = self._clock()
        count = min(want, math.floor(gate.available(now) + _EPS))
        if gate.counted:
            while count >= 1:
                decision = await self._acquire(gate.primitive, float(count))
                gate.observe(decision, self._clock(), float(count))
                if decision.allowed:
                    return [decision] * count
                count = min(count - 1, math.floor(float(decision.remaining) + _EPS))
            return []
        units: list[RateLimitDecision] = []
        for _ in range(count):
            decision = await self._acquire(gate.primitive, 1.0)
            gate.observe(decision, self._clock())
            if not decision.allowed:
                break
            units.append(decision)
        return units

    async def _trim(self, paid: Prepaid) -> None:
        """Give back every slot and token beyond ``granted`` (refused by a later gate, or
        not used by the claim). A failure to give something back is logged by the
        callbacks; a slot not given back frees at its lease end."""
        keep = max(0, paid.granted)
        for name, indexes in paid.slots.items():
            extra = indexes[keep:]
            del indexes[keep:]
            await self._give_slots(paid.slot_gates[name], extra)
        for name, units in paid.units.items():
            extra_units = units[keep:]
            del units[keep:]
            await self._give_back(paid.gates[name], extra_units)

    def hold_off(self, actor: str, seconds: float) -> None:
        """Leave ``actor`` out of claims for ``seconds`` (its limit's store failed)."""
        gates = self.actors.get(actor)
        if gates is None:
            return
        until = self._clock() + seconds
        for gate in gates.rate:
            gate.blocked_until = max(gate.blocked_until, until)
        for slot in gates.slots:
            slot.denied(seconds, self._clock())

    async def _give_slots(self, gate: SlotGate, indexes: list[int]) -> None:
        for index in indexes:
            await self._give_slot(gate.reservation, index)
            gate.held = max(0, gate.held - 1)
            gate.released()

    async def settle(self, paid: Prepaid) -> None:
        """Give back what jobs the claim did not find would have used (the backlog ran
        short)."""
        if paid.granted > 0:
            paid.granted = 0
            await self._trim(paid)

    async def refund(self, handles: Iterable[AcquiredResource]) -> None:
        """Give back what was taken before the claim for a job parked instead of run."""
        for handle in handles:
            if isinstance(handle, ReservationHandle):
                slot = self.slot_gates.get(handle.name)
                if slot is not None:
                    await self._give_slots(slot, [handle.slot_index])
                continue
            gate = self.rate_gates.get(handle.name)
            if gate is not None:
                await self._give_back(gate, [handle.decision])

    async def _give_back(self, gate: RateGate, units: list[RateLimitDecision]) -> None:
        if not units:
            return
        if gate.counted:
            # Units of one multi-token decision share it: one refund per decision.
            counts: dict[int, tuple[RateLimitDecision, int]] = {}
            for unit in units:
                _, n = counts.get(id(unit), (unit, 0))
                counts[id(unit)] = (unit, n + 1)
            for decision, n in counts.values():
                await self._refund(gate.primitive, decision, float(n))
        else:
            for decision in units:
                await self._refund(gate.primitive, decision, 1.0)
        gate.level = min(gate.capacity, gate.level + len(units))

    # -- per job, after the claim -----------------------------------------------------

    def keyed_block(self, names: Iterable[str]) -> tuple[str, float] | None:
        """If a keyed name this job needs is known to be exhausted: ``(name, park until)``
        (monotonic), the job is parked without asking the store."""
        now = self._clock()
        for name in names:
            gate = self.keyed_gates.get(name)
            if gate is None:
                continue
            if isinstance(gate, RateGate):
                if gate.available(now) + _EPS < 1.0 or gate.next_park > now:
                    return name, gate.park_at(now)
            elif gate.available(now) < 1:
                return name, gate.blocked_until
        return None

    def denied(
        self,
        name: str,
        wait_s: float,
        now: float,
        *,
        slot: bool,
        keyed: Any = None,
    ) -> float:
        """Record a denial of ``name``; returns the monotonic time to park the job until.

        ``keyed`` is the keyed ref whose concrete name denied (a gate is made for the
        key). The job is parked behind the others parked on that key, one refill interval
        after the last of them: the earliest moment the key can admit it. That holds for
        a job refused again after waiting on the key too: its turn is spent, and parking
        it at the key's next token would put it on the turn of the job parked there, the
        two colliding (one refusal more) every period for the rest of the backlog.
        """
        if not slot:
            gate = self.rate_gates.get(name)
            if gate is None and keyed is not None:
                existing = self.keyed_gates.get(name)
                if isinstance(existing, RateGate):
                    gate = existing
                else:
                    gate = RateGate(
                        keyed, float(keyed.capacity), float(keyed.refill_per_second), 0.0, now
                    )
                    self._keep_keyed(name, gate)
            if gate is None:
                return now + wait_s
            gate.level, gate.at = 0.0, now
            gate.blocked_until = now + wait_s
            if keyed is not None:
                return gate.park_at(now)
            return gate.blocked_until
        slot_gate = self.slot_gates.get(name)
        if slot_gate is None:
            existing = self.keyed_gates.get(name)
            if isinstance(existing, SlotGate):
                slot_gate = existing
            else:
                slot_gate = SlotGate(None, int(getattr(keyed, "slots", 1)))
                self._keep_keyed(name, slot_gate)
        slot_gate.denied(wait_s, now)
        return now + wait_s

    def _keep_keyed(self, name: str, gate: RateGate | SlotGate) -> None:
        if len(self.keyed_gates) >= _MAX_KEYED_GATES:
            now = self._clock()
            for key, old in list(self.keyed_gates.items()):
                if old.blocked_until < now and not (
                    isinstance(old, RateGate) and old.next_park > now
                ):
                    del self.keyed_gates[key]
        self.keyed_gates[name] = gate

    def took_slot(self, name: str) -> None:
        """This worker took a slot of ``name``."""
        gate = self.slot_gates.get(name)
        if gate is not None:
            gate.held += 1

    def released_slot(self, name: str) -> None:
        """This worker released a slot of ``name`` (or saw one free in the store)."""
        gate = self.slot_gates.get(name)
        if gate is not None:
            gate.held = max(0, gate.held - 1)
            gate.released()
        keyed = self.keyed_gates.get(name)
        if isinstance(keyed, SlotGate):
            keyed.released()

    def seen_free(self, names: Iterable[str]) -> None:
        """The store shows a free slot of each of ``names`` (the poll after a denial)."""
        for name in names:
            gate = self.slot_gates.get(name)
            if gate is not None:
                gate.released()

    def observe(self, handles: Iterable[Any]) -> None:
        """Correct keyed gates from the decisions of a job's successful acquire."""
        now = self._clock()
        for handle in handles:
            gate = self.keyed_gates.get(handle.name)
            decision = getattr(handle, "decision", None)
            if isinstance(gate, RateGate) and decision is not None:
                gate.observe(decision, now)
