"""The actor of ``benchmarks/throughput.py --otel``'s second workload: 1 ms of CPU per job.

Kept apart from ``benchmarks/otel_worker.py`` (which installs an SDK at import) so the
benchmark's own process can enqueue its jobs without one.
"""

from __future__ import annotations

import time

from pydantic import BaseModel

from taskq import actor

WORK_S = 0.001
"""The CPU time :func:`work` spends per job."""


class Work(BaseModel):
    """No fields: the cost is the actor's."""


@actor(name="bench_work_1ms")
async def work(payload: Work) -> None:
    """Spend :data:`WORK_S` of this thread's CPU (the same however loaded the machine is):
    a job that does something, next to the no-op one."""
    end = time.thread_time() + WORK_S
    while time.thread_time() < end:
        pass
