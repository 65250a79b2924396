"""``ctx.jobs``: enqueue sub-jobs from inside an actor body.

Two paths, as the actors page describes ("Sub-job enqueuing"):

* **Transactional** (the default when an ``AsyncConnection`` is registered at
  ``Scope.LOOP`` in the worker's DI registry, for async actors). Each
  ``ctx.jobs.enqueue()`` is validated at once (a bad payload raises in the actor) and
  buffered on the attempt. Nothing is written while the parent runs, so when the parent
  raises (retry, snooze, failure, cancellation, a worker shutdown) the buffer is simply
  dropped with the attempt: the children vanish atomically and the queue never sees
  them. When the parent's ``succeeded`` write has committed (the completer's batched,
  fenced terminal write), the buffer is replayed against the backend by
  :meth:`SubJobs.flush_buffer`. A replay that fails raises
  :class:`~taskq.exceptions.SubEnqueueError` carrying every failed
  :class:`~taskq.records.EnqueueArgs` with its exception; the worker logs it as
  ``sub_enqueue_flush_failed`` (the parent is already succeeded: those children were
  lost and must be re-enqueued from ``failed_items``).
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

from collections.abc import Sequence
from typing import Any
from uuid import UUID

import structlog

from taskq.client import JobsClient, _resolve
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
        tags: Sequence[str] | None = None,
        **options: Any,
    ) -> JobHandle[Any]:
        """Enqueue ``actor`` with ``payload`` as a child of the running job.

        ``options`` are :meth:`JobsClient.enqueue`'s plus per-call ``unique_for`` and
        ``max_pending``. Validation errors raise here, on either path. On the
        transactional path the child is only written once the parent has succeeded; the
        returned handle's ``job_id`` is the id it will be written under.
        """
        ref = _resolve(actor)
        merged: list[str] = list(await self._inherited_tags()) if inherit_tags else []
        for tag in tags or ():
            if tag not in merged:
                merged.append(tag)
        opts: dict[str, Any] = {**options, "parent_job_id": self._parent}
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

    async def flush_buffer(self) -> None:
        """Replay the buffered enqueues (call only after the parent's success committed).

        Items without a ``max_pending`` cap go in one transaction first; if that fails,
        each is retried on its own so one bad item does not sink the rest. Capped items
        are always replayed one by one (a refusal by its cap must not sink the others).
        Every item that still fails is collected into one :class:`SubEnqueueError`. The
        buffer is empty afterwards either way.
        """
        items, self.buffer = self.buffer, []
        backend = self._client.backend
        uncapped = [item for item in items if item[1].max_pending is None]
        single = [item for item in items if item[1].max_pending is not None]
        if len(uncapped) > 1:
            try:
                await backend.enqueue([request for _, request in uncapped])
            except Exception:
                single = uncapped + single
        else:
            single = uncapped + single
        failed: list[tuple[Any, BaseException]] = []
        for args, request in single:
            try:
                await backend.enqueue([request])
            except Exception as exc:
                failed.append((args, exc))
        if failed:
            raise SubEnqueueError(failed)

    async def flush_after_success(self, attempt: int) -> None:
        """Post-commit hook: confirm the parent is ``succeeded`` by this attempt (the
        fenced write may have matched nothing if the lease was swept), then replay the
        buffer. A failed replay is logged as ``sub_enqueue_flush_failed``, never raised:
        the parent's outcome is already durable."""
        record = await self._client.backend.get_job(self._parent)
        if record is None or record.status != "succeeded" or record.attempt != attempt:
            _log.warning(
                "sub_enqueue_discarded",
                job_id=str(self._parent),
                attempt=attempt,
                children=len(self.buffer),
                reason="parent was not marked succeeded by this attempt",
            )
            self.buffer = []
            return
        try:
            await self.flush_buffer()
        except SubEnqueueError as exc:
            _log.error(
                "sub_enqueue_flush_failed",
                job_id=str(self._parent),
                actor=self._parent_actor,
                attempt=attempt,
                failed=len(exc.failed_items),
                errors=[repr(err) for _, err in exc.failed_items],
                actors=[getattr(args.actor, "name", args.actor) for args, _ in exc.failed_items],
            )
