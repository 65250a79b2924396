"""The admin UI in a real browser: headless Chromium (Debian's ``chromium``, driven by
Playwright) against ``taskq ui serve`` and a real worker process, on Postgres and Redis.

It loads every page (screenshots under ``tests/e2e/screenshots/``), filters jobs,
cancels a running job and sees its status change, resets a bucket, and watches a
progress bar advance over SSE, then resume after the server drops the connection
(the browser's reconnect carries ``Last-Event-ID``).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from playwright.async_api import Browser, Page, Request, async_playwright
from sqlalchemy import select
from sqlalchemy.engine import URL
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.actor_config_ops import QueuesClient
from taskq.client import TaskQ
from taskq.db.engine import make_engine
from taskq.db.tables import jobs
from taskq.ratelimit.token_bucket import TokenBucket
from taskq.settings import TaskQSettings
from tests.e2e.apps import ui as app
from tests.support import ops as s
from tests.support.workers import ROOT, spawn_worker, wait_until

pytestmark = pytest.mark.e2e

CHROMIUM = "/usr/bin/chromium"
SCREENSHOTS = ROOT / "tests" / "e2e" / "screenshots"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Server:
    """``taskq ui serve`` in a subprocess, restartable on the same port."""

    def __init__(self, url: str, redis_url: str, log: Path) -> None:
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}/admin"
        self.env = {
            **os.environ,
            "TASKQ_DATABASE_URL": url,
            "TASKQ_REDIS_URL": redis_url,
            "TASKQ_SCHEMA_NAME": "taskq",
            "TASKQ_ADMIN_ACTIONS_ENABLED": "true",
            "TASKQ_ADMIN_UI_ALLOW_RATE_LIMIT_RESET": "true",
            "PYTHONPATH": str(ROOT),
        }
        self.log = log
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        code = "from taskq.cli import main; main()"
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", code, "ui", "serve", "--port", str(self.port)],
                cwd=ROOT,
                env=self.env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"ui serve exited: {self.log.read_text()}")
            try:
                if httpx.get(self.base + "/workers", timeout=1).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"ui serve did not answer: {self.log.read_text()}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


@pytest.fixture
def pg_raw(pg_url: URL) -> str:
    return pg_url.render_as_string(hide_password=False)


@pytest.fixture
def server(pg_raw: str, redis_url: str, tmp_path: Path) -> Iterator[Server]:
    srv = Server(pg_raw, redis_url, tmp_path / "ui.log")
    srv.start()
    yield srv
    srv.stop()


@pytest.fixture
async def engine_pg(pg_url: URL, settings: TaskQSettings) -> AsyncIterator[AsyncEngine]:
    engine = make_engine(pg_url, settings=settings)
    yield engine
    await engine.dispose()


@pytest.fixture
async def tq(engine_pg: AsyncEngine, settings: TaskQSettings) -> AsyncIterator[TaskQ]:
    client = TaskQ(engine=engine_pg, settings=settings)
    yield client
    await client.aclose()


@pytest.fixture
async def browser() -> AsyncIterator[Browser]:
    async with async_playwright() as pw:
        chromium = await pw.chromium.launch(
            executable_path=CHROMIUM, headless=True, args=["--no-sandbox"]
        )
        yield chromium
        await chromium.close()


@pytest.fixture
def worker(
    pg_url: URL, redis_url: str, tmp_path: Path, procs: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    proc = spawn_worker(
        pg_url,
        "tests.e2e.apps.ui:registry",
        log_path=tmp_path / "worker.log",
        redis_url=redis_url,
        progress_flush_interval=0.2,
        cancellation_grace_period=2.0,
        max_concurrency=4,
    )
    procs.append(proc)
    return proc


async def _page(browser: Browser, errors: list[str]) -> Page:
    page = await browser.new_page(viewport={"width": 1280, "height": 900})
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.on("pageerror", lambda e: errors.append(str(e)))
    return page


async def _until(page: Page, expression: str, limit_s: float = 30.0) -> None:
    """Poll ``expression`` in the page until it is truthy (``wait_for_function`` evaluates
    strings, which the UI's CSP rightly forbids)."""
    deadline = time.monotonic() + limit_s
    while not await page.evaluate(expression):
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {expression}")
        await page.wait_for_timeout(50)


async def _status(engine: AsyncEngine, job_id: Any) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar())


