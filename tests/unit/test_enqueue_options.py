"""The enqueue options are declared once (``taskq.enqueue_options``): the surfaces'
signatures, the names each one accepts, ``build_request``'s keywords and the
``EnqueueRequest`` fields they resolve to all come from, or are held to, that one
definition. An option added in one of these places but not the others fails here."""

from __future__ import annotations

import dataclasses
import inspect
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import uuid4

import pytest
from pydantic import BaseModel

import taskq_sync.client
from taskq import actor
from taskq.client import JobsClient
from taskq.context import SubJobEnqueuer
from taskq.enqueue_options import (
    ENQUEUE_OPTIONS,
    ITEM_OPTIONS,
    SUB_JOB_OPTIONS,
    EnqueueOptions,
    ItemOptions,
    SubJobOptions,
    record_field,
)
from taskq.records import EnqueueArgs, EnqueueRequest, build_request
from taskq.testing.in_memory import InMemoryBackend
from taskq.worker.subjobs import AutonomousCounter, SubJobs


class Item(BaseModel):
    n: int


@actor(name="enqueue_options_plain")
async def plain(payload: Item) -> None: ...


_FROM_THE_ACTOR = frozenset(
    {
        "job_id",
        "actor",
        "payload",
        "singleton",
        "max_attempts",
        "unique_states",
        "max_pending_per_call",
        "trace_context",
    }
)
"""``EnqueueRequest`` fields no option sets: the actor's, the payload, the call's."""

_SAMPLES: dict[str, Any] = {
    "queue": "elsewhere",
    "priority": 7,
    "scheduled_at": datetime(2030, 1, 1, tzinfo=UTC),
    "delay": timedelta(seconds=30),
    "identity_key": "ident",
    "idempotency_key": "once",
    "tags": ["a", "b"],
    "metadata": {"k": "v"},
    "start_to_close": timedelta(seconds=5),
    "schedule_to_close": timedelta(minutes=5),
    "unique_for": timedelta(minutes=1),
    "max_pending": 3,
    "parent_job_id": uuid4(),
}
"""A value for every option, different from what leaving it out resolves to."""


def _keywords(fn: Callable[..., Any]) -> set[str]:
    params = inspect.signature(fn).parameters.values()
    return {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}


def _options_annotation(fn: Callable[..., Any]) -> object:
    params = inspect.signature(fn).parameters.values()
    [var] = [p for p in params if p.kind is inspect.Parameter.VAR_KEYWORD]
    return var.annotation


def test_each_surfaces_names_are_its_typed_dicts_keys() -> None:
    assert EnqueueOptions.__optional_keys__ == ENQUEUE_OPTIONS
    assert SubJobOptions.__optional_keys__ == SUB_JOB_OPTIONS
    assert ItemOptions.__optional_keys__ == ITEM_OPTIONS
    assert ENQUEUE_OPTIONS < SUB_JOB_OPTIONS < ITEM_OPTIONS
    assert {"unique_for", "max_pending"} == SUB_JOB_OPTIONS - ENQUEUE_OPTIONS
    assert {"parent_job_id"} == ITEM_OPTIONS - SUB_JOB_OPTIONS


def test_the_signatures_take_their_options_from_the_definition() -> None:
    for enqueue in (JobsClient.enqueue, taskq_sync.client.JobsClient.enqueue):
        assert _keywords(enqueue) == {"connection"}
        assert _options_annotation(enqueue) == "Unpack[EnqueueOptions]"
    for sub_enqueue in (SubJobs.enqueue, SubJobEnqueuer.enqueue):
        assert _keywords(sub_enqueue) == {"inherit_tags"}
        assert _options_annotation(sub_enqueue) == "Unpack[SubJobOptions]"


def test_build_request_takes_every_item_option_and_nothing_else() -> None:
    assert _keywords(build_request) - {"job_id"} == ITEM_OPTIONS


def test_every_record_field_is_an_options_or_the_actors() -> None:
    fields = {f.name for f in dataclasses.fields(EnqueueRequest)}
    stored = {record_field(option) for option in ITEM_OPTIONS}
    assert stored <= fields
    assert len(stored) == len(ITEM_OPTIONS)  # one field per option
    assert fields - stored == _FROM_THE_ACTOR


def test_build_request_resolves_each_option_into_its_field() -> None:
    assert set(_SAMPLES) == ITEM_OPTIONS  # a new option needs a sample here
    default = build_request(plain, Item(n=1))
    for option, value in _SAMPLES.items():
        made = build_request(plain, Item(n=1), **{option: value})
        name = record_field(option)
        assert getattr(made, name) != getattr(default, name), option
        made_none = build_request(plain, Item(n=1), **{option: None})
        assert getattr(made_none, name) == getattr(default, name), option  # None: not given


async def test_enqueue_refuses_what_only_a_sub_job_or_an_item_takes() -> None:
    backend = InMemoryBackend()
    client = JobsClient(backend)
    for option in sorted(ITEM_OPTIONS - ENQUEUE_OPTIONS):
        bad: Any = {option: _SAMPLES[option]}
        with pytest.raises(TypeError, match=f"enqueue: unknown option\\(s\\) {option}"):
            await client.enqueue(plain, Item(n=1), **bad)
    with pytest.raises(TypeError, match="enqueue_many item 0: unknown option\\(s\\) job_id"):
        await client.enqueue_many([EnqueueArgs(plain, Item(n=1), {"job_id": uuid4()})])  # type: ignore[arg-type]
    assert backend.jobs == {}
    handle = await client.enqueue(plain, Item(n=1), priority=2, tags=["t"])
    record = await backend.get_job(handle.job_id)
    assert record is not None
    assert (record.priority, list(record.tags)) == (2, ["t"])


async def test_a_sub_job_takes_its_options_and_refuses_the_parents() -> None:
    parent = uuid4()
    jobs = SubJobs(
        JobsClient(InMemoryBackend()),
        parent,
        parent_actor="p",
        transactional=True,
        counter=AutonomousCounter(reason="test"),
    )
    for option in ("parent_job_id", "job_id"):
        bad: Any = {option: uuid4()}
        with pytest.raises(TypeError, match=f"ctx.jobs.enqueue: unknown option\\(s\\) {option}"):
            await jobs.enqueue(plain, Item(n=1), inherit_tags=False, **bad)
    window = timedelta(minutes=2)
    await jobs.enqueue(plain, Item(n=1), inherit_tags=False, unique_for=window, tags=["x"])
    [(args, request)] = jobs.buffer
    assert (request.unique_for, request.tags, request.parent_job_id) == (window, ("x",), parent)
    assert args.options == {"unique_for": window, "parent_job_id": parent, "tags": ["x"]}
