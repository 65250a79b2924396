"""One attempt, start to end: validate, acquire, inject, run under timeouts, classify.

:func:`execute` never raises for anything the actor does: every ending becomes an
:class:`~taskq.worker.state.Outcome` (succeeded, retry, snooze, failed, cancelled, or a
release back to the queue when this worker interrupted the attempt itself).
"""

from __future__ import annotations

import asyncio
import random
import traceback as tb
from collections.abc import Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from datetime import UTC, datetime, timedelta
from typing import Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from taskq.context import JobContext
from taskq.exceptions import ReservationUnavailable, ScheduleToCloseTimeout, StartToCloseTimeout
from taskq.retry import decide_retry
from taskq.worker.cancel import CANCEL_ABANDONED, CANCELLED_COOPERATIVELY, CANCELLED_FORCED
from taskq.worker.state import AttemptOutcome, Outcome, OutcomeKind, RunningJob
from taskq.worker.telemetry import record_exception, record_throttled
from taskq.worker.transactions import JobTransaction, JobTransactions, wants_transaction

__all__ = ["AttemptEnv", "execute"]

_log = structlog.get_logger("taskq.worker")
_TRACEBACK_LIMIT = 4000


class AttemptEnv:
    """What an attempt needs from its worker, injected so this module stays I/O-free.

    ``run_sync`` runs a sync actor's call in a tracked thread; ``dependencies`` opens the
    attempt's DI scope (an async context manager yielding the loop-resolved keyword
    arguments; TRANSIENT instances live until it closes); ``thread_kwargs`` builds a sync
    actor's THREAD-scoped arguments on the actor's own thread;
    ``acquire``/``release`` wrap the rate-limit registry (``None`` when no actor needs it);
    ``progress_sink`` builds a job's progress sink; ``sub_jobs`` is ``ctx.jobs``;
    ``transactions`` gives eligible attempts their job transaction (``None``: no
    ``AsyncConnection`` registered at ``Scope.LOOP``; see :mod:`taskq.worker.transactions`).
    """

    def __init__(
        self,
        *,
        run_sync: Callable[[RunningJob, Callable[[], Any]], Awaitable[Any]],
        dependencies: Callable[[RunningJob], AbstractAsyncContextManager[dict[str, object]]],
        thread_kwargs: Callable[[RunningJob], dict[str, object]],
        acquire: Callable[[RunningJob, Any], Awaitable[Any]] | None,
        release: Callable[[Any], Awaitable[None]] | None,
        progress_sink: Callable[[RunningJob], Any] | None,
        sub_jobs: Any,
        default_start_to_close: timedelta | None,
        lock_lease_s: float,
        hold_s: Callable[[], float],
        transactions: JobTransactions | None = None,
    ) -> None:
        self.run_sync = run_sync
        self.dependencies = dependencies
        self.thread_kwargs = thread_kwargs
        self.acquire = acquire
        self.release = release
        self.progress_sink = progress_sink
        self.sub_jobs = sub_jobs
        self.default_start_to_close = default_start_to_close
        self.lock_lease_s = lock_lease_s
        self.hold_s = hold_s
        self.transactions = transactions


def _summary(exc: BaseException) -> str:
    text = "".join(tb.format_exception(exc))
    return text if len(text) <= _TRACEBACK_LIMIT else "..." + text[-_TRACEBACK_LIMIT:]


def _timeout_s(job: RunningJob, env: AttemptEnv) -> float | None:
    claimed = job.claimed
    if claimed.start_to_close_s is not None:
        start_to_close: float | None = float(claimed.start_to_close_s)
    elif job.ref.start_to_close is not None:
        start_to_close = job.ref.start_to_close.total_seconds()
    elif env.default_start_to_close is not None:
        start_to_close = env.default_start_to_close.total_seconds()
    else:
        start_to_close = None
    deadline = claimed.deadline_at
    if deadline is None:
        return start_to_close
    left = (deadline - datetime.now(UTC)).total_seconds()
    return left if start_to_close is None else min(start_to_close, left)


