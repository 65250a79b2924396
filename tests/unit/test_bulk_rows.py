"""``BulkRows`` (an ``enqueue_many`` of model pairs held column by column), its records and
outcomes, and its COPY encoding, checked against the per-request path they stand for."""

from __future__ import annotations

import gc
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from pydantic import BaseModel
from pydantic_core import to_json

from taskq import actor
from taskq._ids import new_job_ids, uuid_from_int
from taskq.bulk_rows import BulkOutcomes, BulkRows
from taskq.db.queries import copy_rows as q
from taskq.handle import JobHandle, JobHandles
from taskq.records import (
    EnqueueOutcome,
    EnqueueRequest,
    JobRecord,
    build_request,
    request_template,
)

NOW = datetime(2026, 5, 6, 7, 8, 9, 123456, tzinfo=UTC)


class Doc(BaseModel):
    n: int
    text: str = "é\\\t\"'"


@actor(name="bulk_a", queue="bulk_q", priority=3, start_to_close=timedelta(seconds=7))
async def bulk_a(payload: Doc) -> None: ...


@actor(name="bulk_b")
async def bulk_b(payload: Doc) -> Doc:
    return payload


class Dumps:
    """An actor's ``dump_payloads_json`` that records how many models each call dumped."""

    def __init__(self, ref: Any) -> None:
        self.ref = ref
        self.calls: list[int] = []

    def __call__(self, models: Any) -> list[bytes]:
        self.calls.append(len(models))
        dumped: list[bytes] = self.ref.dump_payloads_json(models)
        return dumped


def _two_actor_rows(size: int) -> tuple[BulkRows, list[Doc], list[Any], list[Dumps]]:
    """Rows alternating a, a, b; with the models, the actor of each row and the dumps."""
    refs: list[Any] = [bulk_b if i % 3 == 2 else bulk_a for i in range(size)]
    models = [Doc(n=i) for i in range(size)]
    dumps = [Dumps(bulk_a), Dumps(bulk_b)]
    templates = [request_template(bulk_a), request_template(bulk_b)]
    which = [1 if ref is bulk_b else 0 for ref in refs]
    return BulkRows(models, templates, dumps, which), models, refs, dumps


def _as_built(ref: Any, model: Doc, job_id: Any) -> EnqueueRequest:
    """The request ``enqueue`` builds for ``model`` (every option checked one by one)."""
    return build_request(ref, model, job_id=job_id)


def test_requests_are_the_ones_build_request_makes_with_the_same_ids() -> None:
    rows, models, refs, _ = _two_actor_rows(10)
    made = rows.requests(0, 4) + rows.requests(4, 10)
    assert len(rows.ids) == 10
    assert rows.ids == sorted(rows.ids)  # time-ordered across chunks
    assert made == [
        _as_built(ref, model, uuid_from_int(job_id))
        for ref, model, job_id in zip(refs, models, rows.ids, strict=True)
    ]


def _json(models: list[Doc]) -> list[bytes]:
    """The JSON text the per-request path stores for ``models``."""
    return [to_json(m.model_dump(mode="json")) for m in models]


def test_documents_are_dumped_once_in_order_one_call_per_actor_and_chunk() -> None:
    rows, models, _, dumps = _two_actor_rows(9)
    assert rows.payloads_json(0, 3) == _json(models[:3])
    assert [d.calls for d in dumps] == [[2], [1]]
    assert rows.payloads_json(1, 2) == _json(models[1:2])  # nothing dumped again
    assert rows.payloads_json(0, 9) == _json(models)
    assert [d.calls for d in dumps] == [[2, 4], [1, 2]]
    assert rows.requests(0, 9)[8].payload == {"n": 8, "text": models[8].text}
    assert [d.calls for d in dumps] == [[2, 4], [1, 2]]


def test_one_actor_needs_no_template_index() -> None:
    models = [Doc(n=i) for i in range(5)]
    dumps = Dumps(bulk_a)
    rows = BulkRows(models, [request_template(bulk_a)], [dumps])
    assert rows.template_indexes(1, 4) == [0, 0, 0]
    assert rows.counts() == {("bulk_a", "bulk_q"): 5}
    assert [r.actor for r in rows.requests(0, 5)] == ["bulk_a"] * 5
    assert dumps.calls == [5]


def test_counts_per_actor_and_queue() -> None:
    rows, *_ = _two_actor_rows(10)
    assert rows.counts() == {("bulk_a", "bulk_q"): 7, ("bulk_b", "default"): 3}


def test_rows_need_one_template_index_per_model() -> None:
    template = [request_template(bulk_a)]
    with pytest.raises(ValueError, match="one template index"):
        BulkRows([Doc(n=1)], template, [bulk_a.dump_payloads_json], which=[0, 0])


def test_a_failing_dump_keeps_the_documents_before_it() -> None:
    calls = 0

    def dump(models: Any) -> list[bytes]:
        nonlocal calls
        calls += 1
        if calls == 2:
            raise RuntimeError("cannot serialise")
        dumped: list[bytes] = bulk_a.dump_payloads_json(models)
        return dumped

    models = [Doc(n=i) for i in range(6)]
    rows = BulkRows(models, [request_template(bulk_a)], [dump])
    assert len(rows.payloads_json(0, 2)) == 2
    with pytest.raises(RuntimeError, match="cannot serialise"):
        rows.payloads_json(2, 6)
    assert len(rows.payloads) == len(rows.ids) == 2


