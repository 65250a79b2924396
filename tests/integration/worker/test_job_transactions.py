"""The job's transaction through a real worker: the actor's writes on its injected
connection, its sub-jobs and the terminal write commit or roll back together.

On Postgres the database is migrated into a non-default schema (``app_jobs``) and every
engine outside the worker is a plain ``create_async_engine`` (the registered LOOP
connection, the producer's ``TaskQ``). The application's own table lives in ``public``,
where the actor's unqualified SQL finds it. Run at ``TASKQ_MAX_CONCURRENCY`` 1 (the
registered connection carries the transaction) and 8 (the per-slot pool).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from datetime import timedelta
from typing import Any
from uuid import UUID

import pytest
from pydantic import BaseModel
from sqlalchemy import text
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine, create_async_engine
from structlog.testing import capture_logs

from taskq import TaskQ, actor
from taskq.context import JobContext
from taskq.db.dialect import async_url
from taskq.di import ProviderRegistry, Scope
from taskq.exceptions import MaxPendingExceededError, SubEnqueueError
from taskq.retry import RetryPolicy
from taskq.settings import TaskQSettings
from tests.e2e.apps import basic
from tests.support import databases
from tests.support.workers import running_worker, wait_until, worker_settings

SCHEMA = "app_jobs"
SEEN: dict[str, list[Any]] = {
    "registered": [],
    "injected": [],
    "hooks": [],
    "tenant": [],
    "wrote": [],
}


class Parent(BaseModel):
    n: int
    fail: bool = False
    refuse_child: bool = False


@actor(name="t_jtx_child")
async def child(payload: basic.Echo) -> None: ...


def _on_success(row: dict[str, Any], result: Any) -> None:
    SEEN["hooks"].append(row)


@actor(name="t_jtx_parent", retry=RetryPolicy(kind="non_retryable"), on_success=_on_success)
async def parent(payload: Parent, ctx: JobContext[Parent], *, conn: AsyncConnection) -> None:
    """Writes an application row through the injected connection, enqueues two children,
    then fails if asked (after everything was written)."""
    SEEN["injected"].append(conn)
    await conn.execute(text("INSERT INTO app_rows (n) VALUES (:n)"), {"n": payload.n})
    assert ctx.jobs is not None
    await ctx.jobs.enqueue(child, basic.Echo(value=payload.n * 10))
    if payload.refuse_child:  # the store refuses this one: a cap of 0
        await ctx.jobs.enqueue(child, basic.Echo(value=-1), max_pending=0)
    else:
        await ctx.jobs.enqueue(child, basic.Echo(value=payload.n * 10 + 1))
    if payload.fail:
        raise ValueError("the parent fails after writing")


@actor(name="t_jtx_tenant", retry=RetryPolicy(kind="non_retryable"))
async def tenant(payload: basic.Echo, *, conn: AsyncConnection) -> None:
    """Reads a session setting the LOOP connection's factory set up."""
    value = (await conn.execute(text("SELECT current_setting('app.tenant', true)"))).scalar()
    SEEN["tenant"].append(value)
    if payload.value < 0:
        raise ValueError("fails: its transaction rolls back")


ACTORS = {a.name: a for a in (parent, child, tenant)}


@pytest.fixture(scope="module")
def pg_app_url() -> Iterator[URL]:
    with databases.migrated_database("jobtx", SCHEMA) as url:
        yield url


@pytest.fixture(params=["postgres", "sqlite"])
def db_url(request: pytest.FixtureRequest, pg_app_url: URL, sqlite_url: str) -> Iterator[URL]:
    if request.param == "postgres":
        yield async_url(pg_app_url)
        databases.truncate_all(pg_app_url, schema=SCHEMA)
    else:
        yield async_url(sqlite_url)


@pytest.fixture
async def user_engine(db_url: URL) -> AsyncIterator[AsyncEngine]:
    """A plain engine, as the application makes it, with the application's table."""
    engine = create_async_engine(db_url)
    async with engine.begin() as conn:
        await conn.execute(text("DROP TABLE IF EXISTS app_rows"))
        await conn.execute(text("CREATE TABLE app_rows (n INTEGER NOT NULL)"))
    for seen in SEEN.values():
        seen.clear()
    yield engine
    await engine.dispose()


