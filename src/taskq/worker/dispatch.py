"""The claim loop: fill free slots with batches of ready jobs, start one task per job.

One statement claims a batch (``FOR UPDATE SKIP LOCKED`` on Postgres, under SQLite's
write lock there). The loop claims again at once while slots are free and the last claim
came back full; otherwise it sleeps until a NOTIFY (Postgres), a freed slot, or the poll
interval. Actors with a stored ``max_concurrent`` get the best-effort per-round damper:
the running count is read once per round, before the row locks, and each capped actor is
claimed with at most its residual. Queues in ``fair`` mode split a round evenly across
the worker's actors instead of strict priority order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef
from taskq.db.engine import transaction
from taskq.db.queries import dispatch as dq
from taskq.settings import WorkerSettings
from taskq.worker.claimed import decode_claimed
from taskq.worker.execute import AttemptEnv, execute
from taskq.worker.outcomes import Completer
from taskq.worker.state import Outcome, RunningJob
from taskq.worker.telemetry import attempt_span, mark_span, record_completed

__all__ = ["Dispatcher", "run_sync_actor_tracked"]

_log = structlog.get_logger("taskq.worker")
_CONFIG_TTL_S = 2.0


async def run_sync_actor_tracked(
    job: RunningJob, call: Callable[[], Any], executor: ThreadPoolExecutor
) -> Any:
    """Run a sync actor's ``call`` in ``executor``, tracking the thread's exit on ``job``.

    Cancelling the await (a timeout, FORCING) does not stop the thread; ``job.thread_done``
    (a ``threading.Event``) is set only when the function has really returned, and
    ``job.thread_exited`` is set on the loop at the same moment, so shutdown can hold the
    row's release until the thread provably exited.
    """
    import threading

    loop = asyncio.get_running_loop()
    done = threading.Event()
    exited = asyncio.Event()
    job.thread_done = done
    job.thread_exited = exited

    def tracked() -> Any:
        try:
            return call()
        finally:
            done.set()
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(exited.set)

    return await loop.run_in_executor(executor, tracked)


_run_sync_actor_tracked = run_sync_actor_tracked


class Dispatcher:
    """Owns the slots: claims, starts and tracks every attempt of this worker."""

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        settings: WorkerSettings,
        worker_id: UUID,
        actors: Mapping[str, ActorRef[Any, Any]],
        env_factory: Callable[[Dispatcher], AttemptEnv],
        wake: asyncio.Event,
    ) -> None:
        self.engine = engine
        self.settings = settings
        self.worker_id = worker_id
        self.actors = dict(actors)
        self.dialect = engine.dialect.name
        self.wake = wake
        self.running: dict[UUID, RunningJob] = {}
        self.inflight: dict[UUID, RunningJob] = {}
        self.lingering: set[RunningJob] = set()
        self.held: set[RunningJob] = set()
        self.claiming = True
        self.slot_freed = asyncio.Event()
        self.executor = ThreadPoolExecutor(
            max_workers=settings.max_concurrency + 4, thread_name_prefix="taskq-actor"
        )
        self.completer = Completer(
            engine,
            worker_id,
            lock_lease_s=settings.lock_lease.total_seconds(),
            on_written=self._written,
        )
        self.env = env_factory(self)
        self.on_start: Callable[[RunningJob], None] | None = None
        """Called as each claimed attempt starts (the progress stream's ``running``
        event); ``None`` when nothing listens."""
        self.stored_ttl: dict[str, float | None] = {}
        self._queues = tuple(settings.queues)
        self._actor_names = tuple(sorted(self.actors))
        self._lease_s = settings.lock_lease.total_seconds()
        self._config_at = -1e9
        self._capped: dict[str, int] = {}
        self._fair: tuple[str, ...] = ()
        self._fifo: tuple[str, ...] = self._queues
        self._claim_cache: dict[tuple[Any, ...], Any] = {}
        self.claimed_total = 0
        self._reserved = 0

    # -- claiming -------------------------------------------------------------------

    def _stmt(
        self, queues: tuple[str, ...], actors: tuple[str, ...], limit: int, skip: bool
    ) -> Any:
        key = (queues, actors, limit, skip)
        stmt = self._claim_cache.get(key)
        if stmt is None:
            stmt = dq.claim_jobs(
                self.dialect,
                queues_=queues,
                actors=actors,
                limit=limit,
                skip_running_identities=skip,
            )
            if len(self._claim_cache) < 512:
                self._claim_cache[key] = stmt
        return stmt

    async def _refresh_config(self, conn: AsyncConnection) -> None:
        if time.monotonic() - self._config_at < _CONFIG_TTL_S:
            return
        capped = (await conn.execute(dq.capped_actor_config(self._actor_names))).all()
        self._capped = {row.actor: int(row.max_concurrent) for row in capped}
        modes = dict((await conn.execute(dq.queue_modes(self._queues))).all())
        self._fair = tuple(q for q in self._queues if modes.get(q) == "fair")
        self._fifo = tuple(q for q in self._queues if modes.get(q) != "fair")
        self._config_at = time.monotonic()

    def _groups(self, free: int, residual: dict[str, int]) -> list[tuple[Any, ...]]:
        uncapped = tuple(a for a in self._actor_names if a not in self._capped)
        groups: list[tuple[Any, ...]] = []
        # One statement per queue: each then walks the dispatch index in order and stops
        # at its limit (an IN list over queues would sort every ready row). Queues are
        # drained in the order the worker lists them.
        groups.extend(((queue,), uncapped, free, False) for queue in self._fifo if uncapped)
        if self._fair and uncapped:
            share = max(1, -(-free // len(uncapped)))
            groups.extend((self._fair, (a,), share, False) for a in uncapped)
        for actor, left in residual.items():
            if left > 0:
                groups.append((self._queues, (actor,), min(left, free), True))
        return groups

    async def claim(self, free: int) -> list[dict[str, Any]]:
        """Claim up to ``free`` jobs (one transaction; one statement on the fast path)."""
        params = {"worker_id": self.worker_id, "lease_s": self._lease_s}
        rows: list[dict[str, Any]] = []
        async with transaction(self.engine) as conn:
            await self._refresh_config(conn)
            residual: dict[str, int] = {}
            if self._capped:
                counts = dict((await conn.execute(dq.running_counts(tuple(self._capped)))).all())
                residual = {a: cap - int(counts.get(a, 0)) for a, cap in self._capped.items()}
            for queues, actors, limit, skip in self._groups(free, residual):
                left = free - len(rows)
                if left <= 0:
                    break
                stmt = self._stmt(queues, actors, min(limit, left), skip)
                result = await conn.execute(stmt, params)
                rows.extend(dict(r) for r in result.mappings())
        return rows

    async def run(self) -> None:
        """Claim and start jobs until :attr:`claiming` is switched off.

        With room for at least two full batches, two claim loops run so that one claim's
        round trip overlaps the next (their ``SKIP LOCKED`` scans never wait on each
        other). Slots are reserved before a claim, so the two never overfill the worker.
        """
        loops = 2 if self.settings.max_concurrency >= 2 * self.settings.claim_batch_size else 1
        await asyncio.gather(*(self._claim_loop(i) for i in range(loops)))

    async def _claim_loop(self, index: int) -> None:
        batch = self.settings.claim_batch_size
        poll = self.settings.poll_interval.total_seconds()
        backoff = 0.05
        while self.claiming:
            free = self.settings.max_concurrency - len(self.running) - self._reserved
            if free <= 0 or (index > 0 and self._capped):
                # A second loop would double-count the per-round max_concurrent residual.
                self.slot_freed.clear()
                await self._wait(self.slot_freed, None if index == 0 else poll)
                continue
            want = min(free, batch)
            self.wake.clear()
            self._reserved += want
            try:
                rows = await self.claim(want)
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                _log.warning("worker-claim-failed", error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            finally:
                self._reserved -= want
            backoff = 0.05
            if not self.claiming:
                # Shutdown began during the claim: run nothing, hand the rows back.
                for row in rows:
                    self._start(row, start=False)
                break
            for row in rows:
                self._start(row)
            if len(rows) < want:
                await self._wait(self.wake, poll)

    async def _wait(self, event: asyncio.Event, limit_s: float | None) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(limit_s):
                await event.wait()

    def stop_claiming(self) -> None:
        """Stop taking new work (shutdown); the loop exits at its next turn."""
        self.claiming = False
        self.wake.set()
        self.slot_freed.set()

    # -- running --------------------------------------------------------------------

    def _start(self, row: dict[str, Any], *, start: bool = True) -> None:
        ref = self.actors[row["actor"]]
        problem = decode_claimed(row)
        if ref.name in self.stored_ttl:
            row["_result_ttl_s"] = self.stored_ttl[ref.name]
        job = RunningJob(row=row, ref=ref, worker_id=self.worker_id)
        self.inflight[job.id] = job
        self.claimed_total += 1
        if problem is not None:  # fail this row unrun; the rest of the batch runs
            _log.error(
                "worker-job-undecodable", job_id=str(job.id), actor=ref.name, error=str(problem)
            )
            error_class = type(problem).__name__
            self.completer.submit(
                Outcome(job, "failed", "failed", error_class=error_class, error=str(problem))
            )
            return
        if not start:
            job.cancel_reason = "shutdown"
            self.completer.submit(
                Outcome(job, "release", "retried", error_class="WorkerShutdown", error="released")
            )
            return
        self.running[job.id] = job
        if self.on_start is not None:
            self.on_start(job)
        job.task = asyncio.get_running_loop().create_task(self._run_job(job))

    async def _run_job(self, job: RunningJob) -> None:
        try:
            with attempt_span(job.row, job.ref.name) as span:
                job.span = span
                outcome = await execute(job, self.env)
                mark_span(span, outcome.kind, outcome.error_class)
        except BaseException as exc:  # a bug in the worker itself: never lose the row
            _log.exception("worker-execute-crashed", job_id=str(job.id), actor=job.ref.name)
            outcome = Outcome(
                job, "release", "crashed", error_class=type(exc).__name__, error=str(exc)
            )
        finally:
            self.running.pop(job.id, None)
            self.slot_freed.set()
        if job.thread_alive():
            self.lingering.add(job)
            asyncio.get_running_loop().create_task(self._reap(job))
        if not job.detached:
            record_completed(job.ref.name, outcome.kind, time.monotonic() - job.claimed_mono)
            self.completer.submit(outcome)

    async def _reap(self, job: RunningJob) -> None:
        exited = job.thread_exited
        while job.thread_alive() and exited is not None:
            await exited.wait()
            exited.clear()
        self.lingering.discard(job)

    def detach(self, job: RunningJob) -> None:
        """Free the slot of an abandoned attempt (its task may keep running, unobserved)."""
        self.running.pop(job.id, None)
        if job.thread_alive():
            self.lingering.add(job)
            asyncio.get_running_loop().create_task(self._reap(job))
        self.slot_freed.set()

    def _written(self, outcome: Outcome) -> None:
        job = outcome.job
        if outcome.kind == "release" and outcome.hold_s is not None:
            self.held.add(job)
        current = self.inflight.get(job.id)
        if current is job:
            del self.inflight[job.id]

    async def close(self) -> None:
        """Shut the thread pool without waiting for threads that outlived their attempts."""
        self.executor.shutdown(wait=False, cancel_futures=True)