def test_bulk_encoding_is_the_per_request_encoding() -> None:
    """The same bytes as the encoder makes of the requests the rows stand for, for two
    actors with different shapes, in chunks."""
    rows, _, _, _ = _two_actor_rows(12)
    requests = rows.requests(0, 12)
    encoder = q.CopyEncoder(NOW)
    tails = [encoder.row_tail(t) for t in rows.templates]
    bulk = b"".join(
        encoder.encode_bulk(
            rows.ids[start:stop],
            rows.payloads[start:stop],
            [tails[t] for t in rows.template_indexes(start, stop)],
        )
        for start, stop in ((0, 5), (5, 12))
    )
    assert bulk == q.CopyEncoder(NOW).encode(requests)


def test_a_template_with_a_trace_context_encodes_it_in_every_row() -> None:
    template = request_template(bulk_a)
    template.trace_context = {"traceparent": "00-" + "1" * 32 + "-" + "2" * 16 + "-01"}
    rows = BulkRows([Doc(n=1), Doc(n=2)], [template], [bulk_a.dump_payloads_json])
    encoder = q.CopyEncoder(NOW)
    tail = encoder.row_tail(template)
    payloads = rows.payloads_json(0, 2)
    data = encoder.encode_bulk(rows.ids, payloads, [tail, tail])
    assert data == q.CopyEncoder(NOW).encode(rows.requests(0, 2))
    assert b"traceparent" in data


def test_outcomes_and_records_are_what_copied_records_give() -> None:
    rows, *_ = _two_actor_rows(7)
    with pytest.raises(RuntimeError, match="not been written"):
        rows.records.record_of(new_job_ids(1)[0])
    outcomes = BulkOutcomes(rows, NOW)  # makes what was not made yet
    expected = q.copied_records(rows.requests(0, 7), NOW)
    assert len(outcomes) == 7
    assert outcomes.job_ids == rows.ids
    assert outcomes.counts == rows.counts()
    for outcome, source, job_id in zip(outcomes, expected, rows.ids, strict=True):
        assert isinstance(outcome, EnqueueOutcome)
        assert outcome.job_id == uuid_from_int(job_id)
        assert not outcome.was_existing
        assert not outcome.deduplicated_onto_terminal
        assert callable(source)
        assert outcome.record == source()
        assert isinstance(outcome.record, JobRecord)
    assert [o.job_id.int for o in outcomes[2:5]] == rows.ids[2:5]
    assert outcomes[-1].record.actor == "bulk_a"
    assert outcomes.records.record_of(uuid_from_int(rows.ids[2])).actor == "bulk_b"
    with pytest.raises(KeyError):
        outcomes.records.record_of(new_job_ids(1)[0])


def test_records_keep_the_documents_not_the_callers_models() -> None:
    """A model changed after the enqueue does not change the record of what was written."""
    rows, models, _, _ = _two_actor_rows(3)
    outcomes = BulkOutcomes(rows, NOW)
    models[0].n = 1000
    assert outcomes[0].record.payload["n"] == 0
    assert outcomes[0].record.created_at == NOW == outcomes[0].record.scheduled_at


def test_a_batch_keeps_no_object_per_job_for_the_cyclic_collector() -> None:
    """Ids are held as integers and payloads as JSON text: nothing the collector tracks,
    so a large batch does not bring on collections that walk the caller's objects."""
    rows, *_ = _two_actor_rows(50)
    rows.make(50)
    assert len(rows.ids) == len(rows.payloads) == 50
    assert not any(gc.is_tracked(value) for value in [*rows.ids, *rows.payloads])
    assert rows.ids == [job_id.int for job_id in (o.job_id for o in BulkOutcomes(rows, NOW))]


def test_a_written_batch_is_freed_without_the_cyclic_collector() -> None:
    """Nothing of a batch refers back to itself (rows, records, outcomes), so its ids and
    documents go as soon as the last handle does, not at a full collection."""

    def write_and_read() -> None:
        rows, *_ = _two_actor_rows(300)
        rows.make(300)
        outcomes = BulkOutcomes(rows, NOW)
        assert outcomes[5].record.payload["n"] == 5
        assert outcomes.records is rows.records

    write_and_read()
    gc.collect()
    gc.disable()
    try:
        write_and_read()
        assert gc.collect() == 0
    finally:
        gc.enable()


def test_job_handles_make_each_handle_once_on_first_read() -> None:
    rows, _, refs, _ = _two_actor_rows(6)
    outcomes = BulkOutcomes(rows, NOW)
    backend: Any = object()  # never called: nothing here reads the store
    handles = JobHandles(backend, refs, outcomes.job_ids, outcomes.records)
    assert len(handles) == 6
    assert repr(handles) == "<JobHandles of 6 jobs>"
    assert handles._made is None  # nothing made before it is read
    third = handles[2]
    assert isinstance(third, JobHandle)
    assert third is handles[2] is handles[-4]
    assert third.job_id == uuid_from_int(rows.ids[2])
    assert third.result_adapter is bulk_b.result_adapter
    assert handles[0].result_adapter is bulk_a.result_adapter
    assert third.record == outcomes[2].record
    assert handles[1:4] == [handles[1], third, handles[3]]
    assert handles[::-2] == [handles[5], handles[3], handles[1]]
    assert [h.job_id.int for h in handles] == rows.ids
    assert list(handles) == [handles[i] for i in range(6)]
    assert handles.index(third) == 2
    assert third in handles
    for bad in (6, -7):
        with pytest.raises(IndexError):
            handles[bad]
    with pytest.raises(ValueError, match="one actor per job id"):
        JobHandles(backend, refs[:5], outcomes.job_ids, outcomes.records)
