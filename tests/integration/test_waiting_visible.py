"""A job waiting on a limit is told apart from one scheduled for later on every surface:
the job record (``waiting``, ``state``), ``JobFilter(waiting=...)``, the CLI's
``taskq jobs list`` / ``get`` (and ``--waiting``), and the queue-depth reading.

The parked jobs are parked by a real worker (a keyed bucket that admits one job per
tenant and then nothing for a long while); the "later" one is a delayed enqueue.
"""

from __future__ import annotations

import asyncio
import os
import sys
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import BaseModel
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import JobFilter, actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.ratelimit import KeyedRateLimitRef, RateLimitRegistry
from taskq.records import JobRecord
from tests.support.workers import running_worker, wait_until, worker_settings

ROOT = Path(__file__).resolve().parents[2]


class Tenant(BaseModel):
    tenant: str
    n: int


SLOW_TENANT = KeyedRateLimitRef.typed(
    Tenant,
    base_name="visible.tenant",
    key_fn=lambda p: p.tenant,
    capacity=1,
    refill_per_second=0.001,  # one job, then the next token in ~17 minutes
    backend="memory",
)


@actor(name="visible_sync_tenant", queue="visible", rate_limits=[SLOW_TENANT])
async def sync_tenant(payload: Tenant) -> None:
    """One call per tenant, then a long wait."""


async def _record(client: JobsClient, job_id: Any) -> JobRecord:
    return await (await client.get(job_id)).refresh()


def _url(url: str | URL) -> str:
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)


async def _cli(url: str, *args: str) -> str:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env["TASKQ_SCHEMA_NAME"] = "taskq"
    proc = await asyncio.create_subprocess_exec(
        str(Path(sys.executable).with_name("taskq")),
        *args,
        "--database-url",
        url,
        env=env,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await proc.communicate()
    assert proc.returncode == 0, (out + err).decode()
    return out.decode()


async def test_waiting_is_distinct_from_scheduled_for_later(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    client = JobsClient(SqlBackend(engine))
    handles = await client.enqueue_many(
        [(sync_tenant, Tenant(tenant="acme", n=n)) for n in range(3)]
    )
    later = await client.enqueue(
        sync_tenant, Tenant(tenant="globex", n=0), delay=timedelta(hours=1)
    )
    ids = [h.job_id for h in handles]
    settings = worker_settings(engine_url, queues=("visible",))

    async def parked() -> bool:
        records = [await _record(client, i) for i in ids]
        return sum(r.status == "succeeded" for r in records) == 1 and all(
            r.status == "succeeded" or r.waiting_on == "visible.tenant:acme" for r in records
        )

    async with running_worker(
        settings, {sync_tenant.name: sync_tenant}, rate_limit_registry=RateLimitRegistry()
    ):
        await wait_until(parked)
    records = {i: await _record(client, i) for i in ids}
    waiting = {i for i, r in records.items() if r.status != "succeeded"}
    assert len(waiting) == 2

    # The record: same stored status, told apart by ``waiting`` / ``state``.
    for i in waiting:
        r = records[i]
        assert (r.status, r.waiting, r.state, r.attempt) == ("scheduled", True, "waiting", 0)
    r_later = await _record(client, later.job_id)
    assert (r_later.status, r_later.waiting, r_later.state) == ("scheduled", False, "scheduled")

    # The filter: waiting on a limit vs scheduled for later.
    mine = JobFilter(actor=sync_tenant.name)
    listed = await client.list(JobFilter(actor=sync_tenant.name, waiting=True))
    assert {j.id for j in listed.jobs} == waiting
    for_later = await client.list(
        JobFilter(actor=sync_tenant.name, status="scheduled", waiting=False)
    )
    assert [j.id for j in for_later.jobs] == [later.job_id]
    assert (await client.count(mine)).count == 4
    assert JobFilter(waiting=False).to_json() == {"waiting": False}

    # The CLI: the list shows the state, --waiting filters, get says what it waits on.
    url = _url(engine_url)
    out = await _cli(url, "jobs", "list", "--actor", sync_tenant.name)
    by_id = {line.split()[0]: line for line in out.splitlines()[1:] if line.strip()}
    for i in waiting:
        assert "waiting (scheduled)" in by_id[str(i)]
    assert "waiting" not in by_id[str(later.job_id)]
    assert " scheduled " in by_id[str(later.job_id)]
    out = await _cli(url, "jobs", "list", "--actor", sync_tenant.name, "--waiting")
    assert {line.split()[0] for line in out.splitlines()[1:] if line.strip()} == {
        str(i) for i in waiting
    }
    out = await _cli(url, "jobs", "list", "--actor", sync_tenant.name, "--not-waiting")
    assert {str(i) for i in waiting}.isdisjoint(out.split())
    one = next(iter(waiting))
    out = await _cli(url, "jobs", "get", str(one))
    assert "status:       waiting (scheduled)" in out
    assert "waiting_on:   visible.tenant:acme (denials 1)" in out
    out = await _cli(url, "jobs", "get", str(one), "--json")
    assert '"state": "waiting"' in out
    assert '"waiting": true' in out

    # The queue-depth reading (taskq.queue.depth{queue,status}): parked jobs are
    # ``waiting``, the delayed one ``scheduled``.
    depth = await _depth(engine)
    assert depth == {("visible", "waiting"): 2, ("visible", "scheduled"): 1}


async def _depth(engine: AsyncEngine) -> dict[tuple[str, str], int]:
    from taskq.db.engine import transaction
    from taskq.db.queries import worker as wq

    async with transaction(engine, readonly=True) as conn:
        rows = (await conn.execute(wq.queue_depth())).all()
    return {(q, s): int(n) for q, s, n in rows if q == "visible"}
