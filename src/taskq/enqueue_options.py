"""The per-job enqueue options, declared once.

Every enqueue surface takes its options from the typed dicts here: ``JobsClient.enqueue``
(and its sync twin) is ``**options: Unpack[EnqueueOptions]``, ``ctx.jobs.enqueue`` is
``Unpack[SubJobOptions]``, an ``EnqueueArgs`` item of ``enqueue_many`` carries
:class:`ItemOptions`. The names each surface accepts (:data:`ENQUEUE_OPTIONS`,
:data:`SUB_JOB_OPTIONS`, :data:`ITEM_OPTIONS`) are these dicts' keys, and each option
names the :class:`~taskq.records.EnqueueRequest` field it resolves to (:func:`record_field`).
:func:`taskq.records.build_request`, which resolves them, is tested to take exactly
:data:`ITEM_OPTIONS` and to set each one's field.

Every key may be given as ``None``, which means "not given": the actor's value (or now,
for the schedule) applies.
"""

from __future__ import annotations

import typing
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Annotated, Any, Final, TypedDict
from uuid import UUID

__all__ = [
    "ENQUEUE_OPTIONS",
    "ITEM_OPTIONS",
    "SUB_JOB_OPTIONS",
    "EnqueueOptions",
    "ItemOptions",
    "Stored",
    "SubJobOptions",
    "check_option_names",
    "record_field",
]


@dataclass(frozen=True, slots=True)
class Stored:
    """Marks an option whose :class:`~taskq.records.EnqueueRequest` field has another
    name (``delay`` is stored as ``delay_s``)."""

    field: str


class EnqueueOptions(TypedDict, total=False):
    """What ``enqueue`` takes besides the actor, the payload and ``connection``."""

    queue: str | None
    """Another queue than the actor's."""
    priority: int | None
    """Higher runs first (``-32768..32767``); default the actor's."""
    scheduled_at: datetime | None
    """Not before this aware datetime (not with ``delay``)."""
    delay: Annotated[timedelta | None, Stored("delay_s")]
    """Not before this long from the store's clock (not with ``scheduled_at``)."""
    identity_key: str | None
    """The key ``unique_for`` and ``singleton`` deduplicate on."""
    idempotency_key: str | None
    """An enqueue with a key already used returns the existing job."""
    tags: Sequence[str] | None
    """Labels to filter jobs by."""
    metadata: Mapping[str, Any] | None
    """A JSON object stored with the job."""
    start_to_close: Annotated[timedelta | None, Stored("start_to_close_s")]
    """This job's attempt timeout (default the actor's, then the worker's)."""
    schedule_to_close: Annotated[timedelta | None, Stored("schedule_to_close_s")]
    """The whole job's deadline, from its creation."""


class SubJobOptions(EnqueueOptions, total=False):
    """What ``ctx.jobs.enqueue`` takes: ``enqueue``'s options plus per-call overrides
    of the actor's ``unique_for`` and ``max_pending`` (and ``inherit_tags``, which is not
    a job's option but the call's)."""

    unique_for: timedelta | None
    """This call's deduplication window instead of the actor's."""
    max_pending: int | None
    """This call's cap on the actor's pending jobs (the tighter of it and the stored one)."""


class ItemOptions(SubJobOptions, total=False):
    """What an ``EnqueueArgs`` of ``enqueue_many`` may carry: a sub-job's options and its
    ``parent_job_id``, so that a ``SubEnqueueError``'s ``failed_items`` can be enqueued
    again as they were."""

    parent_job_id: UUID | None
    """The job this one is a child of."""


ENQUEUE_OPTIONS: Final[frozenset[str]] = EnqueueOptions.__optional_keys__
"""The option names ``enqueue`` accepts."""
SUB_JOB_OPTIONS: Final[frozenset[str]] = SubJobOptions.__optional_keys__
"""The option names ``ctx.jobs.enqueue`` accepts (besides ``inherit_tags``)."""
ITEM_OPTIONS: Final[frozenset[str]] = ItemOptions.__optional_keys__
"""The option names an ``EnqueueArgs`` item may carry."""


def record_field(option: str) -> str:
    """The :class:`~taskq.records.EnqueueRequest` field ``option`` resolves to."""
    hint = typing.get_type_hints(ItemOptions, include_extras=True)[option]
    for mark in getattr(hint, "__metadata__", ()):
        if isinstance(mark, Stored):
            return mark.field
    return option


def check_option_names(options: Collection[str], accepted: frozenset[str], where: str) -> None:
    """``TypeError`` naming the options in ``options`` that ``where`` does not take."""
    if not accepted.issuperset(options):
        unknown = ", ".join(sorted(set(options) - accepted))
        raise TypeError(f"{where}: unknown option(s) {unknown}")