def _registry(engine: AsyncEngine, *, tenant_name: str | None = None) -> ProviderRegistry:
    async def connection() -> AsyncIterator[AsyncConnection]:
        async with engine.connect() as conn:
            if tenant_name is not None:  # session state, in the factory's transaction
                await conn.execute(
                    text("SELECT set_config('app.tenant', :t, false)"), {"t": tenant_name}
                )
            SEEN["registered"].append(conn)
            yield conn

    registry = ProviderRegistry()
    registry.register_factory(AsyncConnection, Scope.LOOP, connection)
    return registry


def _settings(url: URL, concurrency: int) -> Any:
    return worker_settings(
        url.render_as_string(hide_password=False),
        schema_name=SCHEMA,
        max_concurrency=concurrency,
    )


async def _rows(engine: AsyncEngine, sql: str) -> list[Any]:
    async with engine.connect() as conn:
        return list((await conn.execute(text(sql))).all())


def _jobs_table(engine: AsyncEngine) -> str:
    return f"{SCHEMA}.jobs" if engine.dialect.name == "postgresql" else "jobs"


async def _statuses(engine: AsyncEngine, ids: list[UUID]) -> dict[UUID, str]:
    rows = await _rows(engine, f"SELECT id, status, actor FROM {_jobs_table(engine)}")
    wanted = {str(i).replace("-", ""): i for i in ids}
    out: dict[UUID, str] = {}
    for row in rows:
        key = str(row.id).replace("-", "")
        if key in wanted:
            out[wanted[key]] = row.status
    return out


async def _succeeded_without_children(engine: AsyncEngine) -> list[Any]:
    """Succeeded parents with other than two children, read in one statement (one snapshot)."""
    table = _jobs_table(engine)
    return await _rows(
        engine,
        f"SELECT p.id FROM {table} p WHERE p.actor = 't_jtx_parent' AND p.status = 'succeeded' "
        f"AND (SELECT count(*) FROM {table} c WHERE c.parent_job_id = p.id) <> 2",
    )


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_actor_writes_and_children_commit_only_with_the_success(
    user_engine: AsyncEngine, db_url: URL, concurrency: int
) -> None:
    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)
    async with TaskQ(engine=user_engine, settings=settings) as tq:
        handles = [await tq.enqueue(parent, Parent(n=n, fail=n % 3 == 0)) for n in range(1, 13)]
        ids = [h.job_id for h in handles]
        async with running_worker(
            _settings(db_url, concurrency), ACTORS, di_registry=_registry(user_engine)
        ):

            async def all_done() -> bool:
                # Sampled all along the run: a parent is never seen succeeded without
                # both its children (they commit in its transaction, not after it).
                violations.extend(await _succeeded_without_children(user_engine))
                found = await _statuses(user_engine, ids)
                return len(found) == len(ids) and all(
                    s in ("succeeded", "failed") for s in found.values()
                )

            violations: list[Any] = []
            await wait_until(all_done, interval=0.01)
            assert violations == []
        statuses = await _statuses(user_engine, ids)
    succeeded = {
        n for n, h in zip(range(1, 13), handles, strict=True) if statuses[h.job_id] == "succeeded"
    }
    assert succeeded == {n for n in range(1, 13) if n % 3 != 0}
    app_rows = sorted(r.n for r in await _rows(user_engine, "SELECT n FROM app_rows"))
    assert app_rows == sorted(succeeded)  # none for the failed parents
    children = await _rows(
        user_engine,
        f"SELECT parent_job_id FROM {_jobs_table(user_engine)} WHERE actor = 't_jtx_child'",
    )
    by_parent: dict[str, int] = {}
    for row in children:
        key = str(row.parent_job_id).replace("-", "")
        by_parent[key] = by_parent.get(key, 0) + 1
    expected = {
        str(h.job_id).replace("-", ""): 2
        for n, h in zip(range(1, 13), handles, strict=True)
        if n in succeeded
    }
    assert by_parent == expected
    registered = SEEN["registered"]
    assert len(registered) == 1  # one LOOP connection, built once (single-flight)
    if concurrency == 1:  # the registered connection carries every job's transaction
        assert all(conn is registered[0] for conn in SEEN["injected"])
    else:  # each job on its own slot connection, never the registered one
        assert all(conn is not registered[0] for conn in SEEN["injected"])
        assert len({id(c) for c in SEEN["injected"]}) > 1


