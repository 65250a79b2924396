"""Concurrency: 50 acquirers on capacity 10 get exactly 10; slots=3 never has 4 holders.

As asyncio tasks, as threads through the sync facade, and as 4 real processes.
"""

from __future__ import annotations

import asyncio
import threading
import uuid
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from multiprocessing import get_context

import pytest
from sqlalchemy.engine import URL

from taskq.exceptions import ReservationUnavailable
from tests.integration.ratelimit import _procs
from tests.integration.ratelimit.conftest import Env, call

pytestmark = pytest.mark.integration
N = 50


def _as_str(url: str | URL | None) -> str:
    assert url is not None
    return url if isinstance(url, str) else url.render_as_string(hide_password=False)


@pytest.mark.parametrize("flavour", ["async"])
async def test_fifty_tasks_take_exactly_ten(env: Env, unique_name: str) -> None:
    for round_ in range(1 if env.store == "sqlite" else 3):  # SQLite writers queue: slow
        tb = env.rl.TokenBucket(
            f"{unique_name}_{round_}", capacity=10, refill_per_second=0, backend=env.backend
        )
        decisions = await asyncio.gather(*(tb.acquire(**env.kw) for _ in range(N)))
        assert sum(d.allowed for d in decisions) == 10


@pytest.mark.parametrize("flavour", ["sync"])
async def test_fifty_threads_take_exactly_ten_through_the_sync_facade(
    env: Env, unique_name: str
) -> None:
    tb = env.rl.TokenBucket(unique_name, capacity=10, refill_per_second=0, backend=env.backend)
    start = threading.Barrier(N)

    def acquire() -> bool:
        start.wait()
        return bool(tb.acquire(**env.kw).allowed)

    with ThreadPoolExecutor(N) as pool:
        results = await asyncio.to_thread(lambda: list(pool.map(lambda _: acquire(), range(N))))
    assert sum(results) == 10


@pytest.mark.parametrize("flavour", ["async"])
async def test_fifty_tasks_never_hold_more_than_three_slots(
    slot_env: Env, unique_name: str
) -> None:
    env = slot_env
    res = env.reservation(unique_name, slots=3, lease=60)
    holding = 0
    peak = 0
    won = 0

    async def worker() -> None:
        nonlocal holding, peak, won
        w = uuid.uuid4()
        # SQLite writers queue on one lock (busy-wait): its churn runs in the thread test.
        for _ in range(0 if env.store == "sqlite" else 2):
            try:
                slot = await res.acquire(uuid.uuid4(), w, env.pool)
            except ReservationUnavailable:
                await asyncio.sleep(0)
                continue
            holding += 1
            won += 1
            peak = max(peak, holding)
            assert slot in range(3)
            await asyncio.sleep(0.001)
            holding -= 1
            await res.release(slot, w, env.pool)

    await asyncio.gather(*(worker() for _ in range(N)))
    assert peak <= 3
    assert won >= (0 if env.store == "sqlite" else 3)
    # without releases, exactly three of fifty win, on three distinct slots
    grab = env.reservation(unique_name + "_grab", slots=3, lease=60)

    async def one() -> int | None:
        try:
            slot: int = await grab.acquire(None, uuid.uuid4(), env.pool)
            return slot
        except ReservationUnavailable:
            return None

    got = [g for g in await asyncio.gather(*(one() for _ in range(N))) if g is not None]
    assert sorted(got) == [0, 1, 2]


@pytest.mark.parametrize("flavour", ["sync"])
async def test_fifty_threads_never_hold_more_than_three_slots(
    slot_env: Env, unique_name: str
) -> None:
    env = slot_env
    res = env.reservation(unique_name, slots=3, lease=60)
    lock = threading.Lock()
    state = {"holding": 0, "peak": 0, "won": 0}
    start = threading.Barrier(N)

    def worker() -> None:
        w = uuid.uuid4()
        start.wait()
        for _ in range(2):
            try:
                slot = res.acquire(uuid.uuid4(), w, env.pool)
            except ReservationUnavailable:
                continue
            with lock:
                state["holding"] += 1
                state["won"] += 1
                state["peak"] = max(state["peak"], state["holding"])
            with lock:
                state["holding"] -= 1
            res.release(slot, w, env.pool)

    def run_all() -> None:
        with ThreadPoolExecutor(N) as pool:
            for f in [pool.submit(worker) for _ in range(N)]:
                f.result()

    await asyncio.to_thread(run_all)
    assert state["peak"] <= 3
    assert state["won"] >= 3
    assert await call(res.held(env.pool)) == []


def test_four_processes(pg_url: URL, redis_url: str, unique_name: str) -> None:
    """4 processes x 12-13 concurrent acquirers: Redis and Postgres buckets, Postgres slots."""
    ctx = get_context("fork")  # the parent holds no connections the children use
    shares = [13, 13, 12, 12]
    pg = _as_str(pg_url)
    with ProcessPoolExecutor(
        4, mp_context=ctx, initializer=_procs.init, initargs=(ctx.Barrier(4),)
    ) as pool:
        for store, url in (("redis", redis_url), ("postgres", pg)):
            name = f"{unique_name}_{store}"
            results = list(
                pool.map(_procs.bucket_worker, [store] * 4, [url] * 4, [name] * 4, shares)
            )
            assert len({pid for pid, _ in results}) == 4
            assert sum(allowed for _, allowed in results) == 10
        won = list(pool.map(_procs.slots_worker, [pg] * 4, [unique_name] * 4, shares))
    assert len({pid for pid, _ in won}) == 4
    assert sorted(s for _, part in won for s in part) == [0, 1, 2]


def test_four_processes_on_one_sqlite_file(sqlite_url: str, unique_name: str) -> None:
    """The same 4-process race on the embedded engine: one SQLite file, the SQL bucket and
    slots serialised by ``BEGIN IMMEDIATE`` across processes (not only across threads)."""
    ctx = get_context("fork")
    shares = [13, 13, 12, 12]
    with ProcessPoolExecutor(
        4, mp_context=ctx, initializer=_procs.init, initargs=(ctx.Barrier(4),)
    ) as pool:
        results = list(
            pool.map(
                _procs.bucket_worker, ["sqlite"] * 4, [sqlite_url] * 4, [unique_name] * 4, shares
            )
        )
        assert len({pid for pid, _ in results}) == 4
        assert sum(allowed for _, allowed in results) == 10
        won = list(pool.map(_procs.slots_worker, [sqlite_url] * 4, [unique_name] * 4, shares))
    assert len({pid for pid, _ in won}) == 4
    assert sorted(s for _, part in won for s in part) == [0, 1, 2]
