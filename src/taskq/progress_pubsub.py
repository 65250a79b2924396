# sync twin: src/taskq_sync/progress_pubsub.py
"""Reading a job's progress channel without skipping a ``seq``: the two steps every
progress stream (``JobHandle.progress_stream()``, the SSE feed of :mod:`taskq.ops`)
shares, so the streams cannot drift apart.

* :func:`confirmed`: after ``SUBSCRIBE``, wait for Redis' confirmation before reading the
  row. The subscription only takes effect when Redis has run the command; a publish
  between the row read and that moment would be lost.
* :func:`pending`: when a quiet poll finds the row ended, read what is still on the
  channel first. The worker may have published events before that end that the stream
  has not read yet; jumping to the end would skip them.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from taskq.progress import ProgressEvent

__all__ = ["confirmed", "pending"]

_BARRIER = "taskq-progress-barrier"


async def confirmed(pubsub: Any) -> None:
    """Wait for Redis' confirmation of the stream's SUBSCRIBE (nothing is published to
    the connection before it)."""
    while True:
        message = await pubsub.get_message(timeout=None)
        if message is not None and message["type"] == "subscribe":
            return


async def pending(pubsub: Any, grace: float) -> AsyncIterator[ProgressEvent]:
    """The events on the channel that were published before now, then any that follow
    within ``grace`` seconds of each other (a worker publishes its last events after
    writing the row).

    A PING on the subscribed connection is the barrier: Redis runs one connection's
    commands in order and queues every message published before it ahead of the reply,
    so everything published before the call has been read when the ``pong`` arrives.
    """
    await pubsub.ping(_BARRIER)
    barrier = True
    while True:
        message = await pubsub.get_message(
            ignore_subscribe_messages=True, timeout=None if barrier else grace
        )
        if message is None:
            if barrier:
                continue
            return
        if message["type"] == "pong":
            barrier = False
            continue
        if message["type"] == "message":
            yield ProgressEvent.from_message(message["data"])