async def test_refused_children_surface_as_sub_enqueue_error(
    user_engine: AsyncEngine, db_url: URL
) -> None:
    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)
    async with TaskQ(engine=user_engine, settings=settings) as tq:
        handle = await tq.enqueue(parent, Parent(n=5, refuse_child=True))
        with capture_logs() as logs:
            async with running_worker(
                _settings(db_url, 4), ACTORS, di_registry=_registry(user_engine)
            ):

                async def hooked() -> bool:
                    return bool(SEEN["hooks"])

                await wait_until(hooked)
        record = await (await tq.get(handle.job_id)).refresh()
    # The parent row says it: succeeded, with the refusal recorded.
    assert record.status == "succeeded"
    assert record.error_class == "SubEnqueueError"
    assert record.error is not None
    assert "MaxPendingExceededError" in record.error
    # The on_success hook gets the exception and its failed items.
    [row] = SEEN["hooks"]
    error = row["sub_enqueue_error"]
    assert isinstance(error, SubEnqueueError)
    [(args, exc)] = error.failed_items
    assert isinstance(exc, MaxPendingExceededError)
    assert args.payload == basic.Echo(value=-1)
    assert args.options["parent_job_id"] == handle.job_id
    # The log has the event; the good child and the actor's row committed with the parent.
    [event] = [e for e in logs if e["event"] == "sub_enqueue_failed"]
    assert event["job_id"] == str(handle.job_id)
    assert event["failed"] == 1
    assert [r.n for r in await _rows(user_engine, "SELECT n FROM app_rows")] == [5]
    kids = await _rows(
        user_engine, f"SELECT payload FROM {_jobs_table(user_engine)} WHERE actor = 't_jtx_child'"
    )
    assert len(kids) == 1


async def test_session_state_of_the_registered_connection_at_concurrency_one(
    pg_app_url: URL,
) -> None:
    """The factory's session setup survives the attempts, failed ones included (its
    open transaction is committed before the first); the slot pool above 1 never has it.
    (Postgres: ``set_config`` is a session setting SQLite does not have.)"""
    url = async_url(pg_app_url)
    user_engine = create_async_engine(url)
    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)
    try:
        async with TaskQ(engine=user_engine, settings=settings) as tq:
            for concurrency in (1, 3):
                SEEN["tenant"].clear()
                ids = [(await tq.enqueue(tenant, basic.Echo(value=v))).job_id for v in (1, -1, 2)]
                async with running_worker(
                    _settings(url, concurrency),
                    ACTORS,
                    di_registry=_registry(user_engine, tenant_name="acme"),
                ):

                    async def done(ids: list[UUID] = ids) -> bool:
                        found = await _statuses(user_engine, ids)
                        finished = [s for s in found.values() if s in ("succeeded", "failed")]
                        return len(finished) == 3

                    await wait_until(done)
                if concurrency == 1:
                    assert SEEN["tenant"] == ["acme", "acme", "acme"]
                else:
                    assert len(SEEN["tenant"]) == 3
                    assert set(SEEN["tenant"]) <= {None, ""}
    finally:
        await user_engine.dispose()
        databases.truncate_all(pg_app_url, schema=SCHEMA)


class Slow(BaseModel):
    n: int


@actor(
    name="t_jtx_slow",
    retry=RetryPolicy(kind="non_retryable"),
    start_to_close=timedelta(milliseconds=300),
)
async def slow(payload: Slow, *, conn: AsyncConnection) -> None:
    """Writes, then outlives its start-to-close timeout."""
    await conn.execute(text("INSERT INTO app_rows (n) VALUES (:n)"), {"n": payload.n})
    SEEN["wrote"].append(payload.n)
    await asyncio.sleep(30)