def _build_ctx(job: RunningJob, payload: Any, env: AttemptEnv) -> JobContext[Any]:
    ref = job.ref
    if env.sub_jobs is not None:
        job.sub_jobs = env.sub_jobs(job)
    ctx: JobContext[Any] = JobContext(
        job_id=job.id,
        actor=ref.name,
        queue=job.claimed.queue,
        attempt=job.attempt,
        worker_id=job.worker_id,
        payload=payload,
        jobs=job.sub_jobs,
        span=job.span,
        cancel_event=job.cancel_event,
        progress_sink=env.progress_sink(job) if env.progress_sink is not None else None,
        _abort=job.abort_flag,
    )
    return ctx


async def _invoke(job: RunningJob, payload: Any, env: AttemptEnv) -> Any:
    ref = job.ref
    args: tuple[Any, ...] = (payload, job.ctx) if ref.wants_ctx else (payload,)
    if not ref.dependencies:
        if ref.is_sync:
            fn = ref.fn
            return await env.run_sync(job, lambda: fn(*args))
        return await ref.fn(*args)
    async with env.dependencies(job) as deps:
        if job.tx is not None:
            # The actor's own writes join the job's transaction: its connection, injected.
            for name, dep in ref.dependencies.items():
                if dep is AsyncConnection:
                    deps = {**deps, name: await job.tx.connection()}
        if ref.is_sync:
            fn = ref.fn

            def call() -> Any:
                # THREAD-scoped instances are built here, on the actor's own thread.
                return fn(*args, **{**deps, **env.thread_kwargs(job)})

            return await env.run_sync(job, call)
        return await ref.fn(*args, **deps)


async def execute(job: RunningJob, env: AttemptEnv) -> Outcome:
    """Run one claimed attempt and return how it ended (never raises for actor errors)."""
    ref = job.ref
    acquired: Any = None
    timed_out = False
    tx: JobTransaction | None = None
    try:
        payload = ref.validate_payload(job.claimed.payload)
        if ref.wants_ctx:
            job.ctx = _build_ctx(job, payload, env)
        if job.cancel_reason is not None:
            job.request_cancel(job.cancel_reason)
        timeout = _timeout_s(job, env)
        if timeout is not None and timeout <= 0:
            raise ScheduleToCloseTimeout(ref.name, job.id)
        if env.acquire is not None:
            acquired = await env.acquire(job, payload)
        if env.transactions is not None and wants_transaction(ref):
            tx = job.tx = await env.transactions.open(job)
        if timeout is None:
            result = await _invoke(job, payload, env)
        else:
            limit = asyncio.timeout(timeout)
            try:
                async with limit:
                    result = await _invoke(job, payload, env)
            except TimeoutError:
                if not limit.expired():
                    raise
                timed_out = True
                raise StartToCloseTimeout(ref.name, job.id, timeout) from None
        dumped = ref.dump_result(result)
        outcome = Outcome(
            job,
            OutcomeKind.SUCCEEDED,
            AttemptOutcome.SUCCEEDED,
            result=dumped,
            result_value=result,
            ttl_s=job.claimed.result_ttl_s,
        )
        if tx is None:
            return outcome
        try:  # children, terminal write and the actor's writes: one commit
            return await tx.succeed(outcome)
        except Exception as exc:
            _log.warning(
                "worker-job-transaction-failed",
                job_id=str(job.id),
                actor=ref.name,
                attempt=job.attempt,
                error=repr(exc),
            )
            raise
    except asyncio.CancelledError as exc:
        return _cancelled(job, exc, env)
    except ReservationUnavailable as exc:
        record_throttled(job, exc)
        return Outcome(
            job,
            OutcomeKind.SNOOZE,
            AttemptOutcome.SNOOZED,
            error_class=type(exc).__name__,
            error=str(exc),
            delay_s=exc.retry_after.total_seconds(),
        )
    except Exception as exc:
        record_exception(job.span, exc)
        if job.cancel_reason == "job":
            return _cancelled(job, exc, env)
        return _failure(job, exc, timed_out)
    finally:
        if tx is not None:  # rolled back unless committed, before the ending is written
            await tx.close()
        if acquired is not None and env.release is not None:
            try:
                await env.release(acquired)
            except Exception as exc:
                _log.warning(
                    "worker-release-failed",
                    job_id=str(job.id),
                    actor=ref.name,
                    attempt=job.attempt,
                    error=repr(exc),
                )


