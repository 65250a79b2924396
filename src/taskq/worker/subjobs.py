"""``ctx.jobs``: enqueue sub-jobs from inside an actor body.

Two paths, as the actors page describes ("Sub-job enqueuing"):

* **Transactional** (the default when an ``AsyncConnection`` is registered at
  ``Scope.LOOP`` in the worker's DI registry, for async actors). Each
  ``ctx.jobs.enqueue()`` is validated at once (a bad payload raises in the actor) and
  buffered on the attempt. When the actor returns, the buffer is inserted on the job's
  own connection, inside the job's transaction, just before its ``succeeded`` write
  (:mod:`taskq.worker.transactions`): the children commit with the parent's success and
  the actor's own writes, or not at all. When the parent raises (retry, snooze, failure,
  cancellation, a worker shutdown) the transaction rolls back and the children vanish
  with it: the queue never sees them. Children the store refuses (a ``max_pending`` cap,
  a singleton collision, a driver error) are each rolled back to their savepoint and
  collected into one :class:`~taskq.exceptions.SubEnqueueError`; the parent still
  succeeds, and the error is on its row, in its ``on_success`` hook and in the log.
* **Autonomous** (no registered connection, or a sync actor: the LOOP connection is not
  usable from a thread). Each enqueue commits on its own, immediately, so children
  persist even if the parent later fails. The worker logs
  ``sub_enqueue_autonomous_fallback`` at WARNING on the first autonomous enqueue and then
  once every 100, so the missing guarantee is visible without flooding the log.

Either way the child carries ``parent_job_id``, inherits the parent's tags unless
``inherit_tags=False`` (explicit ``tags=[...]`` are merged after the inherited ones), and
accepts per-call ``unique_for`` / ``max_pending``. Handles come back unbound: only
``job_id`` and ``wait()`` work on them.
"""

from __future__ import annotations

from typing import Any, Unpack
from uuid import UUID

import structlog
from sqlalchemy.ext.asyncio import AsyncConnection

from taskq.client import JobsClient, _resolve
from taskq.enqueue_options import SUB_JOB_OPTIONS, ItemOptions, SubJobOptions, check_option_names
from taskq.exceptions import SubEnqueueError
from taskq.handle import JobHandle
from taskq.records import EnqueueArgs, EnqueueRequest

__all__ = ["AutonomousCounter", "SubJobs"]

_log = structlog.get_logger("taskq.worker")
FALLBACK_WARN_EVERY = 100
"""The autonomous-fallback warning fires on the 1st autonomous enqueue and every 100th after."""


class AutonomousCounter:
    """Counts a worker's autonomous sub-enqueues and emits the fallback warning every 100."""

    def __init__(self, *, reason: str) -> None:
        self.count = 0
        self._reason = reason

    def tick(self, actor: str) -> None:
        """Count one autonomous enqueue; warn on the 1st, 101st, 201st, ..."""
        self.count += 1
        if self.count % FALLBACK_WARN_EVERY == 1:
            _log.warning(
                "sub_enqueue_autonomous_fallback",
                count=self.count,
                actor=actor,
                reason=self._reason,
                hint="register an sqlalchemy AsyncConnection at Scope.LOOP for transactional "
                "sub-jobs; autonomous sub-jobs persist even if the parent fails",
            )