@pytest.mark.parametrize("concurrency", [1, 8])
async def test_a_timed_out_or_cancelled_attempt_rolls_its_writes_back(
    user_engine: AsyncEngine, db_url: URL, concurrency: int
) -> None:
    """On SQLite an open job transaction holds the file's write lock, so a cancel request
    (a write) waits for it to end: there only the timeout is exercised (see engines.md)."""
    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)
    actors = {**ACTORS, slow.name: slow}
    postgres = user_engine.dialect.name == "postgresql"
    async with TaskQ(engine=user_engine, settings=settings) as tq:
        timed_out = await tq.enqueue(slow, Slow(n=1))
        async with running_worker(
            _settings(db_url, concurrency), actors, di_registry=_registry(user_engine)
        ):

            async def first_ended() -> bool:
                found = await _statuses(user_engine, [timed_out.job_id])
                return found.get(timed_out.job_id) == "failed"

            await wait_until(first_ended)
            assert 1 in SEEN["wrote"]  # it had written before it timed out
            if postgres:
                cancelled = await tq.enqueue(slow, Slow(n=2), start_to_close=timedelta(seconds=60))

                async def second_wrote() -> bool:
                    return 2 in SEEN["wrote"]  # its row is written (in its transaction)

                await wait_until(second_wrote)
                await tq.cancel(cancelled.job_id)

                async def second_ended() -> bool:
                    found = await _statuses(user_engine, [cancelled.job_id])
                    return found.get(cancelled.job_id) == "cancelled"

                await wait_until(second_ended)
            # The worker is still running: nothing of either attempt was committed.
            assert await _rows(user_engine, "SELECT n FROM app_rows") == []
        record = await (await tq.get(timed_out.job_id)).refresh()
        assert record.error_class == "StartToCloseTimeout"
    assert await _rows(user_engine, "SELECT n FROM app_rows") == []


@actor(name="t_jtx_swept", retry=RetryPolicy(kind="non_retryable"), on_success=_on_success)
async def swept(payload: Parent, ctx: JobContext[Parent], *, conn: AsyncConnection) -> None:
    """Loses its claim mid-run (another connection moves the row on, as the lease sweep
    would), then writes a row and enqueues a child, and returns."""
    table = f"{SCHEMA}.jobs" if conn.dialect.name == "postgresql" else "jobs"
    other = create_async_engine(conn.engine.url)
    try:
        async with other.begin() as side:
            await side.execute(
                text(f"UPDATE {table} SET status = 'failed', locked_by = NULL WHERE id = :id"),
                {"id": str(ctx.job_id) if conn.dialect.name == "postgresql" else ctx.job_id.hex},
            )
    finally:
        await other.dispose()
    await conn.execute(text("INSERT INTO app_rows (n) VALUES (:n)"), {"n": payload.n})
    assert ctx.jobs is not None
    await ctx.jobs.enqueue(child, basic.Echo(value=payload.n))


async def test_a_success_whose_fence_failed_rolls_everything_back(
    user_engine: AsyncEngine, db_url: URL
) -> None:
    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=SCHEMA)
    actors = {**ACTORS, swept.name: swept}
    async with TaskQ(engine=user_engine, settings=settings) as tq:
        handle = await tq.enqueue(swept, Parent(n=9))
        with capture_logs() as logs:
            async with running_worker(
                _settings(db_url, 4), actors, di_registry=_registry(user_engine)
            ):

                async def fenced_out() -> bool:
                    return any(e["event"] == "worker-success-fenced-out" for e in logs)

                await wait_until(fenced_out)
        record = await (await tq.get(handle.job_id)).refresh()
    assert record.status == "failed"  # what the "sweep" wrote; the late success changed nothing
    assert await _rows(user_engine, "SELECT n FROM app_rows") == []
    kids = await _rows(
        user_engine, f"SELECT id FROM {_jobs_table(user_engine)} WHERE actor = 't_jtx_child'"
    )
    assert kids == []
    assert SEEN["hooks"] == []  # no on_success for a success that was not written
