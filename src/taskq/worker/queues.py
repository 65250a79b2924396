"""Which queues a worker claims: the ones it was told, else the ones its actors use.

Without ``TASKQ_QUEUES`` / ``-q`` a worker claims the queues its actors are declared on
(``@actor(queue=...)``), so a worker started for an actor on queue ``emails`` claims
``emails``, not ``default``. With an explicit list, an actor whose queue is not on it
would never run from this worker: that is warned about at startup, naming the actor and
its queue (the list is kept: another worker may claim that queue).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import structlog

from taskq.actor import ActorRef
from taskq.settings import WorkerSettings

__all__ = ["claimed_queues"]

_log = structlog.get_logger("taskq.worker")


def claimed_queues(
    settings: WorkerSettings, actors: Mapping[str, ActorRef[Any, Any]]
) -> WorkerSettings:
    """``settings`` with the queues this worker claims filled in (see the module)."""
    if "queues" not in settings.model_fields_set:
        queues = tuple(sorted({ref.queue for ref in actors.values()}))
        return settings.model_copy(update={"queues": queues})
    claimed = set(settings.queues)
    for name, ref in sorted(actors.items()):
        if ref.queue not in claimed:
            _log.warning(
                "actor's queue is not claimed by this worker: its jobs will not run here",
                actor=name,
                queue=ref.queue,
                claimed=list(settings.queues),
            )
    return settings
