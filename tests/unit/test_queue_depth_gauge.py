"""``taskq.queue.depth``: what the gauge reports from the leaders' readings
(``taskq.worker.telemetry.publish_queue_depth``), read through an in-memory SDK."""

from __future__ import annotations

from typing import Any

from taskq.worker.telemetry import publish_queue_depth
from tests.support.otel import otel


def _depth(queue: str) -> dict[tuple[Any, ...], int]:
    return otel().points("taskq.queue.depth", queue=queue)


def test_a_reading_replaces_the_last_and_a_vanished_queue_reads_zero(unique_name: str) -> None:
    leader = object()
    a, b = f"{unique_name}_a", f"{unique_name}_b"
    publish_queue_depth(leader, [(a, "pending", 3), (a, "scheduled", 2), (b, "pending", 1)])
    assert _depth(a) == {(("status", "pending"),): 3, (("status", "scheduled"),): 2}
    assert _depth(b) == {(("status", "pending"),): 1}
    publish_queue_depth(leader, [(a, "pending", 1)])
    assert _depth(a) == {(("status", "pending"),): 1, (("status", "scheduled"),): 0}
    assert _depth(b) == {(("status", "pending"),): 0}
    publish_queue_depth(leader, None)


def test_only_the_worker_that_reported_withdraws_it(unique_name: str) -> None:
    leader, follower = object(), object()
    publish_queue_depth(leader, [(unique_name, "pending", 5)])
    publish_queue_depth(follower, None)  # another worker of the process: not the leader
    assert _depth(unique_name) == {(("status", "pending"),): 5}
    publish_queue_depth(leader, None)  # it lost the lease: nothing is reported any more
    assert _depth(unique_name) == {}
