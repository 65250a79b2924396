"""``worker_main``: boot a worker process, run its loops, and shut it down in phases.

Boot: register actor-declared rate-limit primitives and check that every name an actor
references is registered, sync ``actor_config`` (seed-only capacity fields) and the
actors' code schedules (``cron_schedules``), register the worker row, open the DI
container, set up queue caps and sync reservation slots. Run: the claim loop, the
completer, the heartbeat (with leader renewal), the cancel poll, the leader's sweep, the
cron ticks, the progress flush and, on Postgres, the LISTEN connection. Stop: see
:mod:`taskq.worker.shutdown`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import socket
import sys
import time
from collections.abc import Awaitable, Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any
from uuid import UUID

import structlog
from sqlalchemy.exc import DBAPIError, SQLAlchemyError
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import __version__
from taskq._ids import new_uuid
from taskq.actor import ActorRef, registered_actors
from taskq.actor_config_ops import sync_actor_config
from taskq.cron.sync import sync_schedules
from taskq.db.dialect import async_url, traits
from taskq.db.engine import make_engine, transaction, with_schema
from taskq.db.queries import worker as wq
from taskq.di import ProviderRegistry
from taskq.logs import LogFormat
from taskq.logs import configure_logging as _configure_logging
from taskq.settings import WorkerSettings
from taskq.telemetry import metrics_on
from taskq.worker.boot import retry_boot_step
from taskq.worker.cancel import CancelController
from taskq.worker.dependencies import Dependencies
from taskq.worker.dispatch import Dispatcher, run_sync_actor_tracked
from taskq.worker.execute import AttemptEnv
from taskq.worker.heartbeat import Heartbeat
from taskq.worker.leader import LeaderLease
from taskq.worker.notify import Listener
from taskq.worker.progress import Progress
from taskq.worker.queues import claimed_queues
from taskq.worker.resources import Limits, resolve_rate_limit_registry
from taskq.worker.shutdown import WATCHDOG_TAIL_S, Phase, ShutdownState, Watchdog, pause
from taskq.worker.state import AttemptOutcome, Outcome, OutcomeKind, RunningJob
from taskq.worker.subjobs import AutonomousCounter, SubJobs
from taskq.worker.sweep import Sweeper
from taskq.worker.telemetry import publish_queue_depth, watch_slots
from taskq.worker.transactions import JobTransactions

if TYPE_CHECKING:
    from taskq.backends.sql import SqlBackend

__all__ = ["EXIT_INTERNAL_ERROR", "Worker", "configure_logging", "resolve_actors", "worker_main"]

_log = structlog.get_logger("taskq.worker")
_CANCEL_POLL_S = 0.5
_LOOP_STOP_MIN_S = 1.0
"""The least time the teardown gives the background loops to end their round."""
EXIT_INTERNAL_ERROR = 3
"""The exit code of a worker that shut down because one of its own loops crashed (a bug,
not a signal): a supervisor restarting on failure restarts it. A clean stop exits 0."""


def resolve_actors(
    actor_registry: Mapping[str, ActorRef[Any, Any]] | Iterable[ActorRef[Any, Any]] | None,
) -> dict[str, ActorRef[Any, Any]]:
    """The worker's actors by name: a mapping, an iterable of refs, or (``None``) every
    actor imported in this process."""
    if actor_registry is None:
        return registered_actors()
    if isinstance(actor_registry, Mapping):
        refs = list(actor_registry.values())
    else:
        refs = list(actor_registry)
    out: dict[str, ActorRef[Any, Any]] = {}
    for ref in refs:
        if not isinstance(ref, ActorRef):
            raise TypeError(f"actor registry entries must be ActorRef objects, got {ref!r}")
        out[ref.name] = ref
    return out


class Worker:
    """One worker process's runtime (``await Worker(...).run()`` returns its exit code).

    The rate-limit registry is ``rate_limit_registry``, or a ``RateLimitRegistry`` value
    provider at ``Scope.LOOP`` in ``di_registry`` (equivalent; giving both, or any other
    kind of provider, raises ``TypeError``), or else the module-level default.

    ``hard_exit`` (the default) lets the worker end its process: ``os._exit`` when
    executor threads outlive the shutdown, and the watchdog that ends it when the shutdown
    overruns ``termination_grace_period``. ``False`` is for a worker running inside a
    process that owns its own exit (a test, an embedding application): neither happens,
    and an overrun shows as ``run()`` not returning.
    """

    def __init__(
        self,
        *,
        settings: WorkerSettings,
        actors: Mapping[str, ActorRef[Any, Any]],
        rate_limit_registry: Any = None,
        di_registry: ProviderRegistry | None = None,
        engine: AsyncEngine | None = None,
        hard_exit: bool = True,
    ) -> None:
        if not actors:
            raise ValueError("a worker needs at least one actor")
        # Before anything is built: a bad DI registration is a TypeError at construction.
        rl_registry = resolve_rate_limit_registry(rate_limit_registry, di_registry)
        # No TASKQ_QUEUES/-q: the actors' queues; an explicit list missing one is warned.
        self.settings = settings = claimed_queues(settings, actors)
        self.hard_exit = hard_exit
        self.actors = dict(actors)
        self.worker_id: UUID = new_uuid()
        self.state = ShutdownState()
        self._own_engine = engine is None
        self._sub_job_backend: SqlBackend | None = None
        self.transactions: JobTransactions | None = None
        """The job transactions (see :mod:`taskq.worker.transactions`), if enabled."""
        self._registered = False
        # A user's engine gets the settings' schema (TASKQ_SCHEMA_NAME) applied here.
        self.engine = (
            with_schema(engine, settings=settings)
            if engine is not None
            else make_engine(settings.effective_database_url, settings=settings)
        )
        self.limits = Limits(
            self.engine,
            settings,
            self.worker_id,
            rl_registry,
        )
        self.deps = Dependencies(di_registry)
        self.progress = Progress(
            self.engine,
            self.worker_id,
            max_bytes=settings.progress_data_max_bytes,
            redis_url=settings.redis_url,
            timeout_s=settings.rate_limit_redis_timeout.total_seconds(),
            cooldown_s=settings.rate_limit_redis_cooldown.total_seconds(),
            log_interval_s=settings.outage_log_interval.total_seconds(),
        )
        self._changed = asyncio.Event()
        self._tasks: list[asyncio.Task[None]] = []
        self._loops: list[asyncio.Task[None]] = []
        """The background loops that return on ``_stopping`` (all but the listener)."""
        self._stopping = asyncio.Event()
        self._ticking_stops = asyncio.Event()
        """Set when the shutdown begins: the cron loop enqueues no tick after that (a
        draining worker runs nothing more, and the ticks that fall due meanwhile are the
        next worker's to catch up within the schedule's ``max_catchup``)."""
        self.crashed: str | None = None
        """The loop whose crash started the shutdown (the exit code is then
        :data:`EXIT_INTERNAL_ERROR`), or ``None``."""
        self._log = _log.bind(worker_id=str(self.worker_id))
        self.wake = asyncio.Event()
        s = settings
        self.dispatcher = Dispatcher(
            engine=self.engine,
            settings=s,
            worker_id=self.worker_id,
            actors=self.actors,
            env_factory=self._env,
            wake=self.wake,
        )
        watch_slots(self, lambda: self.limits.held_slots(tuple(self.dispatcher.inflight)))
        if self.progress.publishing:  # progress-stream state events (Redis only)
            self.dispatcher.on_start = self.progress.running
            self.dispatcher.completer.on_event = self.progress.ended
        self.leader = LeaderLease(self.engine, self.worker_id, s.lock_lease.total_seconds())
        self.sweeper = Sweeper(self.engine, self.actors)
        self.canceller = CancelController(
            self.engine,
            self.worker_id,
            cancellation_grace_s=s.cancellation_grace_period.total_seconds(),
            cleanup_grace_s=s.cleanup_grace_period.total_seconds(),
            submit=self._abandon,
        )
        self.heartbeat = Heartbeat(
            self.engine,
            self.dispatcher,
            worker_id=self.worker_id,
            interval_s=s.heartbeat_interval.total_seconds(),
            lease_s=s.lock_lease.total_seconds(),
            grace_s=(s.cancellation_grace_period + s.cleanup_grace_period).total_seconds() + 1.0,
            renew_slots=any(ref.reservations for ref in self.actors.values()),
            limits=self.limits,
            after_beat=self._after_beat,
        )

    # -- wiring ---------------------------------------------------------------------

    def _env(self, dispatcher: Dispatcher) -> AttemptEnv:
        return AttemptEnv(
            run_sync=lambda job, call: run_sync_actor_tracked(job, call, dispatcher.executor),
            dependencies=self.deps.scope,
            thread_kwargs=self.deps.thread_kwargs,
            acquire=None,
            release=None,
            progress_sink=self.progress.sink,
            sub_jobs=self._sub_jobs(),
            default_start_to_close=self.settings.default_start_to_close,
            lock_lease_s=self.settings.lock_lease.total_seconds(),
            hold_s=self._hold_s,
            transactions=self._transactions(dispatcher),
        )

    def _transactions(self, dispatcher: Dispatcher) -> JobTransactions | None:
        """The job transactions, when an ``AsyncConnection`` is registered at ``Scope.LOOP``."""
        if not self.deps.loop_connection:
            return None
        self.transactions = JobTransactions(
            engine=self.engine,
            settings=self.settings,
            loop_connection=self.deps.loop_connection_instance,
            completer=dispatcher.completer,
        )
        return self.transactions

    def _sub_jobs(self) -> Callable[[RunningJob], SubJobs]:
        from taskq.backends.held import held_connections_cap
        from taskq.backends.sql import SqlBackend
        from taskq.client import JobsClient

        self._sub_job_backend = SqlBackend(
            self.engine,
            settings=self.settings,
            held_connections=held_connections_cap(self.engine),
        )
        client = JobsClient(self._sub_job_backend)
        loop_conn = self.deps.loop_connection
        counter = AutonomousCounter(
            reason="sync actor" if loop_conn else "no AsyncConnection registered at Scope.LOOP"
        )

        def make(job: RunningJob) -> SubJobs:
            # Sync actors run in a thread, where the LOOP connection is unusable.
            return SubJobs(
                client,
                job.id,
                parent_actor=job.ref.name,
                transactional=loop_conn and not job.ref.is_sync,
                counter=counter,
            )

        return make

    def _hold_s(self) -> float:
        s = self.settings
        started = self.state.started_mono or time.monotonic()
        left = s.termination_grace_period.total_seconds() - (time.monotonic() - started)
        return max(0.0, min(left + WATCHDOG_TAIL_S, s.lock_lease.total_seconds()))

    def _abandon(self, outcome: Outcome) -> None:
        self.dispatcher.detach(outcome.job)
        self.dispatcher.completer.submit(outcome)

    async def _after_beat(self) -> None:
        if self.state.phase < Phase.CANCELLING:
            await self.leader.renew()

    # -- boot -----------------------------------------------------------------------

    async def _boot(self) -> bool:
        """Register, open the container and the limits; ``False`` if a signal came first.

        The database steps wait out a connection failure (see :mod:`.boot`).
        """
        s = self.settings
        step = functools.partial(
            retry_boot_step,
            timeout_s=s.boot_retry_timeout.total_seconds(),
            stop=self.state.requested,
            log=self._log,
        )
        # In process, before any store write: a dependency with no provider or a name no
        # registry holds fails the boot at once (not a connection failure, so never
        # retried) and leaves no worker row.
        self.deps.open(self.actors.values())
        if not await step("rate-limit-names", self._prepare_limits):
            return False
        if not await step("register", self._register):
            return False
        if not await step("rate-limits", lambda: self.limits.boot(self.actors.values())):
            return False
        if self.limits.active:
            self.dispatcher.enable_limits(self.limits)
            self.heartbeat.renew_slots = True
        self._log.info(
            "worker-started",
            queues=list(s.queues),
            concurrency=s.max_concurrency,
            actors=sorted(self.actors),
            pid=os.getpid(),
        )
        return True

    async def _prepare_limits(self) -> None:
        self.limits.prepare(self.actors.values())

    async def _register(self) -> None:
        """Sync ``actor_config`` and insert this worker's row, in one transaction."""
        s = self.settings
        async with transaction(self.engine) as conn:
            rows = await sync_actor_config(conn, self.actors.values())
            await sync_schedules(conn, self.actors.values())
            await conn.execute(
                wq.register_worker(
                    self.engine.dialect.name,
                    worker_id=self.worker_id,
                    hostname=socket.gethostname(),
                    pid=os.getpid(),
                    queues_=list(s.queues),
                    concurrency=s.max_concurrency,
                    version=__version__,
                )
            )
        self.dispatcher.stored_ttl = {
            row.actor: row.result_ttl.total_seconds() if row.result_ttl is not None else None
            for row in rows
        }
        self._registered = True

    # -- loops ----------------------------------------------------------------------

    # Each loop returns at its pause once ``_stopping`` is set, never inside a round (see
    # :mod:`.shutdown` for what cancelling one inside its transaction does on SQLite).

    async def _cancel_loop(self) -> None:
        while True:
            try:
                await self.canceller.poll(self.dispatcher.running)
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                self._log.warning("worker-cancel-poll-failed", error=str(exc))
            if not await pause(self._stopping, _CANCEL_POLL_S):
                return

    async def _sweep_loop(self) -> None:
        interval = self.settings.sweep_interval.total_seconds()
        while await pause(self._stopping, interval):
            self.limits.evict_idle()
            if not self.leader.is_leader:
                publish_queue_depth(self, None)
                continue
            try:
                await self.sweeper.run_once()
                if metrics_on():
                    publish_queue_depth(self, await self.sweeper.queue_depth())
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                self._log.warning("worker-sweep-failed", error=str(exc))

    async def _cron_loop(self) -> None:
        """Enqueue the due ticks of this worker's actors' schedules (:mod:`taskq.cron.ticker`):
        every worker runs it and the database arbitrates, so a tick is enqueued once
        fleet-wide and no election gap delays one."""
        from taskq.backends.sql import SqlBackend
        from taskq.client import JobsClient
        from taskq.cron.ticker import POLL_S, Ticker

        client = JobsClient(SqlBackend(self.engine, settings=self.settings))
        ticker = Ticker(self.engine, client, self.actors)  # on the store's clock
        while True:
            wake = None
            started = time.monotonic()
            try:
                wake = await ticker.run_once()
            except (DBAPIError, SQLAlchemyError, OSError) as exc:
                self._log.warning("worker-cron-failed", error=str(exc))
            delay = POLL_S
            if wake is not None and ticker.now is not None:
                # Until the next tick, by the clock the round read, less the round's own time.
                left = (wake - ticker.now).total_seconds() - (time.monotonic() - started)
                delay = min(POLL_S, max(0.05, left))
            if not await pause(self._ticking_stops, delay):
                return

    async def _progress_loop(self) -> None:
        interval = self.settings.progress_flush_interval.total_seconds()
        while await pause(self._stopping, interval):
            await self.progress.flush(list(self.dispatcher.running.values()))

    def _spawn(self, coro: Awaitable[None], name: str, *, stoppable: bool = True) -> None:
        """Run a background loop; ``stoppable``: it returns on ``_stopping`` (else it is
        cancelled at the teardown: the listener, which holds no transaction)."""
        task = asyncio.ensure_future(coro)
        task.set_name(name)
        task.add_done_callback(self._loop_ended)
        self._tasks.append(task)
        if stoppable:
            self._loops.append(task)

    def _loop_ended(self, task: asyncio.Task[None]) -> None:
        """A background loop that ends by raising, other than at the teardown, is a crash
        of the worker itself: shut down and exit :data:`EXIT_INTERNAL_ERROR`."""
        if task.cancelled() or self._stopping.is_set() or task.exception() is None:
            return
        self._log.error("worker-loop-crashed", loop=task.get_name(), error=repr(task.exception()))
        self._crash(task.get_name())

    def _crash(self, where: str) -> None:
        if self.crashed is None:
            self.crashed = where
        self.state.signal("internal-error")

    # -- life cycle -----------------------------------------------------------------

    def install_signals(self) -> None:
        """Route SIGTERM/SIGINT to the shutdown state (first starts it, later ones escalate);
        SIGCONT (resumed after a stop) to :meth:`Heartbeat.isolate_lapsed`."""
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, self.state.signal, sig.name)
        # Resumed after SIGSTOP: stop the jobs whose leases lapsed during the freeze
        # before their own callbacks (timers that came due meanwhile) run.
        loop.add_signal_handler(signal.SIGCONT, self.heartbeat.isolate_lapsed, "resumed")

    async def run(self) -> int:
        """Boot, run until a shutdown signal, shut down; returns the process exit code."""
        if not await self._boot():
            self.state.enter(Phase.STOPPED)
            await self._teardown()
            self._log.info("worker-stopped-during-boot")
            return 0
        url = self.engine.url
        if traits(self.engine.dialect.name).notify:
            listener = Listener(
                async_url(url),
                self.settings.schema_name,
                self.settings.queues,
                self.wake,
                on_slot=self.dispatcher.slot_freed_elsewhere,
            )
            self._spawn(listener.run(), "listen", stoppable=False)
        self._spawn(self.dispatcher.completer.run(), "complete")
        self._spawn(self.heartbeat.run(self._stopping), "heartbeat")
        self._spawn(self._cancel_loop(), "cancel")
        self._spawn(self._sweep_loop(), "sweep")
        self._spawn(self._progress_loop(), "progress")
        self._spawn(self._cron_loop(), "cron")
        claim = asyncio.ensure_future(self.dispatcher.run())
        stop = asyncio.ensure_future(self.state.requested.wait())
        await asyncio.wait([claim, stop], return_when=asyncio.FIRST_COMPLETED)
        if claim.done() and claim.exception() is not None:
            self._log.error("worker-claim-loop-crashed", error=repr(claim.exception()))
            self._crash("claim")
        return await self.shutdown(claim)

    def _changed_cb(self, *_: Any) -> None:
        self._changed.set()

    async def shutdown(self, claim: asyncio.Task[None]) -> int:
        """Walk the shutdown phases and return the exit code (see :mod:`.shutdown`)."""
        s = self.settings
        d = self.dispatcher
        watchdog = Watchdog(
            s.termination_grace_period.total_seconds() + WATCHDOG_TAIL_S,
            lambda: "tracked-actor-outlived-teardown" if d.lingering else "teardown-overran",
        )
        if self.hard_exit:
            watchdog.start()
        self.state.enter(Phase.DRAINING)
        self.heartbeat.status = "stopping"
        d.stop_claiming()
        self._ticking_stops.set()
        with contextlib.suppress(BaseException):
            await claim
        for job in d.running.values():
            if job.task is not None:
                job.task.add_done_callback(self._changed_cb)

        self.state.enter(Phase.CANCELLING)
        for job in list(d.running.values()):
            job.request_cancel("shutdown")
        await self.state.wait_phase(
            lambda: not d.running, s.cancellation_grace_period.total_seconds(), self._changed
        )

        self.state.enter(Phase.FORCING)
        for job in list(d.running.values()):
            job.force_cancel()
        await self.state.wait_phase(
            lambda: not d.running, s.cleanup_grace_period.total_seconds(), self._changed
        )

        self.state.enter(Phase.RELEASING)
        for job in list(d.running.values()):
            # The task would not even unwind: release its row held, like a live thread.
            job.detached = True
            d.detach(job)
            d.completer.submit(
                Outcome(
                    job,
                    OutcomeKind.RELEASE,
                    AttemptOutcome.RETRIED,
                    error_class="WorkerShutdown",
                    error="released",
                    hold_s=self._hold_s(),
                )
            )
        await self._drain_completer(watchdog_s=self._hold_s())
        await self._await_threads()
        await self._teardown()
        alive = bool(d.lingering)
        self.state.enter(Phase.STOPPED)
        code = 0 if self.crashed is None else EXIT_INTERNAL_ERROR
        self._log.info("worker-stopped", lingering_threads=len(d.lingering), exit_code=code)
        if alive and self.hard_exit:
            # A sync actor's thread cannot be killed. The watchdog stays armed until every
            # tracked thread is reaped: a thread that ends before its deadline lets the
            # process exit 0; one that outlives it trips the watchdog (``os._exit`` with
            # ``WATCHDOG_EXIT_CODE``, reason ``tracked-actor-outlived-teardown``). Its job
            # row was released held, so no other worker runs it meanwhile.
            self._log.warning("worker-awaiting-threads", lingering_threads=len(d.lingering))
            for job in list(d.lingering):
                exited = job.thread_exited
                while job.thread_alive() and exited is not None:
                    await exited.wait()
                    exited.clear()
            self._log.info("worker-threads-reaped")
            watchdog.disarm()
            # Executor threads are non-daemon: the exit must not wait on the idle pool.
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
        watchdog.disarm()
        return code

    async def _drain_completer(self, watchdog_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(max(1.0, watchdog_s)):
                await self.dispatcher.completer.drained()

    async def _await_threads(self) -> None:
        d = self.dispatcher
        unhold = wq.unhold_job(self.engine.dialect.name)
        started = self.state.started_mono or time.monotonic()
        deadline = started + self.settings.termination_grace_period.total_seconds()
        # Deliberately deaf to further signals: a running actor thread is waited out (up
        # to the termination grace), never cut short by a third signal.
        while d.held and time.monotonic() < deadline:
            exited = [j for j in list(d.held) if not j.thread_alive()]
            for job in exited:
                d.held.discard(job)
                with contextlib.suppress(DBAPIError, SQLAlchemyError, OSError):
                    async with transaction(self.engine) as conn:
                        await conn.execute(unhold, {"b_id": job.id, "b_attempt": job.attempt})
            if d.held:
                await asyncio.sleep(0.05)

    async def _stop_loops(self) -> None:
        """End the background loops between two rounds; cancel what is left at the deadline.

        A loop is never cancelled inside its round when it can be helped: on SQLite a
        task cancelled while its statement runs leaves the write lock held by a closed
        connection, and the writes below would queue behind it for the busy timeout
        (see :mod:`.shutdown`). A round normally ends in milliseconds; one still busy
        when the termination grace runs out (at least ``_LOOP_STOP_MIN_S``) is cancelled.
        """
        self._stopping.set()
        self._ticking_stops.set()
        self.dispatcher.completer.stop()
        for task in self._tasks:
            if task not in self._loops:
                task.cancel()
        started = self.state.started_mono or time.monotonic()
        left = started + self.settings.termination_grace_period.total_seconds() - time.monotonic()
        if self._loops:
            _, busy = await asyncio.wait(self._loops, timeout=max(_LOOP_STOP_MIN_S, left))
            for task in busy:
                self._log.warning("worker-loop-cancelled", loop=task.get_name())
                task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)

    async def _teardown(self) -> None:
        await self._stop_loops()
        with contextlib.suppress(DBAPIError, SQLAlchemyError, OSError):
            await self.leader.release()
            if self._registered:
                async with transaction(self.engine) as conn:
                    await conn.execute(wq.finish_worker(self.engine.dialect.name, self.worker_id))
        await self.dispatcher.completer.wait_hooks(1.0)
        if self.transactions is not None:  # the slot pool, before the LOOP connection
            await self.transactions.close()
        await self.deps.close()
        await self.dispatcher.close()
        watch_slots(self, None)
        await self.limits.close()
        with contextlib.suppress(Exception):
            await self.progress.close()
        if self._sub_job_backend is not None:  # its held connections, before dispose
            await self._sub_job_backend.aclose()
        if self._own_engine:
            await self.engine.dispose()


