"""``BulkRows``: an ``enqueue_many`` of ``(actor, model)`` pairs held column by column.

When every item of an ``enqueue_many`` is an ``(actor, payload)`` pair, its payload an
instance of exactly the actor's model (nothing to validate) and the actor plain and
uncapped (nothing to check), each job differs from its actor's template
(:func:`~taskq.records.request_template`) only by its id and its payload. ``BulkRows``
holds those two columns and the templates. A backend that writes columns (the Postgres
``COPY``) writes each row as id, payload and its template's other fields, encoded once
per batch, and answers with :class:`BulkOutcomes`: the ids and one :class:`BulkRecords`
for the whole batch.

The other paths build a request, an outcome and a record factory per job, and keep each
one alive until the handles go. That is about three times the client's work per job, and
every object kept alive is work for the cyclic garbage collector. Any backend can still
ask for the requests (:meth:`BulkRows.requests`), with the same ids and payloads.

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from datetime import UTC, datetime
from typing import Any, overload
from uuid import UUID

from pydantic_core import from_json

from taskq._ids import new_uuid_ints, uuid_from_int
from taskq.records import (
    EnqueueOutcome,
    EnqueueRequest,
    JobRecord,
    SharedRecords,
    request_like,
)

__all__ = ["BulkOutcomes", "BulkRecords", "BulkRows", "DumpPayloads"]

DumpPayloads = Callable[[Sequence[Any]], list[bytes]]
"""An actor's :meth:`~taskq.actor.ActorRef.dump_payloads_json`: the JSON text of each
model's document."""


class BulkRows:
    """``size`` jobs: job ``i`` has the payload ``models[i]`` and every other column of
    ``templates[which[i]]`` (of ``templates[0]`` when ``which`` is ``None``); ``dumps[t]``
    dumps the models of template ``t``'s actor.

    The ids and the payload documents are made in order, on demand (:meth:`make`), each
    exactly once, so a backend that streams rows makes them a chunk at a time while the
    server inserts the chunk before. ``records`` is the batch's one record source, ready
    once a backend has written the rows (:class:`BulkOutcomes`).

    Both columns are held as what the garbage collector need not track: an id as its
    128-bit integer, a payload as its JSON text (the bytes the row stores). A batch of
    1,000 jobs then leaves no object per job for the cyclic collector, where ``UUID``
    objects and payload dicts made 2,000, each one more reason for a collection that also
    walks the caller's objects.
    """

    __slots__ = (
        "_dumps",
        "_models",
        "ids",
        "payloads",
        "records",
        "size",
        "templates",
        "which",
    )

    def __init__(
        self,
        models: Sequence[Any],
        templates: Sequence[EnqueueRequest],
        dumps: Sequence[DumpPayloads],
        which: list[int] | None = None,
    ) -> None:
        if which is not None and len(which) != len(models):
            raise ValueError("BulkRows: one template index per model")
        self._models = models
        self._dumps = dumps
        self.size = len(models)
        self.templates = tuple(templates)
        self.which = which
        self.ids: list[int] = []
        """The job ids made so far, in order, as integers (``UUID(int=...)``; time-ordered,
        as ``new_uuid_ints`` makes them)."""
        self.payloads: list[bytes] = []
        """The JSON text of the payload documents dumped so far, in order."""
        self.records = BulkRecords(self.ids, self.payloads, self.templates, which)

    def template_indexes(self, start: int, stop: int) -> Sequence[int]:
        """The template index of rows ``start`` to ``stop - 1``."""
        which = self.which
        return [0] * (stop - start) if which is None else which[start:stop]

    def make(self, stop: int) -> None:
        """Make the ids and payload documents of every row before ``stop`` not made yet
        (one dump call per actor). Whatever dumping raises is raised here, and the rows
        before the chunk it failed in stay made."""
        begin = len(self.payloads)
        if stop <= begin:
            return
        if self.which is None or len(self.templates) == 1:
            self.payloads += self._dumps[0](self._models[begin:stop])
        else:
            self.payloads += self._dump_grouped(begin, stop)
        self.ids += new_uuid_ints(stop - begin)
        if stop == self.size:  # every row is made: let the caller's models go
            self._models = ()

    def payloads_json(self, start: int, stop: int) -> list[bytes]:
        """The payloads of rows ``start`` to ``stop - 1`` as JSON (:meth:`make` first)."""
        self.make(stop)
        return self.payloads[start:stop]

    def _dump_grouped(self, begin: int, stop: int) -> list[bytes]:
        groups: dict[int, list[int]] = {}
        for row, template in enumerate(self.template_indexes(begin, stop), begin):
            groups.setdefault(template, []).append(row)
        out: list[bytes] = [b""] * (stop - begin)
        for template, rows in groups.items():
            dumped = self._dumps[template]([self._models[row] for row in rows])
            for row, document in zip(rows, dumped, strict=True):
                out[row - begin] = document
        return out

    def requests(self, start: int, stop: int) -> list[EnqueueRequest]:
        """The requests of rows ``start`` to ``stop - 1``, as the other paths insert them."""
        templates = self.templates
        return [
            request_like(templates[t], from_json(raw), uuid_from_int(job_id))
            for t, raw, job_id in zip(
                self.template_indexes(start, stop),
                self.payloads_json(start, stop),
                self.ids[start:stop],
                strict=True,
            )
        ]

    def counts(self) -> dict[tuple[str, str], int]:
        """How many jobs per ``(actor, queue)``."""
        if self.which is None:
            first = self.templates[0]
            return {(first.actor, first.queue): self.size}
        counts: Counter[tuple[str, str]] = Counter()
        for t, n in Counter(self.which).items():
            counts[self.templates[t].actor, self.templates[t].queue] += n
        return dict(counts)