class SubJobs:
    """The ``SubJobEnqueuer`` of one attempt (``ctx.jobs``).

    ``transactional`` picks the buffered path; ``counter`` is the worker-wide autonomous
    counter (used only on the autonomous path).
    """

    def __init__(
        self,
        client: JobsClient,
        parent_job_id: UUID,
        *,
        parent_actor: str,
        transactional: bool,
        counter: AutonomousCounter,
    ) -> None:
        self._client = client
        self._parent = parent_job_id
        self._parent_actor = parent_actor
        self.transactional = transactional
        self._counter = counter
        self._parent_tags: tuple[str, ...] | None = None
        self.buffer: list[tuple[EnqueueArgs, EnqueueRequest]] = []

    async def _inherited_tags(self) -> tuple[str, ...]:
        """The parent's tags, read once per attempt (claims do not carry them: the hot
        path stays as it was for jobs that enqueue no children)."""
        if self._parent_tags is None:
            record = await self._client.backend.get_job(self._parent)
            self._parent_tags = tuple(record.tags) if record is not None else ()
        return self._parent_tags

    async def enqueue(
        self,
        actor: Any,
        payload: Any,
        /,
        *,
        inherit_tags: bool = True,
        **options: Unpack[SubJobOptions],
    ) -> JobHandle[Any]:
        """Enqueue ``actor`` with ``payload`` as a child of the running job.

        ``options`` (:class:`~taskq.enqueue_options.SubJobOptions`) are
        :meth:`JobsClient.enqueue`'s plus per-call ``unique_for`` and ``max_pending``;
        ``tags`` are added to the parent's unless ``inherit_tags=False``. Validation
        errors raise here, on either path. On the
        transactional path the child is written in the parent's transaction when the
        parent succeeds; the returned handle's ``job_id`` is the id it is written under.
        """
        if options:
            check_option_names(options, SUB_JOB_OPTIONS, "ctx.jobs.enqueue")
        ref = _resolve(actor)
        tags = options.pop("tags", None)
        merged: list[str] = list(await self._inherited_tags()) if inherit_tags else []
        for tag in tags or ():
            if tag not in merged:
                merged.append(tag)
        opts: ItemOptions = {**options, "parent_job_id": self._parent}
        if merged:
            opts["tags"] = merged
        request = self._client._request(ref, payload, opts)
        if self.transactional:
            self.buffer.append((EnqueueArgs(ref, payload, opts), request))
            return JobHandle(
                self._client.backend, request.job_id, result_adapter=ref.result_adapter, bound=False
            )
        self._counter.tick(self._parent_actor)
        [outcome] = await self._client.backend.enqueue([request])
        return JobHandle(
            self._client.backend,
            outcome.job_id,
            result_adapter=ref.result_adapter,
            record=outcome.record_source,
            was_existing=outcome.was_existing,
            deduplicated_onto_terminal=outcome.deduplicated_onto_terminal,
            bound=False,
        )

    async def flush_buffer(self, *, connection: AsyncConnection | None = None) -> None:
        """Write the buffered enqueues; the buffer is empty afterwards either way.

        ``connection``: in the transaction it is in (the job's), each group under its own
        savepoint, so a refused child rolls back alone and the transaction goes on.
        Without it, each group commits on its own. Items without a ``max_pending`` cap go
        as one group first; if that fails, each is retried on its own so one bad item
        does not sink the rest. Capped items are always written one by one (a refusal by
        its cap must not sink the others). Every item that still fails is collected into
        one :class:`SubEnqueueError` (``failed_items``: each ``EnqueueArgs`` with the
        exception that sank it).
        """
        items, self.buffer = self.buffer, []
        uncapped = [item for item in items if item[1].max_pending is None]
        single = [item for item in items if item[1].max_pending is not None]
        if len(uncapped) > 1:
            try:
                await self._write([request for _, request in uncapped], connection)
            except Exception:
                single = uncapped + single
        else:
            single = uncapped + single
        failed: list[tuple[Any, BaseException]] = []
        for args, request in single:
            try:
                await self._write([request], connection)
            except Exception as exc:
                failed.append((args, exc))
        if failed:
            raise SubEnqueueError(failed)

    async def _write(
        self, requests: list[EnqueueRequest], connection: AsyncConnection | None
    ) -> None:
        backend = self._client.backend
        if connection is None:
            await backend.enqueue(requests)
            return
        async with connection.begin_nested():  # a refusal rolls back to here, no further
            await backend.enqueue(requests, connection=connection)
