"""``JobContext[P]``: what an actor sees of the attempt it is running.

The worker builds one per attempt. The progress sink and the sub-job enqueuer are
injected by the worker, so this module stays free of I/O.
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar, Unpack
from uuid import UUID

import structlog

from taskq.enqueue_options import SubJobOptions
from taskq.storable_json import describe, unstorable_error

__all__ = ["JobContext", "ProgressSink", "SubJobEnqueuer"]

P = TypeVar("P")


class SubJobEnqueuer(Protocol):
    """Enqueue sub-jobs from inside an actor body (the worker supplies the implementation)."""

    async def enqueue(
        self,
        actor: Any,
        payload: Any,
        /,
        *,
        inherit_tags: bool = True,
        **options: Unpack[SubJobOptions],
    ) -> Any:
        """Enqueue ``actor`` with ``payload`` as a child of the running job; ``options`` are
        ``JobsClient.enqueue``'s plus ``unique_for`` and ``max_pending``
        (:class:`~taskq.enqueue_options.SubJobOptions`). Returns the child's ``JobHandle``."""
        ...


ProgressSink = Callable[..., Awaitable[None]]
"""``sink(*, step, percent, detail, data)``: receives validated progress updates."""


@dataclass(frozen=True, eq=False)
class JobContext(Generic[P]):
    """Per-attempt context handed to an actor that declares ``ctx: JobContext[P]``.

    Frozen: the actor reads it, the worker owns it. ``cancel_event`` is an
    ``asyncio.Event`` set (on the loop) by :meth:`request_cancel`; a thread-safe flag set
    alongside it backs :meth:`should_abort` for sync actors running in a thread.
    """

    job_id: UUID
    actor: str
    queue: str
    attempt: int
    worker_id: UUID
    payload: P
    jobs: SubJobEnqueuer | None = None
    log: Any = None
    span: Any | None = None
    cancel_event: asyncio.Event = field(default_factory=asyncio.Event)
    progress_sink: ProgressSink | None = None
    _abort: threading.Event = field(default_factory=threading.Event, repr=False)

    def __post_init__(self) -> None:
        if self.log is None:
            bound = structlog.get_logger("taskq.actor").bind(
                job_id=str(self.job_id),
                actor=self.actor,
                attempt=self.attempt,
                worker_id=str(self.worker_id),
            )
            object.__setattr__(self, "log", bound)

    @property
    def cancellation_requested(self) -> bool:
        """True once cancellation reached phase 1 (cooperative): ``cancel_event`` is set."""
        return self.cancel_event.is_set() or self._abort.is_set()

    def request_cancel(self) -> None:
        """Mark the attempt as cancelling. Call on the event loop's thread (the worker does)."""
        self._abort.set()
        self.cancel_event.set()

    def check_cancelled(self) -> None:
        """Raise ``asyncio.CancelledError`` if cancellation was requested (cooperative exit)."""
        if self.cancellation_requested:
            raise asyncio.CancelledError

    def should_abort(self) -> bool:
        """Thread-safe cancellation check for sync actors, which cannot await ``cancel_event``."""
        return self._abort.is_set()

    async def progress(
        self,
        *,
        step: int | None = None,
        percent: float | None = None,
        detail: str | None = None,
        data: dict[str, object] | None = None,
    ) -> None:
        """Report progress; fields left ``None`` keep their previous value (last writer wins).

        Validates here (``percent`` in ``[0, 100]``, ``data`` JSON with ``str`` keys, no
        infinite or NaN float and no NUL character in ``detail`` or ``data``, which not
        every engine can store: :mod:`taskq.storable_json`) so a bad call fails in the
        actor, then hands the update to the worker's sink. Without a sink (direct
        invocation, no Redis) it validates and returns.
        """
        if percent is not None and not (math.isfinite(percent) and 0.0 <= percent <= 100.0):
            raise ValueError(f"progress percent must be in [0.0, 100.0], got {percent}")
        if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
            raise TypeError("progress step must be an int")
        if data is not None:
            _check_json(data)
        if data is not None or detail is not None:
            error = unstorable_error({"detail": detail, "data": data})
            if error is not None:
                raise ValueError("progress cannot be stored: " + describe(error))
        if self.progress_sink is not None:
            await self.progress_sink(step=step, percent=percent, detail=detail, data=data)


def _check_json(value: object) -> None:
    def check_keys(node: object) -> None:
        if isinstance(node, dict):
            for key, item in node.items():
                if not isinstance(key, str):
                    raise TypeError(f"progress data keys must be str, got {type(key).__name__}")
                check_keys(item)
        elif isinstance(node, list | tuple):
            for item in node:
                check_keys(item)

    check_keys(value)
    json.dumps(value)
