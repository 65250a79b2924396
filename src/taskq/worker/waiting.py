"""Waiting: how limits shape what the dispatcher claims, and how a denied job waits.

:class:`Gatekeeper` sits between the claim loop and the limits (:class:`Limits`):

- before a claim it plans the round (:meth:`Gatekeeper.plan`): actors whose gates say
  nothing can be admitted are left out, the others are claimed at most as many times as
  their gates allow, and static rate-limit tokens are paid for those jobs first
  (:mod:`taskq.worker.admission`);
- after the claim it admits each job (:meth:`Gatekeeper.admit`): queue cap, reservations
  and keyed limits are acquired per job; a denied job is **parked**: ``scheduled`` at the
  earliest moment it can be admitted, in one fenced row write per job (all of a round's
  parks in one statement), no attempt counted and no ``job_attempts`` row, the primitive
  recorded in ``waiting_on``;
- a released reservation or queue-cap slot wakes one job parked on it
  (:meth:`taskq.worker.resources.Limits.wake`); a static reservation's slot is instead
  *kept* by the worker whose job ended and handed to the next job it claims
  (:meth:`Gatekeeper.keep`, :meth:`Gatekeeper.plan_hand_over`), or released with a
  NOTIFY that wakes the other workers.

A park is no attempt, so it makes no ``process`` span: each admission is an ``admit``
span and each written park a ``taskq.job.throttled.duration`` point
(:mod:`taskq.worker.telemetry`; nothing made without an SDK).
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef
from taskq.db.engine import transaction
from taskq.db.queries import dispatch as dq
from taskq.db.queries import handover as hq
from taskq.db.queries import ratelimit as rq
from taskq.exceptions import ReservationUnavailable
from taskq.worker.admission import Admission, Prepaid, RateGate
from taskq.worker.claimed import ClaimedJob
from taskq.worker.resources import Limits
from taskq.worker.state import RunningJob
from taskq.worker.telemetry import admission_span, mark_admission, record_parked

__all__ = ["Gatekeeper", "Plan", "SlotLost"]

_log = structlog.get_logger("taskq.worker")
_SLOT_POLL_S = 0.02
"""At most one look at the slots a denial marked full per this many seconds."""
_PARK_MARGIN_S = 0.005
"""Parked a little past the projected moment: the store's clock decides, not ours."""


@dataclass(slots=True)
class Plan:
    """One round: ``limits[actor]`` for the throttled actors that may be claimed (their
    prepaid tokens in ``paid``), ``queues`` still open (no full cap), their caps' room."""

    limits: dict[str, int] = field(default_factory=dict)
    paid: dict[str, Prepaid] = field(default_factory=dict)
    queues: tuple[str, ...] = ()
    room: dict[str, float] = field(default_factory=dict)
    hand_over: bool = False
    """Only the planned actors are claimed (:meth:`Gatekeeper.plan_hand_over`)."""
    started: float = field(default_factory=time.monotonic)
    """When the round was planned: slots kept before it and unused by it are released."""


class SlotLost(RuntimeError):
    """A slot this worker kept was taken by another worker meanwhile (this worker stalled
    past its lease): the claim that would have used it is rolled back."""


@dataclass(slots=True)
class _Park:
    job: RunningJob
    name: str
    delay_s: float
    primitive: str = "concurrency"
    """The kind of what denied: ``token_bucket``, ``sliding_window`` or ``concurrency``."""


def _rate_kind(primitive: Any) -> str:
    """The kind of a rate limit (a keyed ref is a token bucket per key)."""
    return "sliding_window" if hasattr(primitive, "window") else "token_bucket"


