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
from typing import TYPE_CHECKING, Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef
from taskq.db.engine import transaction
from taskq.db.queries import dispatch as dq
from taskq.settings import WorkerSettings
from taskq.worker.claimed import ClaimedJob
from taskq.worker.execute import AttemptEnv, execute
from taskq.worker.outcomes import Completer
from taskq.worker.state import AttemptOutcome, Outcome, OutcomeKind, RunningJob
from taskq.worker.telemetry import (
    claim_started,
    mark_span,
    process_span,
    record_received,
)
from taskq.worker.waiting import Gatekeeper, Plan, SlotLost

if TYPE_CHECKING:
    from taskq.worker.resources import Limits

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
        self._unique = frozenset(a for a, ref in self.actors.items() if ref.unique_for is not None)
        """Actors declaring ``unique_for``: claimed with the ``running_identities``
        backstop (a job whose identity already runs is left for later), in statements
        of their own so the other actors' claim carries no extra predicate."""
        self._lease_s = settings.lock_lease.total_seconds()
        self._config_at = -1e9
        self._capped: dict[str, int] = {}
        self._fair: tuple[str, ...] = ()
        self._fifo: tuple[str, ...] = self._queues
        self._claim_cache: dict[tuple[Any, ...], Any] = {}
        self.claimed_total = 0
        self._reserved = 0
        self._woken_by_release = False
        self._others_empty_at: float | None = None
        """When the claim last found nothing for the actors without limits: until a wake
        or a poll interval later, rounds a rate limit's timer starts claim only the
        throttled actors (not one more scan past their backlog for the others)."""
        self._hand_over: asyncio.Task[None] | None = None
        self.gate: Gatekeeper | None = None
        """The limits' side of dispatch (:mod:`taskq.worker.waiting`), once the boot set
        up rate limits, reservations or queue caps."""

    def enable_limits(self, limits: Limits) -> None:
        """Dispatch through the limits: claims planned by their gates, jobs admitted (or
        parked) before they start, slots released through :meth:`Limits.release`."""
        gate = Gatekeeper(self.engine, limits, self.actors, self.worker_id, self._queues)
        gate.poll_s = self.settings.poll_interval.total_seconds()
        self.gate = gate
        gate.claiming = lambda: self.claiming
        limits.on_release = self._released
        limits.keep = gate.keep
        self.env.acquire = gate.take
        self.env.release = gate.release

    def slot_freed_elsewhere(self, name: str) -> None:
        """A NOTIFY said a slot of static reservation ``name`` was released (by any
        worker): a gate that found it full opens, and the claim loop comes round."""
        if self.gate is not None and name in self.gate.admission.slot_gates:
            self.gate.admission.seen_free([name])
            self._released([])

    def _released(self, names: list[str]) -> None:
        if self.gate is not None:
            for name in names:
                self.gate.admission.released_slot(name)
            if self._hand_over is None and self.claiming and self.gate.admission.kept_actors():
                self._hand_over = asyncio.get_running_loop().create_task(self._hand_over_round())
                if not names:
                    return  # only kept slots: the hand-over claims for them
        if not self.wake.is_set():
            self._woken_by_release = True  # room for a throttled actor, not new work
        self.wake.set()

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

    def _groups(
        self, free: int, residual: dict[str, int], plan: Plan | None
    ) -> list[tuple[Any, ...]]:
        gate = self.gate
        queues = self._queues if plan is None else plan.queues
        fifo = tuple(q for q in self._fifo if q in queues)
        fair = tuple(q for q in self._fair if q in queues)
        groups: list[tuple[Any, ...]] = []
        if plan is not None:
            # Throttled actors first, each at most what its limits admit (paid already).
            for actor, limit in plan.limits.items():
                cap = residual.get(actor)
                n = limit if cap is None else min(limit, cap)
                if n > 0:
                    groups.append((queues, (actor,), n, cap is not None or actor in self._unique))
            if plan.hand_over or self._skip_others():
                return groups
        free_actors = tuple(
            a
            for a in self._actor_names
            if a not in self._capped and (gate is None or not gate.throttled(a))
        )
        uncapped = tuple(a for a in free_actors if a not in self._unique)
        unique = tuple(a for a in free_actors if a in self._unique)
        # One statement per queue: each then walks the dispatch index in order and stops
        # at its limit (an IN list over queues would sort every ready row). Queues are
        # drained in the order the worker lists them.
        for queue in fifo if free_actors else ():
            room = int(min(free, plan.room.get(queue, free) if plan is not None else free))
            if uncapped:
                groups.append(((queue,), uncapped, room, False))
            if unique:
                groups.append(((queue,), unique, room, True))
        if fair and free_actors:
            share = max(1, -(-free // len(free_actors)))
            groups.extend((fair, (a,), share, a in self._unique) for a in free_actors)
        for actor, left in residual.items():
            if left > 0 and (gate is None or not gate.throttled(actor)):
                groups.append((queues, (actor,), min(left, free), True))
        return groups

    def _skip_others(self) -> bool:
        """True while the actors without limits were found empty less than a poll
        interval ago (and nothing woke the loop since)."""
        empty_at = self._others_empty_at
        poll = self.settings.poll_interval.total_seconds()
        return empty_at is not None and time.monotonic() - empty_at < poll

    async def claim(self, free: int, *, hand_over: bool = False) -> list[ClaimedJob]:
        """Claim up to ``free`` jobs (one transaction; one statement on the fast path).

        With limits, the round is planned first (:meth:`Gatekeeper.plan`: actors their
        limits hold back are left out, the others' tokens are paid) and the tokens of
        jobs the claim did not find are refunded after it. ``hand_over``: claim only for
        the slots kept from jobs that just ended (:meth:`Gatekeeper.plan_hand_over`).
        """
        params = {"worker_id": self.worker_id, "lease_s": self._lease_s}
        rows: list[ClaimedJob] = []
        plan: Plan | None = None
        if self.gate is not None:
            plan = await (self.gate.plan_hand_over(free) if hand_over else self.gate.plan(free))
        if plan is not None and plan.hand_over and not plan.limits:
            await self.gate.settle(plan, rows)  # type: ignore[union-attr]
            return rows
        try:
            if plan is not None and (not plan.queues or (not plan.limits and self._skip_others())):
                return rows  # nothing this round could claim: no transaction at all
            async with transaction(self.engine) as conn:
                await self._refresh_config(conn)
                residual: dict[str, int] = {}
                if self._capped:
                    counts = dict(
                        (await conn.execute(dq.running_counts(tuple(self._capped)))).all()
                    )
                    residual = {a: cap - int(counts.get(a, 0)) for a, cap in self._capped.items()}
                groups = self._groups(free, residual, plan)
                others = 0
                for queues, actors, limit, skip in groups:
                    left = free - len(rows)
                    if left <= 0:
                        break
                    planned = plan is not None and len(actors) == 1 and actors[0] in plan.limits
                    if planned and plan is not None and self.gate is not None:
                        limit = await self.gate.take_slots(conn, plan, actors[0], limit)
                    if limit <= 0:
                        continue
                    stmt = self._stmt(queues, actors, min(limit, left), skip)
                    result = await conn.execute(stmt, params)
                    found = [ClaimedJob.from_row(r) for r in result.mappings()]
                    others += 0 if planned else len(found)
                    rows.extend(found)
                if plan is not None and any(
                    not (len(a) == 1 and a[0] in plan.limits) for _, a, _, _ in groups
                ):
                    self._others_empty_at = time.monotonic() if others == 0 else None
                if plan is not None and plan.paid and self.gate is not None:
                    await self.gate.assign(conn, plan, rows)
        except BaseException:
            if self.gate is not None:
                # The claim rolled back: nothing taken for its rows was used.
                await self.gate.drop(rows)
            rows.clear()
            raise
        finally:
            if plan is not None and self.gate is not None:
                await self.gate.settle(plan, rows)
        return rows

    async def _hand_over_round(self) -> None:
        """Claim at once for the slots kept from jobs that just ended, beside the claim
        loop (which may be in a round of its own): the job that ended still counts in
        :attr:`running` until its task ends, so its successor takes its place."""
        try:
            room = self.settings.max_concurrency - len(self.running) - self._reserved + 1
            if room <= 0 or not self.claiming:
                self.wake.set()  # the claim loop uses or releases what was kept
                return
            self._reserved += 1
            started = claim_started()
            try:
                rows = await self.claim(1, hand_over=True)
            except (DBAPIError, SQLAlchemyError, OSError, SlotLost) as exc:
                # What was kept is released by the claim loop's next round.
                _log.warning("worker-claim-failed", error=str(exc), retry_in=0)
                self.wake.set()
                return
            finally:
                self._reserved -= 1
            record_received(self._queues, rows, started)
            if not rows:
                self.wake.set()  # nothing for the kept slots: the claim loop looks wider
            await self._start_claimed(rows)
        finally:
            self._hand_over = None

    async def _start_claimed(self, rows: list[ClaimedJob]) -> None:
        """Admit and start claimed rows (hand them back when shutdown began meanwhile)."""
        if not self.claiming:
            if self.gate is not None:
                await self.gate.drop(rows)
            for row in rows:
                self._start(row, start=False)
            return
        jobs = [self._job(row) for row in rows]
        if self.gate is not None:
            jobs = await self._admit(jobs)
        for job in jobs:
            self._start_job(job)

    async def run(self) -> None:
        """Claim and start jobs until :attr:`claiming` is switched off.

        With room for at least two full batches, two claim loops run so that one claim's
        round trip overlaps the next (their ``SKIP LOCKED`` scans never wait on each
        other). Slots are reserved before a claim, so the two never overfill the worker.
        """
        loops = 2 if self.settings.max_concurrency >= 2 * self.settings.claim_batch_size else 1
        try:
            await asyncio.gather(*(self._claim_loop(i) for i in range(loops)))
        finally:
            if self._hand_over is not None:  # it hands its rows back: claiming is off
                await asyncio.gather(self._hand_over, return_exceptions=True)
            if self.gate is not None:
                # Slots kept for a claim that will not come: free them for other workers.
                with contextlib.suppress(Exception):
                    await self.gate.release_kept()

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
            if self.wake.is_set() and not self._woken_by_release:
                self._others_empty_at = None  # a NOTIFY (new work): look at everything
                if self.gate is not None:
                    self.gate.new_work()
            self._woken_by_release = False
            self.wake.clear()
            self._reserved += want
            started = claim_started()
            try:
                rows = await self.claim(want)
            except (DBAPIError, SQLAlchemyError, OSError, SlotLost) as exc:
                _log.warning("worker-claim-failed", error=str(exc), retry_in=backoff)
                await asyncio.sleep(backoff)
                backoff = min(backoff * 2, 2.0)
                continue
            finally:
                self._reserved -= want
            backoff = 0.05
            record_received(self._queues, rows, started)
            if not self.claiming:
                # Shutdown began during the claim: run nothing, hand the rows back.
                if self.gate is not None:
                    await self.gate.drop(rows)
                for row in rows:
                    self._start(row, start=False)
                break
            claimed = len(rows)
            jobs = [self._job(row) for row in rows]
            if self.gate is not None:
                jobs = await self._admit(jobs)
            for job in jobs:
                self._start_job(job)
            if claimed < want:
                await self._wait(self.wake, self._wait_s(poll))

    def _wait_s(self, poll: float) -> float:
        if self.gate is None:
            return poll
        return self.gate.wait_s(poll, self.settings.max_concurrency - len(self.running))

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

    def _job(self, claimed: ClaimedJob) -> RunningJob:
        ref = self.actors[claimed.actor]
        name = ref.name
        if name in self.stored_ttl:
            claimed.result_ttl_s = self.stored_ttl[name]
        elif ref.result_ttl is not None:
            claimed.result_ttl_s = ref.result_ttl.total_seconds()
        return RunningJob(claimed=claimed, ref=ref, worker_id=self.worker_id)

    async def _admit(self, jobs: list[RunningJob]) -> list[RunningJob]:
        """Acquire each job's per-job limits; the denied ones are parked, not started."""
        gate = self.gate
        if gate is None:
            return jobs
        needy = [
            job for job in jobs if job.claimed.undecodable is None and gate.needs_admission(job)
        ]
        if not needy:
            return jobs
        admitted = {id(job) for job in await gate.admit(needy)}
        needy_ids = {id(job) for job in needy}
        return [job for job in jobs if id(job) not in needy_ids or id(job) in admitted]

    def _start(self, claimed: ClaimedJob, *, start: bool = True) -> None:
        self._start_job(self._job(claimed), start=start)

    def _start_job(self, job: RunningJob, *, start: bool = True) -> None:
        self.inflight[job.id] = job
        self.claimed_total += 1
        problem = job.claimed.undecodable
        if problem is not None:  # fail this row unrun; the rest of the batch runs
            _log.error(
                "worker-job-undecodable",
                job_id=str(job.id),
                actor=job.ref.name,
                error=str(problem),
            )
            error_class = type(problem).__name__
            self.completer.submit(
                Outcome(
                    job,
                    OutcomeKind.FAILED,
                    AttemptOutcome.FAILED,
                    error_class=error_class,
                    error=str(problem),
                )
            )
            return
        if not start:
            job.cancel_reason = "shutdown"
            self.completer.submit(
                Outcome(
                    job,
                    OutcomeKind.RELEASE,
                    AttemptOutcome.RETRIED,
                    error_class="WorkerShutdown",
                    error="released",
                )
            )
            return
        self.running[job.id] = job
        if self.on_start is not None:
            self.on_start(job)
        job.task = asyncio.get_running_loop().create_task(self._run_job(job))

    async def _run_job(self, job: RunningJob) -> None:
        try:
            link = self.settings.otel_process_parent == "link"
            with process_span(job.claimed, job.ref.name, link=link) as span:
                job.span = span
                outcome = await execute(job, self.env)
                mark_span(span, outcome.kind, outcome.error_class)
        except BaseException as exc:  # a bug in the worker itself: never lose the row
            _log.exception("worker-execute-crashed", job_id=str(job.id), actor=job.ref.name)
            outcome = Outcome(
                job,
                OutcomeKind.RELEASE,
                AttemptOutcome.CRASHED,
                error_class=type(exc).__name__,
                error=str(exc),
            )
        finally:
            if self.gate is not None:
                # An attempt that ended before its acquire leaves what admission took.
                with contextlib.suppress(Exception):
                    await self.gate.abandon(job)
            self.running.pop(job.id, None)
            self.slot_freed.set()
        if job.thread_alive():
            self.lingering.add(job)
            asyncio.get_running_loop().create_task(self._reap(job))
        if not job.detached:
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
        if outcome.kind == OutcomeKind.RELEASE and outcome.hold_s is not None:
            self.held.add(job)
        current = self.inflight.get(job.id)
        if current is job:
            del self.inflight[job.id]

    async def close(self) -> None:
        """Shut the thread pool without waiting for threads that outlived their attempts."""
        self.executor.shutdown(wait=False, cancel_futures=True)