async def _running(engine: AsyncEngine, job_id: Any) -> None:
    async def check() -> bool:
        return await _status(engine, job_id) == "running"

    await wait_until(check, timeout=30)


async def test_every_page_filter_and_reset(
    browser: Browser,
    server: Server,
    worker: subprocess.Popen[bytes],
    engine_pg: AsyncEngine,
    settings: TaskQSettings,
    tq: TaskQ,
    unique_name: str,
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    failed = await s.seed(engine_pg, 3, actor="ui_mail", status="failed", error_class="SmtpDown")
    pending = await s.seed(engine_pg, 4, actor="ui_report", queue="reports", tags=["monthly"])
    await QueuesClient(engine_pg).set_max_concurrent("reports", 2)
    bucket = TokenBucket(unique_name, 2, 0.0, backend="postgres")
    for _ in range(2):
        assert (await bucket.acquire(pg_pool=engine_pg, settings=settings)).allowed
    running = await tq.jobs.enqueue(
        app.ui_progress, app.Steps(steps=4, hold_at=2, gate=str(ROOT / "no-such-gate"))
    )
    await _running(engine_pg, running.job_id)
    errors: list[str] = []
    page = await _page(browser, errors)
    pages = {
        "overview": "/",
        "jobs": "/jobs",
        "job": f"/jobs/{failed[0]}",
        "running-job": f"/jobs/{running.job_id}",
        "actors": "/actors",
        "rate-limits": "/rate-limits",
        "queues": "/queues",
        "workers": "/workers",
        "cron": "/cron",
    }
    for name, path in pages.items():
        response = await page.goto(server.base + path)
        assert response is not None
        assert response.status == 200, name
        assert await page.locator("h1").count() == 1
        await page.screenshot(path=str(SCREENSHOTS / f"{name}.png"), full_page=True)
    await page.goto(server.base + "/workers")
    assert await page.locator("tbody tr").count() >= 1
    assert "No workers running" not in await page.content()
    await page.goto(server.base + "/actors")
    assert await page.locator('[data-actor="e2e_ui_progress"]').count() == 1

    # Filter: failed jobs of one actor.
    await page.goto(server.base + "/jobs")
    await page.check('input[name="status"][value="failed"]')
    await page.fill('input[name="actor"]', "ui_mail")
    await page.click('button:has-text("Filter")')
    await page.wait_for_url("**/jobs?*")
    shown = await page.locator("tr[data-job-id]").evaluate_all(
        "rows => rows.map(r => r.dataset.jobId)"
    )
    assert sorted(shown) == sorted(str(i) for i in failed)
    assert not set(shown) & {str(i) for i in pending}
    await page.screenshot(path=str(SCREENSHOTS / "jobs-filtered.png"), full_page=True)

    # Reset the drained bucket from its row.
    await page.goto(server.base + "/rate-limits")
    row = page.locator(f'tr[data-bucket="{unique_name}"]')
    assert "exhausted" in await row.inner_text()
    await row.locator("button[data-reset]").click()
    await page.wait_for_url("**/rate-limits?msg=*")
    assert "reset" in await page.locator(".flash").inner_text()
    assert "exhausted" not in await page.locator(f'tr[data-bucket="{unique_name}"]').inner_text()
    assert (await bucket.peek(pg_pool=engine_pg, settings=settings)).tokens_remaining == 2
    await page.screenshot(path=str(SCREENSHOTS / "rate-limits-after-reset.png"), full_page=True)
    # The overview re-reads itself: two more jobs in "reports" show up without a reload.
    await page.goto(server.base + "/")
    cell = "document.querySelector('main table tbody tr:nth-child(2) td:nth-child(2)')"
    assert await page.evaluate(cell + ".textContent.trim()") == "4"
    await s.seed(engine_pg, 2, actor="ui_report", queue="reports")
    await _until(page, cell + ".textContent.trim() === '6'")
    assert int(await page.evaluate("document.querySelector('main').dataset.refreshed")) >= 1
    await tq.jobs.cancel(running.job_id)
    assert not [e for e in errors if "Content Security Policy" in e], errors


async def test_cancel_a_running_job_and_see_it_change(
    browser: Browser,
    server: Server,
    worker: subprocess.Popen[bytes],
    engine_pg: AsyncEngine,
    settings: TaskQSettings,
    tq: TaskQ,
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    handle = await tq.jobs.enqueue(
        app.ui_progress, app.Steps(steps=4, hold_at=1, gate=str(ROOT / "no-such-gate"))
    )
    await _running(engine_pg, handle.job_id)
    errors: list[str] = []
    page = await _page(browser, errors)
    await page.goto(f"{server.base}/jobs/{handle.job_id}")
    status = page.locator(".job-head [data-status]")
    assert await status.inner_text() == "running"
    await page.click("button[data-action=cancel]")
    await page.wait_for_url(f"**/jobs/{handle.job_id}?msg=*")
    assert "cancel requested" in await page.locator(".flash").inner_text()
    # The worker walks the cancel ladder; the page hears the terminal event over SSE.
    await _until(
        page, "document.querySelector('.job-head [data-status]').textContent === 'cancelled'"
    )
    assert await page.locator("button[data-action=cancel]").is_disabled()
    await page.screenshot(path=str(SCREENSHOTS / "job-cancelled.png"), full_page=True)
    assert await _status(engine_pg, handle.job_id) == "cancelled"
    assert not [e for e in errors if "Content Security Policy" in e], errors


async def test_progress_bar_advances_and_resumes_after_a_drop(
    browser: Browser,
    server: Server,
    worker: subprocess.Popen[bytes],
    engine_pg: AsyncEngine,
    settings: TaskQSettings,
    tq: TaskQ,
    tmp_path: Path,
) -> None:
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    gate = tmp_path / "gate"
    handle = await tq.jobs.enqueue(
        app.ui_progress, app.Steps(steps=10, step_s=0.1, hold_at=5, gate=str(gate))
    )
    errors: list[str] = []
    page = await _page(browser, errors)
    streams: list[Request] = []
    page.on("request", lambda r: streams.append(r) if r.url.endswith("/progress") else None)
    await page.goto(f"{server.base}/jobs/{handle.job_id}")
    bar = page.locator("[data-progress-bar]")
    await _until(page, "document.querySelector('[data-progress-bar]').value >= 50")
    before: list[int] = await page.evaluate("window.taskqProgress.events")
    assert await bar.evaluate("b => b.value") == 50
    await page.screenshot(path=str(SCREENSHOTS / "progress-half.png"), full_page=True)

    server.stop()  # the connection drops; EventSource keeps retrying
    server.start()
    gate.touch()
    await _until(
        page, "document.querySelector('.job-head [data-status]').textContent === 'succeeded'"
    )
    assert await bar.evaluate("b => b.value") == 100
    after: list[int] = await page.evaluate("window.taskqProgress.events")
    await page.screenshot(path=str(SCREENSHOTS / "progress-done.png"), full_page=True)
    assert after[: len(before)] == before
    seqs = [n for n in after if n is not None]
    assert seqs == sorted(set(seqs))  # each event once, in order, across the reconnect
    assert len(streams) >= 2
    resumed = await streams[-1].all_headers()
    assert resumed.get("last-event-id") == str(max(n for n in before if n is not None))
    assert await _status(engine_pg, handle.job_id) == "succeeded"
    assert not [e for e in errors if "Content Security Policy" in e], errors
