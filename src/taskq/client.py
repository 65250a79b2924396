"""Producer-side clients: ``TaskQ`` (owns an engine), ``JobsClient`` (enqueue and read jobs).

``JobsClient`` does no I/O at construction: make one per process and share it. The
backend owns the connections. Every enqueue is validated in full (payload, options)
before anything is written.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, TypeVar, cast
from uuid import UUID

from pydantic import BaseModel, TypeAdapter
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from taskq._ids import new_job_ids
from taskq.actor import ActorRef, get_actor
from taskq.actor_config_ops import ActorsClient
from taskq.backends.base import Backend
from taskq.backends.held import held_connections_cap
from taskq.backends.sql import SqlBackend
from taskq.db.engine import make_engine
from taskq.exceptions import JobNotFoundError
from taskq.handle import JobHandle
from taskq.records import (
    EnqueueArgs,
    EnqueueOutcome,
    EnqueueRequest,
    JobRecord,
    build_request,
    request_like,
)
from taskq.settings import TaskQSettings

__all__ = ["EnqueueArgs", "JobHandle", "JobsClient", "TaskQ"]

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")


def _resolve(actor: ActorRef[Any, Any] | str) -> ActorRef[Any, Any]:
    if isinstance(actor, ActorRef):
        return actor
    if isinstance(actor, str):
        return get_actor(actor)
    raise TypeError(f"enqueue takes an ActorRef or an actor name, got {type(actor).__name__}")


class JobsClient:
    """Enqueue jobs and look them up, on any :class:`~taskq.backends.base.Backend`."""

    def __init__(self, backend: Backend, *, settings: TaskQSettings | None = None) -> None:
        self.backend = backend
        self._default_stc = settings.default_start_to_close if settings is not None else None

    def _request(
        self, actor: ActorRef[Any, Any] | str, payload: object, options: dict[str, Any]
    ) -> EnqueueRequest:
        return build_request(
            _resolve(actor), payload, default_start_to_close=self._default_stc, **options
        )

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
        queue: str | None = None,
        priority: int | None = None,
        scheduled_at: datetime | None = None,
        delay: timedelta | None = None,
        identity_key: str | None = None,
        idempotency_key: str | None = None,
        tags: Sequence[str] | None = None,
        metadata: Mapping[str, Any] | None = None,
        start_to_close: timedelta | None = None,
        schedule_to_close: timedelta | None = None,
        connection: AsyncConnection | None = None,
    ) -> JobHandle[R]:
        """Put one job in the queue and return its handle.

        ``connection``: run inside the caller's open transaction (a rollback leaves no
        job). Raises ``PayloadValidationError``, ``SingletonCollisionError``,
        ``MaxPendingExceededError``, ``ValueError``/``TypeError`` for bad options.
        """
        ref = _resolve(actor)
        options = {
            "queue": queue,
            "priority": priority,
            "scheduled_at": scheduled_at,
            "delay": delay,
            "identity_key": identity_key,
            "idempotency_key": idempotency_key,
            "tags": tags,
            "metadata": metadata,
            "start_to_close": start_to_close,
            "schedule_to_close": schedule_to_close,
        }
        request = self._request(ref, payload, options)
        [outcome] = await self.backend.enqueue([request], connection=connection)
        return self._handle(ref, outcome)

    async def enqueue_many(
        self,
        items: Sequence[EnqueueArgs | tuple[ActorRef[Any, Any] | str, Any]],
        *,
        connection: AsyncConnection | None = None,
    ) -> list[JobHandle[Any]]:
        """Enqueue many jobs in one transaction (one INSERT for those with no dedup checks).

        Every item is validated before anything is written; all are written or none.
        """
        refs: list[ActorRef[Any, Any]] = []
        requests: list[EnqueueRequest | None] = []
        stc = self._default_stc
        # (actor, payload) pairs carry no options: each actor is resolved once, later
        # items of it are made like the first (see request_like). Their ids are made in
        # one batch, and payloads that are instances of exactly the actor's model (which
        # cannot fail validation) are dumped together per actor after the loop; any other
        # payload is validated in its turn, so the first bad item is the one reported.
        templates: dict[int, EnqueueRequest] = {}
        deferred: dict[int, tuple[list[int], list[Any]]] = {}
        ids = new_job_ids(len(items))
        for index, item in enumerate(items):
            request: EnqueueRequest | None
            if isinstance(item, EnqueueArgs):
                ref = _resolve(item.actor)
                request = self._request(ref, item.payload, dict(item.options))
            else:
                actor, payload = item
                ref = _resolve(actor)
                template = templates.get(id(ref))
                if template is None:
                    request = templates[id(ref)] = build_request(
                        ref, payload, default_start_to_close=stc, job_id=ids[index]
                    )
                elif type(payload) is ref.payload_type:
                    request = None  # made below, with the actor's other deferred items
                    indexes, payloads = deferred.setdefault(id(ref), ([], []))
                    indexes.append(index)
                    payloads.append(payload)
                else:
                    request = request_like(template, ref.dump_payload(payload), ids[index])
            refs.append(ref)
            requests.append(request)
        for ref_id, (indexes, payloads) in deferred.items():
            template = templates[ref_id]
            dumped = refs[indexes[0]].dump_payloads(payloads)
            for i, body in zip(indexes, dumped, strict=True):
                requests[i] = request_like(template, body, ids[i])
        if not requests:
            return []
        made = cast("list[EnqueueRequest]", requests)  # every None was filled in above
        outcomes = await self.backend.enqueue(made, connection=connection)
        return [self._handle(ref, outcome) for ref, outcome in zip(refs, outcomes, strict=True)]

    async def get(
        self, job_id: UUID, *, result_adapter: TypeAdapter[R] | None = None
    ) -> JobHandle[R]:
        """A handle on an existing job; ``JobNotFoundError`` if there is none.

        Pass the actor's ``result_adapter`` to get a typed result from ``wait()``.
        """
        record = await self.backend.get_job(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return JobHandle(self.backend, job_id, result_adapter=result_adapter, record=record)

    async def cancel(self, job_id: UUID) -> JobRecord:
        """Cancel a job by id (see ``JobHandle.cancel``)."""
        record = await self.backend.cancel_job(job_id)
        if record is None:
            raise JobNotFoundError(job_id)
        return record


class TaskQ:
    """The application's handle on taskq: owns an engine, exposes ``jobs`` and ``actors``.

    ``async with TaskQ(dsn=...) as tq: await tq.jobs.enqueue(...)``. ``dsn`` is a
    SQLAlchemy URL (a plain ``postgresql://`` means psycopg); without it,
    ``TASKQ_DATABASE_URL`` or the embedded SQLite file. Pass ``engine=`` to share an
    engine you own (it is then not disposed on exit).
    """

    def __init__(
        self,
        dsn: str | URL | None = None,
        *,
        engine: AsyncEngine | None = None,
        settings: TaskQSettings | None = None,
    ) -> None:
        self.settings = settings or TaskQSettings.load()
        self._owns_engine = engine is None
        self.engine = engine if engine is not None else make_engine(dsn, settings=self.settings)
        self.backend = SqlBackend(
            self.engine,
            settings=self.settings,
            held_connections=held_connections_cap(self.engine),
        )
        self.jobs = JobsClient(self.backend, settings=self.settings)
        self.actors = ActorsClient(self.engine, settings=self.settings)

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