def configure_logging(level: str, fmt: LogFormat = "auto") -> None:
    """The worker's logging (:func:`taskq.logs.configure_logging`)."""
    _configure_logging(level, fmt)


def worker_main(
    *,
    settings: WorkerSettings | None = None,
    actor_registry: Mapping[str, ActorRef[Any, Any]] | Iterable[ActorRef[Any, Any]] | None = None,
    rate_limit_registry: Any = None,
    di_registry: ProviderRegistry | None = None,
) -> int:
    """Run a worker in this process until SIGTERM/SIGINT; returns the exit code.

    ``actor_registry`` maps names to actors (or lists them); ``None`` means every actor
    imported in this process. ``settings`` defaults to ``WorkerSettings.load()``.
    ``rate_limit_registry`` may instead come from ``di_registry`` as a ``RateLimitRegistry``
    value provider at ``Scope.LOOP`` (see :class:`Worker`).
    """
    resolved = settings or WorkerSettings.load()
    actors = resolve_actors(actor_registry)
    configure_logging(resolved.log_level, resolved.log_format)

    async def main() -> int:
        worker = Worker(
            settings=resolved,
            actors=actors,
            rate_limit_registry=rate_limit_registry,
            di_registry=di_registry,
        )
        worker.install_signals()
        return await worker.run()

    return asyncio.run(main())
