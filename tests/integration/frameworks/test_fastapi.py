"""FastAPI on real Postgres and Redis, served by a real uvicorn server.

Commit: exactly one job, run once by a real worker process (no ``-q``: it claims queue
``fastapi``). An exception in the view: no row, no job. A keyed per-user bucket: each
user limited on their own, a denial is a 429 with ``Retry-After``.
"""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from sqlalchemy.engine import URL

from taskq.db.dialect import async_url, sync_url
from taskq.settings import TaskQSettings
from tests.integration.frameworks import fastapi_app
from tests.support.asgi_server import serve
from tests.support.workers import spawn_worker, stop_worker

pytestmark = pytest.mark.e2e


def _dsn(url: URL) -> str:
    return sync_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


@pytest.fixture
def server(pg_url: URL, redis_url: str, unique_name: str) -> Iterator[str]:
    with psycopg.connect(_dsn(pg_url)) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS fastapi_orders (id serial PRIMARY KEY)")
    settings = TaskQSettings.load(database_url=None, redis_url=redis_url)
    app = fastapi_app.create_app(f"{unique_name}_me", dsn=async_url(pg_url), settings=settings)
    with serve(app) as url:
        yield url
    with psycopg.connect(_dsn(pg_url)) as conn:
        conn.execute("DROP TABLE fastapi_orders")


def _call(url: str, method: str = "GET") -> tuple[int, dict[str, Any], dict[str, str]]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return (
                resp.status,
                json.loads(resp.read()),
                {k.lower(): v for k, v in resp.headers.items()},
            )
    except urllib.error.HTTPError as err:
        return err.code, {}, {k.lower(): v for k, v in err.headers.items()}


def _counts(pg_url: URL) -> tuple[int, int]:
    with psycopg.connect(_dsn(pg_url)) as conn:
        row = conn.execute(
            "SELECT (SELECT count(*) FROM fastapi_orders), (SELECT count(*) FROM taskq.jobs)"
        ).fetchone()
    assert row is not None
    return int(row[0]), int(row[1])


def test_commit_enqueues_one_job_that_a_worker_runs_once(
    server: str, pg_url: URL, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.touch()
    status, body, _ = _call(f"{server}/orders", "POST")
    assert status == 200
    assert _counts(pg_url) == (1, 1)
    proc = spawn_worker(
        sync_url(pg_url),
        "tests.integration.frameworks.fastapi_app:ACTORS",
        log_path=tmp_path / "worker.log",
        env={"FASTAPI_RUNS_FILE": str(runs)},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not runs.read_text():
            time.sleep(0.1)
        time.sleep(0.5)  # a second run, if there were one, would have had time to show
    finally:
        assert stop_worker(proc) == 0, (tmp_path / "worker.log").read_text()
    assert runs.read_text().split() == [str(body["order"])]


def test_an_exception_in_the_view_leaves_no_row_and_no_job(server: str, pg_url: URL) -> None:
    status, _, _ = _call(f"{server}/orders?fail=1", "POST")
    assert status == 500
    assert _counts(pg_url) == (0, 0)


def test_keyed_per_user_bucket_limits_each_user_on_their_own(server: str) -> None:
    a = [_call(f"{server}/me/alice")[0] for _ in range(5)]
    b = [_call(f"{server}/me/bob")[0] for _ in range(4)]
    assert a == [200, 200, 200, 429, 429]
    assert b == [200, 200, 200, 429]
    status, _, headers = _call(f"{server}/me/alice")
    assert status == 429
    assert int(headers["retry-after"]) >= 1
