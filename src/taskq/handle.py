# sync twin: src/taskq_sync/handle.py
"""``JobHandle[R]``: a reference to one enqueued job, and the way to wait for its result."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, overload
from uuid import UUID

from pydantic import TypeAdapter

from taskq._ids import as_job_id, uuid_from_int
from taskq.backends.base import Backend
from taskq.exceptions import JobCancelledError, JobFailedError, JobNotFoundError, WaitTimeout
from taskq.progress import ProgressEvent, progress_channel
from taskq.progress_pubsub import confirmed, pending
from taskq.records import AttemptRecord, JobRecord, JobStatus, RecordSource, build_record

if TYPE_CHECKING:
    from taskq.actor import ActorRef

__all__ = ["JobHandle", "JobHandles"]

R = TypeVar("R")


class JobHandle(Generic[R]):
    """A job in the store. ``wait()`` returns its typed result or raises its failure.

    ``was_existing`` is True when the enqueue deduplicated onto (or idempotently matched)
    a job that was already there; ``deduplicated_onto_terminal`` when that job had
    already finished. Handles from ``ctx.jobs.enqueue`` are unbound: only ``wait()`` and
    ``job_id`` work on them.
    """

    # enqueue_many returns one handle per job: no per-instance __dict__.
    __slots__ = (
        "__weakref__",
        "_backend",
        "_bound",
        "_record",
        "deduplicated_onto_terminal",
        "job_id",
        "result_adapter",
        "was_existing",
    )

    def __init__(
        self,
        backend: Backend,
        job_id: UUID | str,
        *,
        result_adapter: TypeAdapter[R] | None = None,
        record: RecordSource | None = None,
        was_existing: bool = False,
        deduplicated_onto_terminal: bool = False,
        bound: bool = True,
    ) -> None:
        self._backend = backend
        self.job_id: UUID = job_id if type(job_id) is UUID else as_job_id(job_id)
        self.result_adapter = result_adapter
        self._record: RecordSource | None = record
        self.was_existing = was_existing
        self.deduplicated_onto_terminal = deduplicated_onto_terminal
        self._bound = bound

    @property
    def record(self) -> JobRecord | None:
        """The last row seen: from the enqueue (built on first access), then re-reads."""
        record = self._record
        if record is None or isinstance(record, JobRecord):
            return record
        built = self._record = build_record(record, self.job_id)
        return built

    @record.setter
    def record(self, value: JobRecord | None) -> None:
        self._record = value

    def __repr__(self) -> str:
        return f"<JobHandle {self.job_id} was_existing={self.was_existing}>"

    def _require_client(self, method: str) -> None:
        if not self._bound:
            raise RuntimeError(
                f"JobHandle.{method}() needs a client: this handle came from ctx.jobs.enqueue(); "
                "use JobsClient.get(job_id) from application code"
            )

    async def refresh(self) -> JobRecord:
        """Re-read the row; ``JobNotFoundError`` if it is gone."""
        self._require_client("refresh")
        record = await self._backend.get_job(self.job_id)
        if record is None:
            raise JobNotFoundError(self.job_id)
        self.record = record
        return record

    async def status(self) -> JobStatus:
        """The job's current status (re-read from the store): a ``str`` (``"pending"``,
        ``"scheduled"``, ...) that also carries, for a job parked on a limit, what it
        waits on (``.waiting_on``), when it can next run (``.ready_at``) and how often a
        limit parked it (``.denials``); ``.state`` reads ``"waiting"`` for it."""
        self._require_client("status")
        return JobStatus(await self.refresh())

    async def attempts(self) -> list[AttemptRecord]:
        """Every attempt so far, oldest first."""
        self._require_client("attempts")
        return await self._backend.get_attempts(self.job_id)

    async def cancel(self) -> JobRecord:
        """Cancel the job (pending/scheduled: at once; running: the worker is told)."""
        self._require_client("cancel")
        record = await self._backend.cancel_job(self.job_id)
        if record is None:
            raise JobNotFoundError(self.job_id)
        self.record = record
        return record

    async def wait(self, timeout: float | None = None) -> R:  # noqa: ASYNC109
        """Wait until the job finishes; return its result (typed by the actor's ``R``).

        Raises ``JobCancelledError`` if it was cancelled, ``JobFailedError`` for any other
        unsuccessful end, ``WaitTimeout`` after ``timeout`` seconds, ``JobNotFoundError``
        if the row does not exist.
        """
        record = await self._backend.wait_for(self.job_id, timeout)
        if record is None:
            raise JobNotFoundError(self.job_id)
        self.record = record
        if not record.is_terminal:
            raise WaitTimeout(self.job_id, timeout if timeout is not None else 0.0)
        return self._outcome(record)

    async def progress_stream(
        self,
        redis_client: Any = None,
        *,
        redis_url: str | None = None,
        timeout: float | None = None,  # noqa: ASYNC109
        poll_interval: float = 1.0,
    ) -> AsyncIterator[ProgressEvent]:
        """Yield the job's progress-stream events as they happen; end after the terminal one.

        Subscribes to the job's Redis channel (``redis_client``, else a client built from
        ``redis_url`` or ``TASKQ_REDIS_URL`` and closed at the end), then reads the row: a
        job that has already ended yields one event built from its row (``seq=None``) and
        stops. Events arrive in ``seq`` order; a duplicate or older ``seq`` is skipped.
        Progress updates may be coalesced (you see the newest state, not every call);
        state changes (``running``, ``retried``, ``snoozed``, ``released``, the terminal
        event) are not. After ``poll_interval`` seconds of silence the row is re-read, so a
        terminal event lost by Redis still ends the stream. ``timeout`` bounds the whole
        stream (``WaitTimeout``). ``JobNotFoundError`` if the job does not exist.
        """
        from redis.asyncio import Redis

        owned: Any = None
        if redis_client is None:
            settings = self._backend.settings  # what the client was built with
            url = redis_url or (settings.redis_url if settings is not None else None)
            if not url:
                raise RuntimeError(
                    "progress_stream() needs Redis: pass redis_client= or redis_url=, "
                    "or set TASKQ_REDIS_URL"
                )
            redis_client = owned = Redis.from_url(url)
        deadline = None if timeout is None else time.monotonic() + timeout
        pubsub = redis_client.pubsub()
        try:
            await pubsub.subscribe(progress_channel(self.job_id))
            # Subscribed (confirmed) first, then the row read: an event published in
            # between is on the channel, and the row already holds anything before.
            await confirmed(pubsub)
            record = await self._backend.get_job(self.job_id)
            if record is None:
                raise JobNotFoundError(self.job_id)
            if record.is_terminal:
                yield ProgressEvent.from_record(record)
                return
            last = -1
            while True:
                wait = poll_interval
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        raise WaitTimeout(self.job_id, timeout if timeout is not None else 0.0)
                    wait = min(wait, left)
                message = await pubsub.get_message(ignore_subscribe_messages=True, timeout=wait)
                if message is None:
                    record = await self._backend.get_job(self.job_id)
                    if record is None:
                        raise JobNotFoundError(self.job_id)
                    if record.is_terminal:
                        # The row ended while the channel was quiet for us, but events
                        # published before that end may still be unread on it: yield
                        # them first (in order, once each), never jump to the end.
                        async for event in pending(pubsub, poll_interval):
                            if event.seq is not None and event.seq <= last:
                                continue
                            last = event.seq if event.seq is not None else last
                            yield event
                            if event.terminal:
                                return
                        yield ProgressEvent.from_record(record)
                        return
                    continue
                event = ProgressEvent.from_message(message["data"])
                if event.seq is not None and event.seq <= last:
                    continue
                last = event.seq if event.seq is not None else last
                yield event
                if event.terminal:
                    return
        finally:
            await pubsub.aclose()
            if owned is not None:
                await owned.aclose()

    def _outcome(self, record: JobRecord) -> R:
        if record.status == "succeeded":
            if self.result_adapter is None:
                return cast("R", record.result)
            return self.result_adapter.validate_python(record.result)
        if record.status == "cancelled":
            raise JobCancelledError(record.id, record.status, record.error_class, record.error)
        raise JobFailedError(record.id, record.status, record.error_class, record.error)


class JobHandles(Sequence[JobHandle[Any]]):
    """The handles of a bulk ``enqueue_many`` (one per item, in order), each made the
    first time it is read, then kept: ``handles[i] is handles[i]``.

    Such a batch (``(actor, model)`` pairs written with one COPY) keeps its ids as
    integers and its records in one shared source. A caller that only needs to know the
    jobs are in (the usual case for a large batch) then makes no object per job; one
    that reads them pays for each handle when it does. It is a read-only sequence:
    ``list(handles)`` makes a list.
    """

    __slots__ = ("_backend", "_ids", "_made", "_records", "_refs")

    def __init__(
        self,
        backend: Backend,
        refs: Sequence[ActorRef[Any, Any]],
        ids: Sequence[int],
        records: RecordSource,
    ) -> None:
        if len(refs) != len(ids):
            raise ValueError("JobHandles: one actor per job id")
        self._backend = backend
        self._refs = refs
        self._ids = ids
        self._records = records
        self._made: list[JobHandle[Any] | None] | None = None

    def __len__(self) -> int:
        return len(self._ids)

    @overload
    def __getitem__(self, index: int) -> JobHandle[Any]: ...

    @overload
    def __getitem__(self, index: slice) -> list[JobHandle[Any]]: ...

    def __getitem__(self, index: int | slice) -> JobHandle[Any] | list[JobHandle[Any]]:
        if isinstance(index, slice):
            return [self._handle(i) for i in range(*index.indices(len(self._ids)))]
        size = len(self._ids)
        position = index + size if index < 0 else index
        if not 0 <= position < size:
            raise IndexError("JobHandles index out of range")
        return self._handle(position)

    def __iter__(self) -> Iterator[JobHandle[Any]]:
        for position in range(len(self._ids)):
            yield self._handle(position)

    def __repr__(self) -> str:
        return f"<JobHandles of {len(self._ids)} jobs>"

    def _handle(self, position: int) -> JobHandle[Any]:
        made = self._made
        if made is None:
            made = self._made = [None] * len(self._ids)
        handle = made[position]
        if handle is None:
            handle = made[position] = JobHandle(
                self._backend,
                uuid_from_int(self._ids[position]),
                result_adapter=self._refs[position].result_adapter,
                record=self._records,
            )
        return handle
