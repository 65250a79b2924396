"""The completer: write attempt outcomes in batches, then run the post-commit hooks.

Per-job transactions cap a worker at the database's single-statement transaction rate,
so outcomes queue here and one transaction writes everything that accumulated while the
previous one was in flight: an executemany of fenced ``job_attempts`` inserts and one of
fenced ``jobs`` updates. A write whose fence no longer holds (the lease was swept and the
row moved on) changes nothing. A failed flush is retried with backoff, however long the
store is gone: the write is fenced, so trying it is always safe, and only what the fence
refuses (a row the sweep reclaimed meanwhile) is lost; an outage longer than the lease
does not by itself mean the rows moved on (``worker-outcomes-fenced`` counts those that had).

A flush the server refuses for a value in it (a data or integrity error, not a lost
connection) is split in halves, each written on its own, down to the outcome it refused:
one bad outcome never holds back the others. That outcome is written again without what
the server refused (its result, its texts, the job's last progress), a success becoming a
failure with ``error_class`` ``OutcomeNotStorable``; if even that is refused it is dropped
as a stale one is (the sweep reclaims the row). Results, progress and texts are made
storable before they get here (:mod:`taskq.storable_json`), so this is the backstop for
what nobody foresaw, a constraint an operator added, say.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import Callable
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DataError, DBAPIError, IntegrityError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.db.dialect import traits
from taskq.db.engine import transaction
from taskq.db.queries import dispatch as dq
from taskq.db.queries import worker as wq
from taskq.storable_json import storable_text
from taskq.worker.shutdown import pause
from taskq.worker.state import AttemptOutcome, Outcome, OutcomeKind
from taskq.worker.telemetry import settle_span

__all__ = ["NOT_STORABLE", "Completer", "run_hook"]

_log = structlog.get_logger("taskq.worker")
_MAX_BATCH = 1000
_REFUSED = (DataError, IntegrityError)
"""What the server raises for a value it will not store (the connection is fine)."""
NOT_STORABLE = "OutcomeNotStorable"
"""The ``error_class`` of a success whose outcome the database refused."""


async def run_hook(name: str, fn: Callable[..., Any], limit_s: float, *args: Any) -> None:
    """Call a user hook bounded by ``limit_s`` seconds; its failure is logged, never raised."""
    try:
        async with asyncio.timeout(limit_s):
            value = fn(*args)
            if inspect.isawaitable(value):
                await value
    except TimeoutError:
        _log.warning("worker-hook-timeout", hook=name, timeout=limit_s)
    except Exception as exc:
        _log.warning("worker-hook-failed", hook=name, error=repr(exc))


def _log_outcome(level: Callable[..., Any], event: str, outcome: Outcome, **extra: Any) -> None:
    job = outcome.job
    level(
        event,
        job_id=str(job.id),
        actor=job.ref.name,
        attempt=job.attempt,
        outcome=outcome.kind,
        **extra,
    )


_BATCH_KEYS = (
    ("id", "b_id"),
    ("attempt", "b_attempt"),
    ("status", "b_status"),
    ("outcome", "b_outcome"),
    ("result", "b_result"),
    ("error_class", "b_error_class"),
    ("error", "b_error"),
    ("traceback", "b_traceback"),
    ("budget", "b_budget"),
    ("delay_s", "b_delay_s"),
    ("ttl_s", "b_ttl_s"),
    ("has_progress", "b_has_progress"),
    ("progress", "b_progress"),
    ("seq", "b_seq"),
)


def _columns(rows: list[dict[str, Any]], worker_id: UUID) -> dict[str, Any]:
    """Row-wise parameter sets to the parameters of ``finish_jobs_batch_pg``."""
    batch = [{name: row.get(key) for name, key in _BATCH_KEYS} for row in rows]
    for item in batch:
        item["id"] = str(item["id"])
    return {"batch": batch, "ids": [row["b_id"] for row in rows], "worker_id": worker_id}


class Completer:
    """Batches outcomes into fenced writes; ``on_written`` is called per committed outcome."""

    def __init__(
        self,
        engine: AsyncEngine,
        worker_id: UUID,
        *,
        lock_lease_s: float,
        on_written: Callable[[Outcome], None],
    ) -> None:
        self._engine = engine
        self._dialect = engine.dialect.name
        self._worker_id = worker_id
        self._lease_s = lock_lease_s
        self._on_written = on_written
        self._buffer: list[Outcome] = []
        self._wake = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()
        self._stop = asyncio.Event()
        self._hooks: set[asyncio.Task[None]] = set()
        self._record = dq.record_attempts(self._dialect)
        self._finish = dq.finish_jobs(self._dialect)
        self._release = wq.release_jobs(self._dialect)
        self._batch = dq.finish_jobs_batch_pg() if traits(self._dialect).document_batches else None
        self.on_event: Callable[[Outcome], None] | None = None
        """Called per committed outcome to publish its state-change event (progress
        stream); ``None`` (no Redis) costs nothing."""

    def submit(self, outcome: Outcome) -> None:
        """Queue an outcome for the next flush.

        An outcome already written in the job's own transaction (``committed`` set, see
        :mod:`taskq.worker.transactions`) is not written again: a committed one gets its
        post-commit hooks now, one whose fence failed only frees its slot.
        """
        if outcome.committed is not None:
            if outcome.committed:
                self._after_commit(outcome)
            else:
                self._on_written(outcome)
            return
        self._buffer.append(outcome)
        self._idle.clear()
        self._wake.set()

    @property
    def pending(self) -> int:
        """Outcomes not yet committed."""
        return len(self._buffer)

    async def drained(self) -> None:
        """Return once every submitted outcome is committed (or dropped)."""
        await self._idle.wait()

    def stop(self) -> None:
        """Make :meth:`run` return after the write in flight, if any (shutdown, after
        :meth:`drained`); never mid-write (see :mod:`taskq.worker.shutdown`)."""
        self._stop.set()
        self._wake.set()

    async def run(self) -> None:
        """Flush until :meth:`stop` (or cancelled)."""
        backoff = 0.05
        while not self._stop.is_set():
            if not self._buffer:
                self._idle.set()
                self._wake.clear()
                await self._wake.wait()
                continue
            batch = self._buffer[:_MAX_BATCH]
            dropped: list[Outcome] = []
            try:
                with settle_span(batch):
                    await self._write_isolating(batch, dropped)
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                _log.warning("worker-complete-failed", error=str(exc), batch=len(batch))
                await pause(self._stop, backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            backoff = 0.05
            del self._buffer[: len(batch)]
            for outcome in batch:
                if any(outcome is gone for gone in dropped):
                    self._on_written(outcome)
                else:
                    self._after_commit(outcome)

    async def _write_isolating(self, batch: list[Outcome], dropped: list[Outcome]) -> None:
        """:meth:`_write` ``batch``; if the server refuses a value in it, write each half
        on its own, down to the refused outcome, which is written without what was refused
        (:meth:`_write_refused`) or, refused again, added to ``dropped``.

        Any other error is raised, and the caller retries the whole batch: the parts
        already committed are fenced no-ops the second time.
        """
        try:
            await self._write(batch)
        except _REFUSED as exc:
            if len(batch) > 1:
                half = len(batch) // 2
                await self._write_isolating(batch[:half], dropped)
                await self._write_isolating(batch[half:], dropped)
            else:
                await self._write_refused(batch[0], exc, dropped)

    async def _write_refused(
        self, outcome: Outcome, exc: DBAPIError, dropped: list[Outcome]
    ) -> None:
        job = outcome.job
        refused = storable_text(str(exc.orig))
        _log_outcome(_log.error, "worker-outcome-refused", outcome, error=refused)
        if outcome.kind == OutcomeKind.SUCCEEDED:
            outcome.kind, outcome.attempt_outcome = OutcomeKind.FAILED, AttemptOutcome.FAILED
            outcome.error_class, outcome.result_value = NOT_STORABLE, None
        was = f" (the attempt raised {outcome.error_class})" if outcome.error else ""
        outcome.error = f"the database refused this attempt's outcome: {refused}{was}"
        outcome.result = outcome.traceback = job.progress = None
        try:
            await self._write([outcome])
        except _REFUSED as again:
            _log_outcome(_log.error, "worker-outcome-dropped", outcome, error=str(again.orig))
            dropped.append(outcome)

    def _params(self, outcome: Outcome) -> dict[str, Any]:
        job = outcome.job
        return {
            "b_id": job.id,
            "b_worker": self._worker_id,
            "b_attempt": job.attempt,
            "b_outcome": outcome.attempt_outcome,
            "b_error_class": outcome.error_class,
            "b_error": outcome.error,
            "b_traceback": outcome.traceback,
        }

    async def _write(self, batch: list[Outcome]) -> None:
        records: list[dict[str, Any]] = []
        finishes: list[dict[str, Any]] = []
        releases: list[dict[str, Any]] = []
        for outcome in batch:
            job = outcome.job
            if outcome.seq is None:  # once: a retried flush writes the same number
                outcome.seq = job.next_seq()
            params = self._params(outcome)
            params["b_seq"] = outcome.seq
            records.append(params)
            if outcome.kind == OutcomeKind.RELEASE:
                releases.append({**params, "b_hold_s": outcome.hold_s})
                continue
            finishes.append(
                {
                    **params,
                    "b_status": outcome.row_status,
                    "b_result": outcome.result,
                    "b_budget": outcome.budget,
                    "b_delay_s": outcome.delay_s,
                    "b_ttl_s": outcome.ttl_s,
                    "b_has_progress": 1 if job.progress is not None else 0,
                    "b_progress": job.progress,
                }
            )
        async with transaction(self._engine) as conn:
            if self._batch is not None:
                if finishes:
                    result = await conn.execute(self._batch, _columns(finishes, self._worker_id))
                    fenced = len(finishes) - max(0, result.rowcount)
                    if fenced > 0 and result.rowcount >= 0:
                        _log.info("worker-outcomes-fenced", count=fenced, batch=len(finishes))
                if releases:
                    await conn.execute(self._record, releases)
                    await conn.execute(self._release, releases)
                return
            await conn.execute(self._record, records)
            if finishes:
                await conn.execute(self._finish, finishes)
            if releases:
                await conn.execute(self._release, releases)

    async def write_in(self, conn: AsyncConnection, outcome: Outcome) -> bool:
        """Write one ending (not a release) on ``conn``, inside the caller's transaction,
        with the same fenced statements as a flush; ``True`` when the fence held.

        The job's transaction (:mod:`taskq.worker.transactions`) commits it together with
        the actor's writes and its sub-jobs.
        """
        job = outcome.job
        if outcome.seq is None:
            outcome.seq = job.next_seq()
        params = {
            **self._params(outcome),
            "b_seq": outcome.seq,
            "b_status": outcome.row_status,
            "b_result": outcome.result,
            "b_budget": outcome.budget,
            "b_delay_s": outcome.delay_s,
            "b_ttl_s": outcome.ttl_s,
            "b_has_progress": 1 if job.progress is not None else 0,
            "b_progress": job.progress,
        }
        with settle_span((outcome,)):
            await conn.execute(self._record, params)
            finished = await conn.execute(self._finish, params)
        return finished.rowcount == 1

    def _after_commit(self, outcome: Outcome) -> None:
        job = outcome.job
        ref = job.ref
        _log.debug(
            "job-finished",
            job_id=job.id,
            actor=ref.name,
            attempt=job.attempt,
            outcome=outcome.kind,
            error_class=outcome.error_class,
        )
        self._on_written(outcome)
        if self.on_event is not None:
            self.on_event(outcome)
        if ref.on_success is None and ref.on_retry_exhausted is None and ref.on_cancel is None:
            return
        row = job.claimed.columns()
        row["status"] = outcome.row_status
        row["error_class"] = outcome.error_class
        if job.sub_enqueue_error is not None:
            row["sub_enqueue_error"] = job.sub_enqueue_error
        if outcome.kind == OutcomeKind.SUCCEEDED and ref.on_success is not None:
            self._spawn(
                run_hook(
                    "on_success", ref.on_success, ref.on_success_timeout, row, outcome.result_value
                )
            )
        elif (
            outcome.kind == OutcomeKind.FAILED
            and ref.on_retry_exhausted is not None
            and outcome.exception is not None
        ):
            self._spawn(
                run_hook(
                    "on_retry_exhausted",
                    ref.on_retry_exhausted,
                    ref.on_retry_exhausted_timeout,
                    row,
                    outcome.exception,
                )
            )
        elif outcome.kind == OutcomeKind.CANCELLED and ref.on_cancel is not None:
            self._spawn(run_hook("on_cancel", ref.on_cancel, ref.on_cancel_timeout, row))

    def _spawn(self, coro: Any) -> None:
        task: asyncio.Task[None] = asyncio.get_running_loop().create_task(coro)
        self._hooks.add(task)
        task.add_done_callback(self._hooks.discard)

    async def wait_hooks(self, limit_s: float) -> None:
        """Give running hooks up to ``limit_s`` seconds (used at shutdown)."""
        if self._hooks:
            await asyncio.wait(list(self._hooks), timeout=limit_s)