def _cancelled(job: RunningJob, exc: BaseException, env: AttemptEnv) -> Outcome:
    if job.cancel_reason in ("shutdown", "isolated"):
        hold = env.hold_s() if job.thread_alive() else None
        return Outcome(
            job,
            OutcomeKind.RELEASE,
            AttemptOutcome.RETRIED,
            error_class="WorkerShutdown" if job.cancel_reason == "shutdown" else "WorkerIsolated",
            error="attempt interrupted by the worker; released to the queue",
            hold_s=hold,
        )
    if job.cancel_reason == "job":
        if job.cancel_phase >= 3:
            error_class = CANCEL_ABANDONED
        elif job.forced and not job.ref.is_sync:
            error_class = CANCELLED_FORCED
        else:
            error_class = CANCELLED_COOPERATIVELY
        return Outcome(
            job,
            OutcomeKind.CANCELLED,
            AttemptOutcome.CANCELLED,
            error_class=error_class,
            error="job cancelled",
            traceback=None if isinstance(exc, asyncio.CancelledError) else _summary(exc),
        )
    # The actor raised CancelledError without anyone asking: treat it as an error.
    return _failure(job, exc, False)


def _failure(job: RunningJob, exc: BaseException, timed_out: bool) -> Outcome:
    ref = job.ref
    claimed = job.claimed
    if isinstance(exc, ScheduleToCloseTimeout):
        return Outcome(
            job,
            OutcomeKind.FAILED,
            AttemptOutcome.FAILED,
            error_class=type(exc).__name__,
            error=str(exc),
            budget=1,
            exception=exc,
        )
    created = claimed.created_at
    elapsed = datetime.now(UTC) - created if created is not None else timedelta(0)
    stc = claimed.schedule_to_close_s
    decision = decide_retry(
        ref.retry,
        exc,
        attempt=job.attempt,
        budget_used=int(claimed.budget_used or 0),
        elapsed=elapsed,
        schedule_to_close=timedelta(seconds=stc) if stc is not None else None,
        non_retryable_exceptions=ref.non_retryable_exceptions,
        retry_classifier=ref.retry_classifier,
        rng=random,
    )
    max_attempts = claimed.max_attempts
    if (
        decision.action == "retry"
        and max_attempts is not None
        and ref.retry.kind == "transient"
        and int(claimed.budget_used or 0) + (1 if decision.consume_budget else 0) >= max_attempts
    ):
        decision = type(decision)("fail", None, decision.consume_budget, "exhausted")
    deadline = claimed.deadline_at
    if (
        decision.action != "fail"
        and deadline is not None
        and decision.delay is not None
        and datetime.now(UTC) + decision.delay > deadline
    ):
        decision = type(decision)("fail", None, decision.consume_budget, "schedule_to_close")
    error_class = type(exc).__name__
    text = str(exc) or error_class
    summary = None if decision.action == "snooze" else _summary(exc)
    budget = 1 if decision.consume_budget else 0
    delay_s = decision.delay.total_seconds() if decision.delay is not None else None
    if decision.action == "snooze":
        return Outcome(
            job,
            OutcomeKind.SNOOZE,
            AttemptOutcome.SNOOZED,
            error_class=error_class,
            error=text,
            delay_s=delay_s,
        )
    if decision.action == "retry":
        return Outcome(
            job,
            OutcomeKind.RETRY,
            AttemptOutcome.RETRIED,
            error_class=error_class,
            error=text,
            traceback=summary,
            delay_s=delay_s,
            budget=budget,
        )
    _log.info(
        "job-failed",
        job_id=str(job.id),
        actor=ref.name,
        attempt=job.attempt,
        error_class=error_class,
        reason=decision.reason,
        timed_out=timed_out,
    )
    return Outcome(
        job,
        OutcomeKind.FAILED,
        AttemptOutcome.FAILED,
        error_class=error_class,
        error=text,
        traceback=summary,
        budget=budget,
        exception=exc,
    )