class Gatekeeper:
    """The dispatcher's side of the limits: plan, admit or park, take, release."""

    def __init__(
        self,
        engine: AsyncEngine,
        limits: Limits,
        actors: dict[str, ActorRef[Any, Any]],
        worker_id: UUID,
        queues: tuple[str, ...],
    ) -> None:
        from taskq.ratelimit import KeyedRateLimitRef, KeyedReservationRef

        self._engine = engine
        self._dialect = engine.dialect.name
        self.limits = limits
        self._actors = actors
        self._worker_id = worker_id
        self._queues = queues
        self.admission = Admission(
            actors,
            limits.registry,
            limits.queue_caps,
            acquire=limits.acquire_rate,
            refund=limits.refund_rate,
            take_slot=limits.take_slot,
            give_slot=limits.give_slot,
            in_claim=self._in_claim,
        )
        limits.never_parked = self.admission.static_slots
        self._keyed_rates = {
            name: [e for e in ref.rate_limits if isinstance(e, KeyedRateLimitRef)]
            for name, ref in actors.items()
        }
        self._keyed_slots = {
            name: [e for e in ref.reservations if isinstance(e, KeyedReservationRef)]
            for name, ref in actors.items()
        }
        self._taken: dict[UUID, Any] = {}
        self._dry: dict[str, float] = {}
        """Actors whose backlog ran short -> when it was last looked at: looked at again
        once per poll interval (a NOTIFY wakes the loop, but says nothing of actors)."""
        self.poll_s = 0.2
        self._failures: dict[str, float] = {}
        self._ensured: set[str] = set()
        self._slots_read = -math.inf
        self._park = dq.park_jobs(self._dialect)
        self._attach = dq.attach_slots()
        self._adopt = hq.adopt_slot(self._dialect)
        self.claiming: Callable[[], bool] = lambda: True
        """Whether the dispatcher still claims (a slot is kept only for a claim to come)."""
        self._closed = False
        self.parked_total = 0

    # -- before the claim -------------------------------------------------------------

    def _in_claim(self, reservation: Any) -> bool:
        """A store-backed reservation in the worker's own schema: its slots are taken by
        statements of the claim's transaction (one transaction fewer per job)."""
        # schema None: the engine's own map, which on the worker's engine is its schema.
        return bool(
            reservation.clock is None and reservation.schema in (None, self.limits.schema_name)
        )

    async def take_slots(self, conn: AsyncConnection, plan: Plan, actor: str, want: int) -> int:
        """In the claim's transaction: take the slots deferred for ``actor``'s jobs; how
        many of its jobs may be claimed (at most ``want``)."""
        paid = plan.paid.get(actor)
        if paid is None or not paid.deferred:
            return want
        paid.granted = min(paid.granted, want)

        async def take(reservation: Any) -> int | None:
            if reservation.name not in self._ensured:
                # Slot rows are made on first use (a reservation named by an actor but
                # declared elsewhere was not synced at boot).
                await conn.execute(
                    rq.slots_ensure(self._dialect, reservation.name, reservation.slots)
                )
                self._ensured.add(reservation.name)
            stmt = rq.slot_claim(
                self._dialect,
                reservation.name,
                reservation.slots,
                job_id=None,
                worker_id=self._worker_id,
                lease_s=reservation.lease_s,
            )
            value = (await conn.execute(stmt)).scalar_one_or_none()
            return None if value is None else int(value)

        return await self.admission.take_in_claim(paid, take)

    def new_work(self) -> None:
        """A NOTIFY said jobs were enqueued: actors whose backlog ran dry are looked at
        (one indexed read each) in the next round instead of after the poll interval."""
        for actor in self._dry:
            self._dry[actor] = -math.inf

    def throttled(self, actor: str) -> bool:
        """True when the actor's jobs are claimed only through :meth:`plan`'s limits."""
        return self.admission.throttled(actor)

    async def plan_hand_over(self, free: int) -> Plan:
        """A round for the slots kept from jobs that just ended: at most one job for each
        actor that can use them, paid with the kept slots only (and its tokens)."""
        adm = self.admission
        plan = Plan(hand_over=True)
        plan.room = {q: adm.queue_allowance(q) for q in self._queues}
        plan.queues = tuple(q for q in self._queues if plan.room[q] >= 1)
        left = free
        for actor in adm.kept_actors() if plan.queues else ():
            if left <= 0:
                break
            try:
                paid = await adm.prepay(actor, 1, kept_only=True)
            except Exception as exc:
                _log.warning("worker-limit-unavailable", actor=actor, error=repr(exc))
                continue
            if paid.granted > 0:
                plan.paid[actor] = paid
                plan.limits[actor] = paid.granted
                left -= paid.granted
        return plan

    async def plan(self, free: int) -> Plan:
        """Decide what this round may claim; pay the static rate-limit tokens for it."""
        adm = self.admission
        await self._look_at_full_slots()
        plan = Plan()
        plan.room = {q: adm.queue_allowance(q) for q in self._queues}
        plan.queues = tuple(q for q in self._queues if plan.room[q] >= 1)
        self._closed = not plan.queues
        if not plan.queues:
            return plan
        left = free
        for actor in sorted(self._actors):
            if left <= 0:
                break
            if not adm.throttled(actor):
                continue
            allowed = adm.allowance(actor)
            want = int(min(left, allowed, sum(plan.room[q] for q in plan.queues)))
            if want <= 0:
                continue
            try:
                looked = self._dry.get(actor)
                if looked is not None:
                    if time.monotonic() - looked < self.poll_s:
                        continue
                    self._dry[actor] = time.monotonic()
                    if not await self._has_ready(actor, plan.queues):
                        continue
                    del self._dry[actor]
                paid = await adm.prepay(actor, want)
            except Exception as exc:
                # A limit's store is down (Redis, or the database): its jobs wait, pending,
                # instead of spending attempts; the actor is tried again shortly.
                wait = self._failures.get(actor, 0.25)
                self._failures[actor] = min(wait * 2, 5.0)
                adm.hold_off(actor, wait)
                _log.warning(
                    "worker-limit-unavailable", actor=actor, error=repr(exc), retry_in=wait
                )
                continue
            self._failures.pop(actor, None)
            if paid.granted <= 0:
                continue
            plan.paid[actor] = paid
            plan.limits[actor] = paid.granted
            left -= paid.granted
        return plan

    async def _has_ready(self, actor: str, queues: tuple[str, ...]) -> bool:
        async with transaction(self._engine, readonly=True) as conn:
            found = (await conn.execute(dq.has_ready(self._dialect, queues, actor))).first()
        return found is not None

    async def _look_at_full_slots(self) -> None:
        """Reservations a denial marked full: free again in the store? (The poll that
        brings releases by other workers on SQLite, and a fallback for a lost NOTIFY.)"""
        names = self.admission.waiting_slots()
        now = time.monotonic()
        if not names or now - self._slots_read < _SLOT_POLL_S:
            return
        self._slots_read = now
        try:
            async with transaction(self._engine, readonly=True) as conn:
                rows = (await conn.execute(dq.free_slots(self._dialect, tuple(names)))).all()
        except (DBAPIError, SQLAlchemyError, OSError) as exc:
            _log.warning("worker-slot-read-failed", error=str(exc))
            return
        self.admission.seen_free(name for name, free in rows if free and int(free) > 0)

    async def assign(self, conn: AsyncConnection, plan: Plan, rows: Sequence[ClaimedJob]) -> None:
        """Give each claimed job of a planned actor what was taken for it, and tie its
        reservation slots to it, in the claim's own transaction (a slot row then names
        its job from the moment the job is ``running``)."""
        from taskq.ratelimit import ReservationHandle

        attach: list[dict[str, Any]] = []
        adopt: list[dict[str, Any]] = []
        for row in rows:
            paid = plan.paid.get(row.actor)
            if paid is None or paid.granted <= 0:
                continue
            handles = paid.take_one(row.id, self._worker_id)
            row.prepaid = handles
            for h in handles:
                if not isinstance(h, ReservationHandle) or h.primitive.clock is not None:
                    continue
                params = {
                    "b_name": h.name,
                    "b_slot": h.slot_index,
                    "b_job": row.id,
                    "b_worker": self._worker_id,
                }
                if (h.name, h.slot_index) in paid.adopted:
                    adopt.append({**params, "b_lease_s": h.primitive.lease_s})
                else:
                    attach.append(params)
        if attach:
            await conn.execute(self._attach, attach)
        for params in adopt:
            # One row each: its count says whether the kept slot is still this worker's.
            if (await conn.execute(self._adopt, params)).rowcount != 1:
                raise SlotLost(f"reservation {params['b_name']!r} slot {params['b_slot']}")

    async def settle(self, plan: Plan, rows: Sequence[ClaimedJob] = ()) -> None:
        """Give back what was taken for jobs the claim did not find. An actor the claim
        found nothing for is marked dry (a short claim alone may be a race with another
        worker's claim, not an empty backlog)."""
        found = {row.actor for row in rows}
        for actor, paid in plan.paid.items():
            if paid.granted > 0:
                if actor not in found:
                    self._dry[actor] = time.monotonic()  # look before paying again
                await self.admission.settle(paid)
        await self.admission.release_kept(before=plan.started)

    def keep(self, handle: Any) -> bool:
        """``Limits.keep``: keep the slot of a static reservation a finished job held for
        the next claim (True) instead of releasing it, while the dispatcher claims."""
        return self.claiming() and self.admission.keep(handle.name, handle.slot_index)

    async def release_kept(self) -> None:
        """Release every kept slot (the dispatcher stopped claiming)."""
        await self.admission.release_kept()

    async def drop(self, rows: Sequence[ClaimedJob]) -> None:
        """Give back what was taken for claimed jobs that will not start (shutdown, or a
        claim rolled back: then the slot rows it made are not certain either)."""
        self._ensured.clear()
        for row in rows:
            await self.admission.refund(row.take_prepaid())

    def wait_s(self, poll_s: float, free: int) -> float:
        """How long the claim loop may sleep: the poll, or less when a gate opens sooner
        (with room for ``free`` jobs). Actors whose backlog ran dry wait for the poll
        or a NOTIFY."""
        if self._closed:
            return poll_s
        nxt = self.admission.next_change(free, self._dry)
        if nxt is None:
            return poll_s
        return max(0.002, min(poll_s, nxt - time.monotonic()))

    # -- after the claim --------------------------------------------------------------

    def needs_admission(self, job: RunningJob) -> bool:
        """True when the job takes something per job (a cap, a reservation, a keyed limit)."""
        ref = job.ref
        return bool(
            job.claimed.queue in self.limits.queue_caps
            or ref.reservations
            or self._keyed_rates[ref.name]
            or job.claimed.prepaid
        )

    async def admit(self, jobs: list[RunningJob]) -> list[RunningJob]:
        """Acquire per job; park the denied ones (one statement). Returns the jobs to run."""
        parks: list[_Park] = []
        results = await asyncio.gather(*(self._admit_one(job) for job in jobs))
        run: list[RunningJob] = []
        for job, park in zip(jobs, results, strict=True):
            if park is None:
                run.append(job)
            else:
                parks.append(park)
        if parks:
            await self._write_parks(parks)
        return run

    def _keyed_names(self, job: RunningJob) -> dict[str, Any]:
        """Concrete names of the job's keyed limits -> their refs (empty on a bad payload:
        the attempt reports that)."""
        ref = job.ref
        out: dict[str, Any] = {}
        payload = job.claimed.payload
        entries: list[Any] = [*self._keyed_slots[ref.name], *self._keyed_rates[ref.name]]
        try:
            for entry in entries:
                out[entry.concrete_name(payload, actor=ref.name)] = entry
        except Exception:
            return {}
        return out

    async def _admit_one(self, job: RunningJob) -> _Park | None:
        with admission_span(job.claimed, job.ref.name) as span:
            park = await self._admit_job(job)
            if span is not None:
                mark_admission(
                    span, None if park is None else (park.name, park.primitive, park.delay_s)
                )
        return park

    async def _admit_job(self, job: RunningJob) -> _Park | None:
        from taskq.ratelimit import KeyedRateLimitRef, ReservationHandle

        adm = self.admission
        row = job.claimed
        prepaid = row.take_prepaid()
        ref = job.ref
        keyed: dict[str, Any] = self._keyed_names(job)
        waited = row.waiting_on
        blocked = adm.keyed_block(name for name in keyed if name != waited)
        if blocked is not None:
            await adm.refund(prepaid)
            name, until = blocked
            gate = adm.keyed_gates.get(name)
            kind = "token_bucket" if isinstance(gate, RateGate) else "concurrency"
            return _Park(job, name, max(0.0, until - time.monotonic()) + _PARK_MARGIN_S, kind)
        try:
            taken = await self.limits.acquire(
                job,
                row.payload,
                prepaid=prepaid,
                rate_limits=self._keyed_rates[ref.name],
                reservations=self._keyed_slots[ref.name],
            )
        except ReservationUnavailable as exc:
            await adm.refund(prepaid)
            name = exc.bucket_name
            entry = keyed.get(name)
            is_rate = isinstance(entry, KeyedRateLimitRef) or name in adm.rate_gates
            now = time.monotonic()
            until = adm.denied(
                name,
                exc.retry_after.total_seconds(),
                now,
                slot=not is_rate,
                keyed=entry,
            )
            if isinstance(entry, KeyedRateLimitRef):
                kind = "token_bucket"
            elif is_rate:
                kind = _rate_kind(adm.rate_gates[name].primitive)
            else:
                kind = "concurrency"
            return _Park(job, name, max(0.0, until - now) + _PARK_MARGIN_S, kind)
        except Exception as exc:
            # Not a denial (a store down, a bad payload): the attempt reports it.
            await adm.refund(prepaid)
            self._taken[job.id] = exc
            return None
        for cap, _slot in taken.caps:
            adm.took_slot(cap.name)
        for handle in taken.resources:
            if isinstance(handle, ReservationHandle) and handle.name not in adm.static_slots:
                adm.took_slot(handle.name)
        adm.observe(taken.resources)
        self._taken[job.id] = taken
        return None

    async def _write_parks(self, parks: list[_Park]) -> None:
        params = [
            {
                "b_id": p.job.id,
                "b_worker": self._worker_id,
                "b_attempt": p.job.attempt,
                "b_delay_s": p.delay_s,
                "b_waiting_on": p.name,
            }
            for p in parks
        ]
        for attempt in range(3):
            try:
                async with transaction(self._engine) as conn:
                    await conn.execute(self._park, params)
                self.parked_total += len(parks)
                record_parked((p.job, p.primitive, p.delay_s) for p in parks)
                return
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                # Unwritten, the rows stay claimed until the lease sweep hands them back.
                _log.warning("worker-park-failed", jobs=len(parks), error=str(exc))
                await asyncio.sleep(0.05 * (attempt + 1))

    # -- the attempt's acquire and release ------------------------------------------

    async def take(self, job: RunningJob, payload: Any) -> Any:
        """``AttemptEnv.acquire``: what :meth:`admit` took for the job (or its error)."""
        taken = self._taken.pop(job.id, None)
        if isinstance(taken, BaseException):
            raise taken
        if taken is None:  # not admitted through a claim round: take it now
            taken = await self.limits.acquire(job, payload)
        return taken

    async def release(self, acquired: Any) -> None:
        """``AttemptEnv.release``: give the slots back (and wake a parked job per slot)."""
        await self.limits.release(acquired)

    async def abandon(self, job: RunningJob) -> None:
        """Release what was taken for a job whose attempt never asked for it (it ended
        before its acquire, on a bad payload or a timeout already spent)."""
        taken = self._taken.pop(job.id, None)
        if taken is not None and not isinstance(taken, BaseException):
            await self.limits.release(taken)