class BulkRecords(SharedRecords):
    """The job records of the rows of a :class:`BulkRows` once a backend has written them
    at the store's clock reading ``now`` (pending, to run now, no deadline): one object
    for the whole batch, each record built when its handle first asks. Each equals a
    re-read of its row, as :func:`~taskq.db.queries.copy_rows.copied_records`' do.

    It holds the rows' columns (``ids`` and ``payloads``, the lists the rows fill in),
    not the rows: no reference cycle, so a batch is freed as soon as its handles go. A
    record's payload is parsed from the JSON the row stores, a new dict each time.
    """

    __slots__ = ("_ids", "_index", "_now", "_payloads", "_templates", "_which")

    def __init__(
        self,
        ids: list[int],
        payloads: list[bytes],
        templates: tuple[EnqueueRequest, ...],
        which: list[int] | None,
    ) -> None:
        self._ids = ids
        self._payloads = payloads
        self._templates = templates
        self._which = which
        self._now: datetime | None = None
        self._index: dict[int, int] | None = None

    def written(self, now: datetime) -> None:
        """The rows were written at the clock reading ``now``."""
        self._now = now.astimezone(UTC)

    def record_of(self, job_id: UUID) -> JobRecord:
        """The record of the job ``job_id`` (``KeyError`` if it is not one of the batch)."""
        now = self._now
        if now is None:
            raise RuntimeError("BulkRecords: the rows have not been written")
        index = self._index
        if index is None:
            index = self._index = {job: row for row, job in enumerate(self._ids)}
        row = index[job_id.int]
        template = self._templates[0 if self._which is None else self._which[row]]
        request = request_like(template, from_json(self._payloads[row]), job_id)
        return JobRecord.inserted(request, scheduled_at=now, deadline_at=None, created_at=now)


class BulkOutcomes(Sequence[EnqueueOutcome]):
    """What a bulk write did: every job inserted, ids in order (``job_ids``, as integers),
    records from one :class:`BulkRecords`. Indexing builds an
    :class:`~taskq.records.EnqueueOutcome`; ``JobsClient`` reads ``job_ids`` and
    ``records`` instead."""

    __slots__ = ("counts", "job_ids", "records")

    def __init__(self, rows: BulkRows, now: datetime) -> None:
        rows.make(rows.size)
        rows.records.written(now)
        self.job_ids = rows.ids
        self.records = rows.records
        self.counts = rows.counts()
        """How many jobs per ``(actor, queue)``, every one created."""

    def __len__(self) -> int:
        return len(self.job_ids)

    @overload
    def __getitem__(self, index: int) -> EnqueueOutcome: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[EnqueueOutcome]: ...

    def __getitem__(self, index: int | slice) -> EnqueueOutcome | Sequence[EnqueueOutcome]:
        if isinstance(index, slice):
            return [self._outcome(job_id) for job_id in self.job_ids[index]]
        return self._outcome(self.job_ids[index])

    def __iter__(self) -> Iterator[EnqueueOutcome]:
        return (self._outcome(job_id) for job_id in self.job_ids)

    def _outcome(self, job_id: int) -> EnqueueOutcome:
        return EnqueueOutcome(self.records, job_id=uuid_from_int(job_id))
