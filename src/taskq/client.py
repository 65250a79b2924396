# sync twin: src/taskq_sync/client.py
"""Producer-side clients: ``TaskQ`` (owns an engine), ``JobsClient`` (enqueue and read jobs).

``JobsClient`` does no I/O at construction: make one per process and share it. The
backend owns the connections. Every enqueue is validated in full (payload, options)
before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar, Unpack, cast
from uuid import UUID

from pydantic import BaseModel, TypeAdapter
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq._ids import as_job_id, new_job_ids
from taskq.actor import ActorRef, find_actor, get_actor
from taskq.actor_config_ops import ActorsClient, QueuesClient
from taskq.backends.base import Backend
from taskq.backends.held import held_connections_cap
from taskq.backends.sql import SqlBackend
from taskq.bulk_rows import BulkOutcomes, BulkRows
from taskq.cron.client import SchedulesClient
from taskq.db.caller_connection import CallerConnection, accepted_connection
from taskq.db.engine import make_engine, with_schema
from taskq.db.fork import track_engine
from taskq.enqueue_options import (
    ENQUEUE_OPTIONS,
    ITEM_OPTIONS,
    EnqueueOptions,
    ItemOptions,
    check_option_names,
)
from taskq.exceptions import JobNotFoundError
from taskq.handle import JobHandle, JobHandles
from taskq.ops.jobs import JobOperations
from taskq.ops.workers import WorkersClient
from taskq.records import (
    EnqueueArgs,
    EnqueueOutcome,
    EnqueueRequest,
    JobRecord,
    build_request,
    request_like,
    request_template,
)
from taskq.request_batch import RequestBatch
from taskq.settings import TaskQSettings
from taskq.telemetry import enqueue_span, record_bulk_enqueued, record_enqueued, stamp_actors

__all__ = ["EnqueueArgs", "JobHandle", "JobsClient", "TaskQ"]

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")


def _resolve(actor: ActorRef[Any, Any] | str) -> ActorRef[Any, Any]:
    if isinstance(actor, ActorRef):
        return actor
    if isinstance(actor, str):
        return get_actor(actor)
    raise TypeError(f"enqueue takes an ActorRef or an actor name, got {type(actor).__name__}")


class JobsClient(JobOperations):
    """Enqueue jobs and look them up, on any :class:`~taskq.backends.base.Backend`; on a
    SQL backend also the operator's job operations (list, count, cancel_where, retry,
    purge: :class:`~taskq.ops.jobs.JobOperations`)."""

    def __init__(self, backend: Backend) -> None:
        self.backend = backend

    def _request(
        self, actor: ActorRef[Any, Any] | str, payload: object, options: ItemOptions
    ) -> EnqueueRequest:
        return build_request(_resolve(actor), payload, **options)

    def _handle(self, ref: ActorRef[Any, Any], outcome: EnqueueOutcome) -> JobHandle[Any]:
        return JobHandle(
            self.backend,
            outcome.job_id,
            result_adapter=ref.result_adapter,
            record=outcome.record_source,
            was_existing=outcome.was_existing,
            deduplicated_onto_terminal=outcome.deduplicated_onto_terminal,
        )

    async def enqueue(
        self,
        actor: ActorRef[P, R] | str,
        payload: P | Mapping[str, Any],
        *,
        connection: CallerConnection | None = None,
        **options: Unpack[EnqueueOptions],
    ) -> JobHandle[R]:
        """Put one job in the queue and return its handle.

        ``options``: :class:`~taskq.enqueue_options.EnqueueOptions` (``queue``,
        ``priority``, ``scheduled_at`` or ``delay``, ``identity_key``,
        ``idempotency_key``, ``tags``, ``metadata``, ``start_to_close``,
        ``schedule_to_close``). ``connection``: run inside the caller's open transaction (a rollback leaves no
        job): a SQLAlchemy connection or a psycopg one, never committed, rolled back or
        closed by taskq; anything else is a ``TypeError``. Raises ``PayloadValidationError``, ``SingletonCollisionError``,
        ``MaxPendingExceededError``, ``ValueError``/``TypeError`` for bad options.
        """
        if connection is not None:
            accepted_connection(connection)
        if options:
            check_option_names(options, ENQUEUE_OPTIONS, "enqueue")
        ref = _resolve(actor)
        with enqueue_span((ref.name,), 1) as span:
            request = build_request(ref, payload, **options)
            [outcome] = await self.backend.enqueue([request], connection=connection)
            record_enqueued(span, (request,), (outcome,))
        return self._handle(ref, outcome)

    async def enqueue_many(
        self,
        items: Sequence[EnqueueArgs | tuple[ActorRef[Any, Any] | str, Any]],
        *,
        connection: CallerConnection | None = None,
    ) -> Sequence[JobHandle[Any]]:
        """Enqueue many jobs in one transaction (one INSERT or COPY for those with no dedup
        checks) and return their handles, one per item, in order.

        All are written or none: an item that fails validation is raised (the first bad
        one, in order) and leaves nothing written. Without ``connection``, a large batch
        may be streamed to the database while its later items are still being validated,
        inside a transaction that the error rolls back.

        The handles are a read-only sequence: a list, or for a bulk batch of ``(actor,
        model)`` pairs a :class:`~taskq.handle.JobHandles` that makes each handle when it
        is first read.
        """
        if connection is not None:
            accepted_connection(connection)
        if not items:
            return []
        made = _Items(items)
        with enqueue_span((), len(items)) as span:
            batch = made.batch()  # in the span: the jobs carry its trace context
            stamp_actors(span, batch.actors)
            if connection is None:
                outcomes = await self.backend.enqueue_batch(batch)
            else:
                outcomes = await self.backend.enqueue(batch.all(), connection=connection)
            if isinstance(outcomes, BulkOutcomes):
                record_bulk_enqueued(span, outcomes.counts)
                return JobHandles(self.backend, made.refs, outcomes.job_ids, outcomes.records)
            record_enqueued(span, batch.made, outcomes)
        return [self._handle(ref, out) for ref, out in zip(made.refs, outcomes, strict=True)]

    async def get(
        self, job_id: UUID | str, *, result_adapter: TypeAdapter[R] | None = None
    ) -> JobHandle[R]:
        """A handle on an existing job; ``JobNotFoundError`` if there is none.

        ``job_id`` is a UUID or its string. Pass the actor's ``result_adapter`` to get a
        typed result from ``wait()``.
        """
        job_id = as_job_id(job_id)
        record = await self.backend.get_job(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return JobHandle(self.backend, job_id, result_adapter=result_adapter, record=record)

    async def cancel(self, job_id: UUID | str) -> JobRecord:
        """Cancel a job by id, a UUID or its string (see ``JobHandle.cancel``)."""
        job_id = as_job_id(job_id)
        record = await self.backend.cancel_job(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return record


class TaskQ:
    """The application's handle on taskq: owns an engine, exposes ``jobs``, ``actors``,
    ``queues``, ``workers`` and ``schedules``.

    ``async with TaskQ(dsn=...) as tq: await tq.enqueue(...)``. ``dsn`` is a
    SQLAlchemy URL (a plain ``postgresql://`` means psycopg); without it,
    ``TASKQ_DATABASE_URL`` or the embedded SQLite file. Pass ``engine=`` to share an
    engine you own, one you made with ``create_async_engine`` included (it is then not
    disposed on exit): taskq finds its tables in the schema of ``settings``
    (``TASKQ_SCHEMA_NAME``), or in ``schema=`` when given, through the engine's
    ``schema_translate_map``, without changing the engine you passed.

    ``enqueue``, ``enqueue_many``, ``get`` and ``cancel`` are :attr:`jobs`'s
    (:class:`JobsClient`), the same calls.
    """

    def __init__(
        self,
        dsn: str | URL | None = None,
        *,
        engine: AsyncEngine | None = None,
        settings: TaskQSettings | None = None,
        schema: str | None = None,
    ) -> None:
        resolved = settings or TaskQSettings.load()
        if schema is not None and schema != resolved.schema_name:
            resolved = type(resolved).load(**{**resolved.model_dump(), "schema_name": schema})
        self.settings = resolved
        self._owns_engine = engine is None
        if engine is None:
            engine = make_engine(dsn, settings=self.settings)
        track_engine(engine)  # a forked child gets a fresh pool (taskq.db.fork)
        self.engine = with_schema(engine, settings=self.settings)
        """The engine taskq runs on: the one passed (or made), with the schema applied."""
        self.backend = SqlBackend(
            self.engine,
            settings=self.settings,
            held_connections=held_connections_cap(self.engine),
        )
        self.jobs = JobsClient(self.backend)
        self.enqueue = self.jobs.enqueue
        self.enqueue_many = self.jobs.enqueue_many
        self.get = self.jobs.get
        self.cancel = self.jobs.cancel
        self.actors = ActorsClient(self.engine, settings=self.settings)
        self.queues = QueuesClient(self.engine, settings=self.settings)
        self.schedules = SchedulesClient(self.engine, self.jobs)
        self.workers = WorkersClient(self.engine)

    async def __aenter__(self) -> TaskQ:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Return the backend's held connections; dispose of the engine if this ``TaskQ``
        created it."""
        await self.backend.aclose()
        if self._owns_engine:
            await self.engine.dispose()


class _Items:
    """The requests of an ``enqueue_many``'s items, made a chunk at a time (``make``).

    ``(actor, payload)`` pairs carry no options: each actor is resolved once and its
    items are made like its template (:func:`~taskq.records.request_like`). Ids are made
    one batch per chunk. Payloads that are instances of exactly the actor's model (which
    cannot fail validation) are dumped together per actor and chunk; any other payload
    is validated in its turn, so the first bad item is the one raised.

    When every item is such a pair with an actor that resolves, what the batch holds is
    known before any payload is validated (:meth:`batch`), so a backend can stream it.
    """

    def __init__(
        self,
        items: Sequence[EnqueueArgs | tuple[ActorRef[Any, Any] | str, Any]],
    ) -> None:
        self.items = items
        self.refs: list[ActorRef[Any, Any]] = []
        """The actor of each item made so far (all of them when they are all pairs)."""
        self._resolved = False
        self._templates: dict[int, EnqueueRequest] = {}
        self._bulk: BulkRows | None = None

    def batch(self) -> RequestBatch:
        """The items' :class:`~taskq.request_batch.RequestBatch` (``plain`` when known)."""
        refs: list[ActorRef[Any, Any]] = []
        models: list[Any] = []
        exact = True  # every payload is an instance of exactly its actor's model
        last: object = _NO_ACTOR
        ref: ActorRef[Any, Any] | None = None
        payload_type: object = None
        for item in self.items:  # one pass, each run of items naming one actor resolved once
            if type(item) is not tuple or len(item) != 2:
                return RequestBatch(len(self.items), self.make)
            actor, model = item
            if actor is not last:
                ref = _find(actor)
                if ref is None:
                    return RequestBatch(len(self.items), self.make)
                last, payload_type = actor, ref.payload_type
            refs.append(cast("ActorRef[Any, Any]", ref))
            models.append(model)
            exact = exact and type(model) is payload_type
        self.refs, self._resolved = refs, True
        actors = {id(ref): ref for ref in refs}
        templates = [self._template(ref) for ref in actors.values()]
        plain = all([t.uncapped_plain for t in templates])
        if plain and exact:
            self._bulk = self._bulk_rows(list(actors.values()), templates, models)
        return RequestBatch(
            len(self.items),
            self.make,
            plain=plain,
            actors=frozenset([t.actor for t in templates]),
            queues={t.queue for t in templates},
            bulk=self._bulk,
        )

    def _bulk_rows(
        self,
        actors: list[ActorRef[Any, Any]],
        templates: list[EnqueueRequest],
        models: list[Any],
    ) -> BulkRows:
        """The items as :class:`~taskq.bulk_rows.BulkRows`: every payload (``models``) is
        an instance of exactly its actor's model, so there is nothing to validate."""
        which = None
        if len(actors) > 1:
            index = {id(ref): i for i, ref in enumerate(actors)}
            which = [index[id(ref)] for ref in self.refs]
        dumps = [ref.dump_payloads_json for ref in actors]
        return BulkRows(models, templates, dumps, which)

    def _template(self, ref: ActorRef[Any, Any]) -> EnqueueRequest:
        template = self._templates.get(id(ref))
        if template is None:
            template = self._templates[id(ref)] = request_template(ref)
        return template

    def make(self, start: int, stop: int) -> list[EnqueueRequest]:
        """The requests of items ``start`` to ``stop - 1``, in order."""
        if self._bulk is not None:
            return self._bulk.requests(start, stop)
        ids = new_job_ids(stop - start)
        made: list[EnqueueRequest | None] = []
        deferred: dict[int, tuple[ActorRef[Any, Any], list[int], list[Any]]] = {}
        for index in range(start, stop):
            item = self.items[index]
            if isinstance(item, EnqueueArgs):
                check_option_names(item.options, ITEM_OPTIONS, f"enqueue_many item {index}")
                ref = _resolve(item.actor)
                self.refs.append(ref)
                made.append(build_request(ref, item.payload, **item.options))
                continue
            actor, payload = item
            if self._resolved:
                ref = self.refs[index]
            else:
                ref = _resolve(actor)
                self.refs.append(ref)
            if type(payload) is ref.payload_type:
                made.append(None)  # made below, with the actor's other deferred items
                _, indexes, payloads = deferred.setdefault(id(ref), (ref, [], []))
                indexes.append(index - start)
                payloads.append(payload)
            else:
                body = ref.dump_payload(payload)
                made.append(request_like(self._template(ref), body, ids[index - start]))
        for ref, indexes, payloads in deferred.values():
            template = self._template(ref)
            for i, body in zip(indexes, ref.dump_payloads(payloads), strict=True):
                made[i] = request_like(template, body, ids[i])
        return cast("list[EnqueueRequest]", made)  # every None was filled in above


_NO_ACTOR = object()
"""No item's actor (what :meth:`_Items.batch` compares the first item's with)."""


def _find(actor: object) -> ActorRef[Any, Any] | None:
    """The actor ``actor`` names or is, or ``None`` (then :func:`_resolve` raises)."""
    if isinstance(actor, ActorRef):
        return actor
    return find_actor(actor) if isinstance(actor, str) else None
