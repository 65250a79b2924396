"""The progress stream of ``taskq.contrib.starlette``, mounted alone in a FastAPI app on a
real uvicorn server, fed by a real worker process.

Both feeds: Redis pub/sub (``progress_route`` with the app's ``TASKQ_REDIS_URL``) and the
job's row (``progress_app(use_redis=False)`` mounted). A client reads up to the job's hold
point and drops the connection; it reconnects with ``Last-Event-ID`` and gets only the
later events, up to the terminal one, after which the server ends the stream; a reconnect
after that is a 204.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from sqlalchemy.engine import URL
from starlette.requests import Request

import taskq_sync
from taskq.db.dialect import async_url, sync_url
from taskq.progress import progress_channel
from taskq.settings import TaskQSettings
from tests.integration.frameworks import progress_app
from tests.support.asgi_server import serve
from tests.support.workers import spawn_worker, stop_worker

pytestmark = pytest.mark.e2e


@pytest.fixture
def server(pg_url: URL, redis_url: str) -> Iterator[str]:
    settings = TaskQSettings.load(database_url=None, redis_url=redis_url)
    app = progress_app.create_app(dsn=async_url(pg_url), settings=settings)
    with serve(app) as url:
        yield url


def _events(lines: Iterator[str]) -> Iterator[tuple[int | None, dict[str, Any]]]:
    """(id, data) of each SSE message with data, in order, until the server ends it."""
    ident: int | None = None
    for line in lines:
        if line.startswith("id: "):
            ident = int(line[4:])
        elif line.startswith("data: "):
            yield ident, json.loads(line[6:])
            ident = None


def _subscribers(redis_url: str, job_id: uuid.UUID) -> int:
    client = redis.Redis.from_url(redis_url)
    try:
        [(_, count)] = client.pubsub_numsub(progress_channel(job_id))
        return int(count)
    finally:
        client.close()


@pytest.mark.parametrize(
    ("path", "pubsub"), [("/jobs/{}/progress", True), ("/store/{}", False)], ids=["redis", "store"]
)
def test_progress_stream_resumes_after_last_event_id_and_ends_at_the_terminal_event(
    server: str, pg_url: URL, redis_url: str, tmp_path: Path, path: str, pubsub: bool
) -> None:
    gate = tmp_path / "gate"
    with taskq_sync.TaskQ(sync_url(pg_url)) as tq:
        job = tq.enqueue(progress_app.sse_steps, {"before": 3, "after": 4, "gate": str(gate)})
    url = server + path.format(job.job_id)
    proc = spawn_worker(
        sync_url(pg_url),
        "tests.integration.frameworks.progress_app:ACTORS",
        log_path=tmp_path / "worker.log",
        redis_url=redis_url,
    )
    try:
        # 1. up to the hold point (step 3), then the client goes away
        first: list[tuple[int | None, dict[str, Any]]] = []
        with httpx.stream("GET", url, timeout=60) as response:
            assert response.status_code == 200
            assert response.headers["content-type"].startswith("text/event-stream")
            for ident, data in _events(response.iter_lines()):
                first.append((ident, data))
                if len(first) == 1:  # the stream is open: who feeds it?
                    assert (_subscribers(redis_url, job.job_id) >= 1) is pubsub
                if data["state"].get("step") == 3:
                    break
        last = first[-1][0]
        assert last is not None
        ids = [i for i, _ in first]
        assert all(i is not None for i in ids)
        assert ids == sorted(set(ids))  # type: ignore[type-var]
        assert all(d["seq"] == i for i, d in first)
        assert not any(d["terminal"] for _, d in first)

        # 2. reconnect after the last event seen; the job goes on; the server ends the stream
        with httpx.stream("GET", url, headers={"Last-Event-ID": str(last)}, timeout=60) as response:
            assert response.status_code == 200
            gate.touch()
            second = list(_events(response.iter_lines()))  # returns: the server ended it
        later = [i for i, _ in second]
        assert later, second
        assert all(i is not None and i > last for i in later), (last, later)
        assert later == sorted(set(later))  # type: ignore[type-var]
        *_, (end_id, end) = second
        assert (end["event"], end["status"], end["terminal"]) == ("succeeded", "succeeded", True)
        assert [d for _, d in second if d["terminal"]] == [end]
        assert max(d["state"].get("step", 0) for _, d in second) == 7

        # 3. after the terminal event: nothing more to send
        done = httpx.get(url, headers={"Last-Event-ID": str(end_id)}, timeout=30)
        assert done.status_code == 204
        # from the start: the job's final state, then the end
        replay = list(_events(httpx.get(url, timeout=30).iter_lines()))
        assert [d["terminal"] for _, d in replay] == [True]
    finally:
        gate.touch()
        assert stop_worker(proc) == 0, (tmp_path / "worker.log").read_text()


def test_progress_route_answers_bad_requests(server: str) -> None:
    missing = uuid.uuid4()
    assert httpx.get(f"{server}/jobs/{missing}/progress", timeout=30).status_code == 404
    assert httpx.get(f"{server}/store/{missing}", timeout=30).status_code == 404
    assert httpx.get(f"{server}/jobs/not-a-uuid/progress", timeout=30).status_code == 404
    bad = httpx.get(
        f"{server}/jobs/{missing}/progress", headers={"Last-Event-ID": "abc"}, timeout=30
    )
    assert bad.status_code == 400


async def test_authorize_and_redact_in_process(pg_url: URL) -> None:
    from fastapi import FastAPI
    from sqlalchemy import update

    from taskq import TaskQ
    from taskq.contrib.starlette import lifespan, progress_route
    from taskq.db.tables import jobs

    settings = TaskQSettings.load(database_url=None, redis_url=None)
    seen: list[tuple[str, uuid.UUID]] = []

    async def authorize(request: Request, job_id: uuid.UUID) -> bool:
        seen.append((request.headers.get("x-user", ""), job_id))
        return request.headers.get("x-user") == "ops"

    def redact(actor: str, state: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in state.items() if k != "data"} | {"actor": actor}

    app = FastAPI(lifespan=lifespan(dsn=async_url(pg_url), settings=settings))
    app.router.routes.append(progress_route(authorize=authorize, redact=redact))
    async with (
        app.router.lifespan_context(app),
        httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://t") as client,
    ):
        tq: TaskQ = app.state.taskq
        job = await tq.enqueue(progress_app.sse_steps, {"before": 0, "after": 0, "gate": "-"})
        async with tq.engine.begin() as conn:
            await conn.execute(
                update(jobs)
                .where(jobs.c.id == job.job_id)
                .values(
                    status="succeeded",
                    progress={"step": 2, "data": {"token": "s3cret"}},
                    progress_seq=4,
                )
            )
        url = f"/jobs/{job.job_id}/progress"
        assert (await client.get(url, headers={"x-user": "guest"})).status_code == 403
        body = (await client.get(url, headers={"x-user": "ops"})).text
    assert seen == [("guest", job.job_id), ("ops", job.job_id)]
    [(ident, data)] = list(_events(iter(body.splitlines())))
    assert ident == 4
    assert data["state"] == {"step": 2, "actor": "sse_contrib_steps"}
    assert "s3cret" not in body
