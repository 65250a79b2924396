"""``running_identities`` is the dispatch-time backstop of ``unique_for``: a plain
``unique_for`` actor (no ``max_concurrent``) does not start a job whose
``(actor, identity_key)`` already runs; the other actors' claim is untouched.

A second ready job for a running identity is what a cross-window race leaves behind (it
was enqueued while the first one's dedupe did not see it); the test makes one by giving
a new job the running job's identity in the store.
"""

from __future__ import annotations

import asyncio
from datetime import timedelta

from pydantic import BaseModel
from sqlalchemy import update
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq import actor
from taskq.backends.sql import SqlBackend
from taskq.client import JobsClient
from taskq.db.tables import jobs
from tests.support.workers import running_worker, wait_until, worker_settings


class Account(BaseModel):
    account: str
    n: int


_release: list[asyncio.Event] = []  # made in each test's own event loop
_started: list[tuple[str, int]] = []
_running: dict[str, int] = {}
_most: dict[str, int] = {}


async def _run(payload: Account) -> None:
    _started.append((payload.account, payload.n))
    _running[payload.account] = _running.get(payload.account, 0) + 1
    _most[payload.account] = max(_most.get(payload.account, 0), _running[payload.account])
    try:
        await _release[0].wait()
    finally:
        _running[payload.account] -= 1


@actor(name="backstop_sync_account", queue="backstop", unique_for=timedelta(minutes=5))
async def sync_account(payload: Account) -> None:
    """Deduplicated per account for five minutes."""
    await _run(payload)


@actor(name="backstop_plain", queue="backstop")
async def plain(payload: Account) -> None:
    """No unique_for: two jobs of one identity may run at once."""
    await _run(payload)


async def test_a_running_identity_holds_back_its_twin(
    engine: AsyncEngine, engine_url: str | URL
) -> None:
    _release[:] = [asyncio.Event()]
    _started.clear()
    _running.clear()
    _most.clear()
    client = JobsClient(SqlBackend(engine))
    first = await client.enqueue(sync_account, Account(account="u1", n=1), identity_key="u1")
    other = await client.enqueue(sync_account, Account(account="u2", n=1), identity_key="u2")
    plain_first = await client.enqueue(plain, Account(account="p", n=0), identity_key="p")
    actors = {sync_account.name: sync_account, plain.name: plain}
    async with running_worker(worker_settings(engine_url, queues=("backstop",)), actors):
        await wait_until(lambda: _count(3))  # u1, u2 and the plain one run
        # What a cross-window race leaves: a second ready job for a running identity.
        twin = await client.enqueue(
            sync_account, Account(account="u1", n=2), identity_key="t", delay=timedelta(hours=1)
        )
        plain_twin = await client.enqueue(
            plain, Account(account="p", n=1), identity_key="t2", delay=timedelta(hours=1)
        )
        async with engine.begin() as conn:
            for job_id, key in ((twin.job_id, "u1"), (plain_twin.job_id, "p")):
                await conn.execute(
                    update(jobs)
                    .where(jobs.c.id == job_id)
                    .values(identity_key=key, scheduled_at=jobs.c.created_at)
                )
        # The plain actor has no backstop: its twin starts next to the running job.
        await wait_until(lambda: _count(4))
        assert _started[3] == ("p", 1)
        for _ in range(10):  # several more claim rounds while u1 runs
            await asyncio.sleep(0.05)
        assert ("u1", 2) not in _started
        assert (await (await client.get(twin.job_id)).refresh()).attempt == 0
        _release[0].set()
        await first.wait(timeout=30)
        await twin.wait(timeout=30)
        await other.wait(timeout=30)
        await plain_first.wait(timeout=30)
        await plain_twin.wait(timeout=30)
    assert _started[4] == ("u1", 2)  # only once u1's first job had finished
    assert _most == {"u1": 1, "u2": 1, "p": 2}


async def _count(n: int) -> bool:
    return len(_started) >= n
