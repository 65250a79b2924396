"""``RequestBatch``: the requests of one enqueue, made a chunk at a time on demand.

Making an ``enqueue_many`` request (validating and dumping its payload, giving it an id)
costs the client about as much time as the server spends inserting the row. A backend
that streams rows (the Postgres COPY) asks for the requests one chunk at a time and
sends each chunk before the next is made, so the two overlap instead of following each
other. Requests are made in order, so the first bad item still raises first; a backend
that streams must write nothing when making a later chunk raises (its transaction rolls
back).

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence

from taskq.bulk_rows import BulkRows
from taskq.records import EnqueueRequest

__all__ = ["RequestBatch"]

MakeRequests = Callable[[int, int], list[EnqueueRequest]]
"""``make(start, stop)``: the requests of items ``start`` to ``stop - 1``, in order."""


class RequestBatch:
    """``size`` requests, made by ``make`` in order, each exactly once.

    ``plain``, ``actors`` and ``queues`` are what is known before any request is made:
    when ``plain`` is true, every request the batch makes is
    :attr:`~taskq.records.EnqueueRequest.uncapped_plain`, its actor is one of ``actors``
    and its queue one of ``queues`` (sorted). When it is false, nothing is known until
    the requests are made, and ``actors``/``queues`` are empty.

    ``bulk``, when set (only with ``plain``), holds the same jobs column by column
    (:class:`~taskq.bulk_rows.BulkRows`): a backend may write those instead of asking
    for the requests, which ``make`` then builds from it (same ids, same payloads).
    """

    __slots__ = ("_made", "_make", "actors", "bulk", "plain", "queues", "size")

    def __init__(
        self,
        size: int,
        make: MakeRequests,
        *,
        plain: bool = False,
        actors: frozenset[str] = frozenset(),
        queues: Iterable[str] = (),
        bulk: BulkRows | None = None,
    ) -> None:
        if bulk is not None and not (plain and bulk.size == size):
            raise ValueError("RequestBatch: bulk rows need a plain batch of the same size")
        self.size = size
        self._make = make
        self._made: list[EnqueueRequest] = []
        self.plain = plain
        self.actors = actors if plain else frozenset()
        self.queues: tuple[str, ...] = tuple(sorted(queues)) if plain else ()
        self.bulk = bulk

    @classmethod
    def of(cls, requests: Sequence[EnqueueRequest]) -> RequestBatch:
        """A batch of requests already made (what is known is read off them)."""
        made = list(requests)
        batch = cls(
            len(made),
            _made_already,
            plain=all([req.uncapped_plain for req in made]),
            actors=frozenset({req.actor for req in made}),
            queues={req.queue for req in made},
        )
        batch._made = made
        return batch

    @property
    def made(self) -> list[EnqueueRequest]:
        """The requests made so far, in order."""
        return self._made

    def chunks(self, rows: int, *, first: int | None = None) -> Iterator[list[EnqueueRequest]]:
        """Every request, ``rows`` at a time (the first chunk ``first`` at most): first
        those already made, then the rest, each chunk made when it is asked for. Whatever
        making a chunk raises is raised here, and the requests before it stay made."""
        size = first or rows
        start = 0
        while start < self.size:
            stop = min(start + size, self.size)
            if stop > len(self._made):
                self._made += self._make(len(self._made), stop)
            yield self._made[start:stop]
            start, size = stop, rows

    def all(self) -> list[EnqueueRequest]:
        """Every request, making those not made yet (in one go)."""
        if len(self._made) < self.size:
            self._made += self._make(len(self._made), self.size)
        return self._made


def _made_already(start: int, stop: int) -> list[EnqueueRequest]:
    raise AssertionError("RequestBatch.of: every request is made already")
