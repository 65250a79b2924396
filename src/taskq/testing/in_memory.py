"""``InMemoryBackend``: the whole enqueue → dispatch → execute cycle in memory, for unit tests.

Same enqueue semantics as the SQL backends (``unique_for`` with ``unique_states``,
singleton, ``max_pending`` with a stored override, idempotency keys) on an injected
clock. ``register_stub`` says how to execute an actor; ``run_until_drained`` runs every
job that is ready on the clock, applying the actor's retry policy to failures.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

import structlog
from pydantic import BaseModel, ConfigDict
from pydantic_core import to_jsonable_python

from taskq.actor import ActorRef, get_actor
from taskq.constants import ACTIVE_STATUSES
from taskq.exceptions import (
    MaxPendingExceededError,
    PayloadValidationError,
    SingletonCollisionError,
)
from taskq.records import AttemptRecord, EnqueueOutcome, EnqueueRequest, JobRecord
from taskq.request_batch import RequestBatch
from taskq.retry import RetryPolicy, decide_retry
from taskq.settings import TaskQSettings
from taskq.testing.clock import Clock, SystemClock

__all__ = ["InMemoryBackend", "PassthroughPayload", "StubContext"]

_log = structlog.get_logger("taskq.testing")


class PassthroughPayload(BaseModel):
    """The permissive payload model for stubs registered by bare actor name."""

    model_config = ConfigDict(extra="allow")


@dataclass
class StubContext:
    """The minimal context a stub receives: ``job_id``, ``attempt``, ``payload``, ``cancel_event``."""

    job_id: UUID
    attempt: int
    payload: Any
    actor: str
    queue: str
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def cancellation_requested(self) -> bool:
        """True once ``cancel_event`` is set."""
        return self.cancel_event.is_set()

    def should_abort(self) -> bool:
        """Same as :attr:`cancellation_requested` (there are no threads here)."""
        return self.cancel_event.is_set()


@dataclass
class _Stub:
    ref: ActorRef[Any, Any] | None
    fn: Callable[..., Any]


class InMemoryBackend:
    """A :class:`~taskq.backends.base.Backend` held in dictionaries, timed by ``clock``."""

    def __init__(self, clock: Clock | None = None) -> None:
        self.clock: Clock = clock or SystemClock()
        self.settings: TaskQSettings | None = None
        self.jobs: dict[UUID, JobRecord] = {}
        self._attempts: dict[UUID, list[AttemptRecord]] = {}
        self._stubs: dict[str, _Stub] = {}
        self.stored_max_pending: dict[str, int | None] = {}
        """Stands in for ``actor_config.max_pending``: a non-None value overrides the literal."""
        self._changed = asyncio.Condition()

    # -- enqueue ---------------------------------------------------------------------------

    async def enqueue(
        self, requests: Sequence[EnqueueRequest], *, connection: Any = None
    ) -> list[EnqueueOutcome]:
        """Apply every request, all or nothing (see the SQL backend for the order of checks)."""
        if connection is not None:
            raise TypeError("InMemoryBackend has no connections: connection= is for SQL backends")
        staged = dict(self.jobs)
        outcomes = [self._enqueue_one(staged, req) for req in requests]
        self.jobs = staged
        await self._notify()
        return outcomes

    async def enqueue_batch(self, batch: RequestBatch) -> list[EnqueueOutcome]:
        """:meth:`enqueue` of every request of ``batch``."""
        return await self.enqueue(batch.all())

    def _enqueue_one(self, jobs: dict[UUID, JobRecord], req: EnqueueRequest) -> EnqueueOutcome:
        now = self.clock.now()
        mine = [j for j in jobs.values() if j.actor == req.actor]
        if req.unique_for is not None and req.identity_key is not None:
            cutoff = now - req.unique_for
            matches = [
                j
                for j in mine
                if j.identity_key == req.identity_key
                and j.status in req.unique_states
                and j.created_at >= cutoff
            ]
            if matches:
                record = max(matches, key=lambda j: j.created_at)
                outcome = EnqueueOutcome(record, was_existing=True)
                if outcome.deduplicated_onto_terminal:
                    _log.warning(
                        "enqueue_deduplicated",
                        actor=req.actor,
                        job_id=str(record.id),
                        identity_key=req.identity_key,
                        matched_status=record.status,
                    )
                return outcome
        if req.singleton:
            for j in mine:
                if j.singleton and j.status in ACTIVE_STATUSES:
                    raise SingletonCollisionError.blocked_by(req.actor, j.id, j.deadline_at, now)
        cap = req.effective_max_pending(self.stored_max_pending.get(req.actor))
        if cap is not None:
            count = sum(1 for j in mine if j.status in ("pending", "scheduled"))
            if count >= cap:
                raise MaxPendingExceededError(req.actor, count, cap)
        if req.idempotency_key is not None:
            for j in mine:
                if j.idempotency_key == req.idempotency_key:
                    return EnqueueOutcome(j, was_existing=True)
        scheduled = req.scheduled_at
        if scheduled is None and req.delay_s is not None:
            scheduled = now + timedelta(seconds=req.delay_s)
        record = JobRecord(
            id=req.job_id,
            actor=req.actor,
            queue=req.queue,
            status="pending" if scheduled is None else "scheduled",
            payload=req.payload,
            result=None,
            priority=req.priority,
            attempt=0,
            budget_used=0,
            max_attempts=req.max_attempts,
            scheduled_at=scheduled or now,
            identity_key=req.identity_key,
            idempotency_key=req.idempotency_key,
            singleton=req.singleton,
            tags=list(req.tags),
            metadata=dict(req.metadata),
            error_class=None,
            error=None,
            cancel_phase=0,
            cancel_requested_at=None,
            progress=None,
            start_to_close_s=req.start_to_close_s,
            schedule_to_close_s=req.schedule_to_close_s,
            deadline_at=now + timedelta(seconds=req.schedule_to_close_s)
            if req.schedule_to_close_s
            else None,
            parent_job_id=req.parent_job_id,
            created_at=now,
            updated_at=now,
            started_at=None,
            finished_at=None,
        )
        jobs[record.id] = record
        return EnqueueOutcome(record)

    # -- reads and cancel ------------------------------------------------------------------

    async def get_job(self, job_id: UUID) -> JobRecord | None:
        """The job's current record, or ``None``."""
        return self.jobs.get(job_id)

    async def get_attempts(self, job_id: UUID) -> list[AttemptRecord]:
        """The job's attempts, oldest first."""
        return list(self._attempts.get(job_id, []))

    async def cancel_job(self, job_id: UUID) -> JobRecord | None:
        """Cancel a queued job (``CancelledBeforeStart``); a finished one is left alone."""
        job = self.jobs.get(job_id)
        if job is None or job.is_terminal:
            return job
        now = self.clock.now()
        if job.status in ("pending", "scheduled"):
            job = dataclasses.replace(
                job,
                status="cancelled",
                error_class="CancelledBeforeStart",
                finished_at=now,
                cancel_requested_at=now,
                updated_at=now,
            )
        else:
            job = dataclasses.replace(
                job, cancel_phase=max(1, job.cancel_phase), cancel_requested_at=now
            )
        self.jobs[job_id] = job
        await self._notify()
        return job

    async def wait_for(self, job_id: UUID, timeout: float | None) -> JobRecord | None:  # noqa: ASYNC109
        """Wait (real time) for the job to become terminal; the last record on timeout."""

        def done() -> bool:
            job = self.jobs.get(job_id)
            return job is None or job.is_terminal

        async with self._changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._changed.wait_for(done), timeout)
        return self.jobs.get(job_id)

    async def _notify(self) -> None:
        async with self._changed:
            self._changed.notify_all()

    # -- execution -------------------------------------------------------------------------

    def register_stub(self, actor: ActorRef[Any, Any] | str, fn: Callable[..., Any]) -> None:
        """Execute ``actor``'s jobs with ``fn(payload, ctx)`` (sync or async).

        Given the ``ActorRef``, payloads are validated into its model and results into its
        result type. Given a bare name, payloads become :class:`PassthroughPayload` (a
        warning is logged) and results are stored as returned.
        """
        if isinstance(actor, ActorRef):
            self._stubs[actor.name] = _Stub(actor, fn)
        elif isinstance(actor, str):
            _log.warning(
                "in_memory_stub_by_name", actor=actor, hint="pass the ActorRef to validate payloads"
            )
            self._stubs[actor] = _Stub(None, fn)
        else:
            raise TypeError(
                f"register_stub takes an ActorRef or a name, got {type(actor).__name__}"
            )

    def _ready(self, now: datetime) -> list[JobRecord]:
        ready = [
            j
            for j in self.jobs.values()
            if j.status in ("pending", "scheduled") and j.scheduled_at <= now
        ]
        return sorted(ready, key=lambda j: (-j.priority, j.scheduled_at, j.created_at, j.id))

    async def run_until_drained(self, *, max_jobs: int = 100_000) -> int:
        """Run ready jobs (``scheduled_at <= clock.now()``) until none is left; return how many ran.

        A retry or snooze with a delay lands in the future: advance the clock and call again.
        """
        ran = 0
        while ran < max_jobs:
            ready = self._ready(self.clock.now())
            if not ready:
                return ran
            await self._execute(ready[0])
            ran += 1
        return ran

    def _target(self, actor: str) -> tuple[ActorRef[Any, Any] | None, Callable[..., Any] | None]:
        stub = self._stubs.get(actor)
        if stub is not None:
            return stub.ref, stub.fn
        try:
            ref = get_actor(actor)
        except LookupError:
            return None, None
        return ref, None

    async def _execute(self, job: JobRecord) -> None:
        now = self.clock.now()
        attempt = job.attempt + 1
        job = dataclasses.replace(
            job, status="running", attempt=attempt, started_at=now, updated_at=now
        )
        self.jobs[job.id] = job
        ref, fn = self._target(job.actor)
        ctx_payload: Any = None
        try:
            if ref is None and fn is None:
                raise LookupError(f"no stub registered and no @actor named {job.actor!r}")
            if ref is not None:
                ctx_payload = ref.validate_payload(job.payload)
            else:
                ctx_payload = PassthroughPayload.model_validate(job.payload)
            if fn is not None:
                ctx = StubContext(job.id, attempt, ctx_payload, job.actor, job.queue)
                result = fn(ctx_payload, ctx)
                if inspect.isawaitable(result):
                    result = await result
            else:
                assert ref is not None
                result = await self._run_actor(ref, job, ctx_payload, attempt)
            stored = (
                ref.dump_result(ref.load_result(result))
                if ref is not None
                else to_jsonable_python(result)
            )
        except asyncio.CancelledError:
            self._finish(job, "cancelled", "cancelled", error_class="CancelledCooperatively")
        except Exception as exc:
            self._fail(job, ref, exc)
        else:
            self._finish(job, "succeeded", "succeeded", result=stored)
        await self._notify()

    async def _run_actor(
        self, ref: ActorRef[Any, Any], job: JobRecord, payload: Any, attempt: int
    ) -> Any:
        if ref.dependencies:
            raise LookupError(f"actor {ref.name!r} needs DI dependencies: register a stub for it")
        ctx = None
        if ref.wants_ctx:
            from taskq._ids import new_uuid
            from taskq.context import JobContext

            ctx = JobContext(job.id, job.actor, job.queue, attempt, new_uuid(), payload)
        return await ref.invoke(payload, ctx, {})

    def _finish(self, job: JobRecord, status: str, outcome: str, **changes: Any) -> None:
        now = self.clock.now()
        finished = dataclasses.replace(
            job, status=status, finished_at=now, updated_at=now, **changes
        )
        self.jobs[job.id] = finished
        self._record_attempt(finished, outcome, changes.get("error_class"), changes.get("error"))

    def _record_attempt(
        self, job: JobRecord, outcome: str, error_class: str | None, error: str | None
    ) -> None:
        self._attempts.setdefault(job.id, []).append(
            AttemptRecord(
                job.id,
                job.attempt,
                None,
                outcome,
                error_class,
                error,
                job.started_at or job.updated_at,
                self.clock.now(),
            )
        )

    def _fail(self, job: JobRecord, ref: ActorRef[Any, Any] | None, exc: Exception) -> None:
        now = self.clock.now()
        policy = ref.retry if ref is not None else RetryPolicy()
        decision = decide_retry(
            policy,
            exc,
            attempt=job.attempt,
            budget_used=job.budget_used,
            elapsed=now - job.created_at,
            schedule_to_close=timedelta(seconds=job.schedule_to_close_s)
            if job.schedule_to_close_s
            else None,
            non_retryable_exceptions=ref.non_retryable_exceptions if ref is not None else (),
            retry_classifier=ref.retry_classifier if ref is not None else None,
        )
        error_class = (
            type(exc).__name__
            if not isinstance(exc, PayloadValidationError)
            else "PayloadValidationError"
        )
        budget = job.budget_used + (
            1 if decision.consume_budget and decision.action != "snooze" else 0
        )
        if decision.action == "fail":
            self._finish(
                job, "failed", "failed", error_class=error_class, error=str(exc), budget_used=budget
            )
            return
        assert decision.delay is not None
        rescheduled = dataclasses.replace(
            job,
            status="scheduled",
            scheduled_at=now + decision.delay,
            budget_used=budget,
            error_class=error_class,
            error=str(exc),
            updated_at=now,
        )
        self.jobs[job.id] = rescheduled
        self._record_attempt(
            rescheduled,
            "snoozed" if decision.action == "snooze" else "retried",
            error_class,
            str(exc),
        )
