"""The job's transaction: the actor's writes, its sub-jobs and the terminal write, together.

When an ``AsyncConnection`` is registered at ``Scope.LOOP`` (the activation signal the
actors page names), every attempt of an async actor that can write through it (it
declares an ``AsyncConnection`` parameter, or takes ``ctx`` and so ``ctx.jobs``) runs in
one database transaction:

* ``TASKQ_MAX_CONCURRENCY=1``: on the registered connection itself (the instance the actor
  is injected), one attempt at a time. Whatever transaction the connection has open when
  an attempt starts (session setup done by its factory) is committed first, so that setup
  survives the attempts that roll back.
* above 1: on a dedicated per-slot pool of ``max_concurrency + 1`` fresh connections to the
  worker's database (:class:`JobTransactions` owns it); each attempt checks out its own
  connection and the actor is injected that connection instead of the registered one, so
  two slots never interleave on one connection. The slot connections never carried the
  registered connection's session state (``SET ROLE``, ``search_path``, GUCs).

Success: the buffered sub-jobs are inserted (each group under a savepoint, so a refused
child does not sink the others: they are reported as a ``SubEnqueueError``), then the
fenced terminal write, then COMMIT: the actor's rows, the children and ``succeeded``
become visible together. If the fence no longer holds (the lease was swept and the row
moved on) everything is rolled back. Any other ending rolls the transaction back first;
the failure, retry or cancellation is then written by the completer as usual.

taskq's statements on these connections carry the worker's schema map for their duration
only (:func:`~taskq.db.engine.on_schema`); the actor's own statements run with the
connection's own options.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq.actor import ActorRef
from taskq.db.engine import make_engine, on_schema
from taskq.exceptions import SubEnqueueError
from taskq.settings import WorkerSettings
from taskq.storable_json import storable_text
from taskq.worker.state import Outcome, RunningJob

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from taskq.worker.outcomes import Completer

__all__ = ["JobTransaction", "JobTransactions", "wants_transaction"]

_log = structlog.get_logger("taskq.worker")


def wants_transaction(ref: ActorRef[Any, Any]) -> bool:
    """Whether an attempt of ``ref`` can write through the job's transaction: an async
    actor that declares an ``AsyncConnection`` or takes ``ctx`` (``ctx.jobs``). Others
    keep the completer's batched terminal write: their transaction would hold nothing else.
    """
    if ref.is_sync:
        return False
    return ref.wants_ctx or any(dep is AsyncConnection for dep in ref.dependencies.values())


class JobTransactions:
    """Hands each eligible attempt its :class:`JobTransaction` (see the module docstring).

    ``loop_connection`` resolves the registered LOOP-scope connection (used at
    concurrency 1); ``engine`` is the worker's (its URL and schema map serve the slot
    pool above 1); ``completer`` knows the terminal write. The sub-jobs go through each
    attempt's ``ctx.jobs`` (its buffer, written on the attempt's connection).
    """

    def __init__(
        self,
        *,
        engine: AsyncEngine,
        settings: WorkerSettings,
        loop_connection: Callable[[], Awaitable[AsyncConnection]],
        completer: Completer,
    ) -> None:
        self.settings = settings
        self.translate: dict[str | None, str | None] = dict(
            engine.get_execution_options().get("schema_translate_map") or {}
        )
        self._engine = engine
        self._loop_connection = loop_connection
        self.completer = completer
        self.per_slot = settings.max_concurrency > 1
        """True: a slot pool (one connection per attempt); False: the LOOP connection."""
        self._lock = asyncio.Lock()  # concurrency 1: one attempt at a time on the connection
        self._pool: AsyncEngine | None = None
        self._pool_owner: AsyncEngine | None = None

    def _slot_pool(self) -> AsyncEngine:
        """The per-slot pool, made on first use: ``max_concurrency + 1`` connections to the
        worker's database, without a schema map of their own (the actor's statements
        run as on any connection it opened itself)."""
        if self._pool is None:
            size = self.settings.max_concurrency + 1
            sized = self.settings.model_copy(update={"pool_size": size})
            owner = make_engine(self._engine.url, settings=sized)
            self._pool_owner = owner
            self._pool = owner.execution_options(schema_translate_map=None)
        return self._pool

    async def open(self, job: RunningJob) -> JobTransaction:
        """The attempt's transaction. Its connection is checked out now when the actor is
        injected it (an ``AsyncConnection`` parameter); for one that only takes ``ctx``,
        when it first needs one: at its success, if it enqueued children."""
        tx = JobTransaction(self, job)
        if any(dep is AsyncConnection for dep in job.ref.dependencies.values()):
            await tx.connection()
        return tx

    async def checkout(self) -> tuple[AsyncConnection, bool]:
        """A connection for one attempt and whether it is a slot connection (``False``:
        the registered one, taken under the lock: one attempt at a time)."""
        if self.per_slot:
            return await self._slot_pool().connect(), True
        await self._lock.acquire()
        try:
            conn = await self._loop_connection()
            if conn.in_transaction():
                # The factory's session setup (SET ROLE, set_config, ...): keep it for good.
                await conn.commit()
        except BaseException:
            self._lock.release()
            raise
        return conn, False

    def release_loop_connection(self) -> None:
        """Let the next attempt take the registered connection (concurrency 1)."""
        self._lock.release()

    async def close(self) -> None:
        """Dispose of the slot pool (worker teardown)."""
        if self._pool_owner is not None:
            with contextlib.suppress(Exception):
                await self._pool_owner.dispose()
            self._pool = self._pool_owner = None


class JobTransaction:
    """One attempt's transaction; :meth:`succeed` commits it, :meth:`close` ends it."""

    def __init__(self, owner: JobTransactions, job: RunningJob) -> None:
        self.owner = owner
        self.job = job
        self.conn: AsyncConnection | None = None
        """The attempt's connection once checked out: what the actor is injected for its
        ``AsyncConnection`` parameter."""
        self._owned = False
        self._done = False

    async def connection(self) -> AsyncConnection:
        """The attempt's connection, checked out on first use."""
        if self.conn is None:
            self.conn, self._owned = await self.owner.checkout()
        return self.conn

    async def succeed(self, outcome: Outcome) -> Outcome:
        """Insert the children, write ``succeeded`` (fenced) and commit, all on ``conn``.

        An attempt that neither ran a statement on ``conn`` nor enqueued a child has
        nothing to commit with its end: ``outcome`` is returned as it is, for the
        completer's batched write. Otherwise returns ``outcome`` marked ``committed`` (the completer then only runs the
        post-commit hooks), or, when the fence no longer holds, marked not committed
        after a rollback (nothing of the attempt remains). An error in the writes or the
        commit is raised, after a rollback, for the caller to treat as the attempt's failure.
        """
        owner, job = self.owner, self.job
        subs = job.sub_jobs
        children = subs is not None and bool(subs.buffer)
        if not children and (self.conn is None or not self.conn.in_transaction()):
            # The actor wrote nothing and enqueued nothing: no transaction to join, so
            # the completer's batched write (one commit for many jobs) records the end.
            return outcome
        conn = await self.connection()
        try:
            async with on_schema(conn, owner.translate):
                failed = await self._insert_children(conn)
                if failed is not None:
                    _record_sub_enqueue_error(outcome, failed)
                held = await owner.completer.write_in(conn, outcome)
                if not held:
                    await conn.rollback()
                    _log.warning(
                        "worker-success-fenced-out",
                        job_id=str(job.id),
                        actor=job.ref.name,
                        attempt=job.attempt,
                        reason="the claim no longer holds: the attempt's writes were rolled back",
                    )
                    outcome.committed = False
                    return outcome
            await conn.commit()
        except BaseException:
            await self._roll_back()
            raise
        outcome.committed = True
        return outcome

    async def _insert_children(self, conn: AsyncConnection) -> SubEnqueueError | None:
        subs = self.job.sub_jobs
        if subs is None or not subs.buffer:
            return None
        try:
            await subs.flush_buffer(connection=conn)
        except SubEnqueueError as exc:
            return exc
        return None

    async def _roll_back(self) -> None:
        """Roll back whatever the attempt wrote; a connection in an unknown state is closed
        (its pool rolls back again on checkin)."""
        conn = self.conn
        if conn is None:
            return
        try:
            if conn.in_transaction():
                await conn.rollback()
        except BaseException:
            with contextlib.suppress(Exception):
                await conn.invalidate()

    async def close(self) -> None:
        """End the attempt's use of the connection: roll back anything not committed, give
        a slot connection back to its pool, free the LOOP connection for the next attempt."""
        if self._done:
            return
        self._done = True
        conn = self.conn
        if conn is None:
            return  # never checked out: nothing to end
        try:
            await self._roll_back()
            if self._owned:
                with contextlib.suppress(Exception):
                    await conn.close()
        finally:
            if not self._owned:
                self.owner.release_loop_connection()


def _record_sub_enqueue_error(outcome: Outcome, error: SubEnqueueError) -> None:
    """Say on the success itself that children were refused: the parent row and its
    attempt get ``error_class`` ``SubEnqueueError`` and the reasons, ``on_success`` gets
    the exception in its row (``sub_enqueue_error``), and the log a ``sub_enqueue_failed``."""
    job = outcome.job
    items = error.failed_items
    reasons = "; ".join(
        f"{getattr(args.actor, 'name', args.actor)}: {type(exc).__name__}: {exc}"
        for args, exc in items
    )
    outcome.error_class = "SubEnqueueError"
    outcome.error = storable_text(f"{len(items)} sub-job(s) were not enqueued: {reasons}")
    job.sub_enqueue_error = error
    _log.error(
        "sub_enqueue_failed",
        job_id=str(job.id),
        actor=job.ref.name,
        attempt=job.attempt,
        failed=len(items),
        errors=[repr(exc) for _, exc in items],
        actors=[getattr(args.actor, "name", args.actor) for args, _ in items],
    )
