"""The admin UI in process (``httpx.ASGITransport``) on real Postgres and SQLite: every
page, every action with the database state checked after it, the CSRF refusals, the
gates (actions off, rate-limit reset off, the authorize hook), redaction, bad input as
4xx, the security headers, and the SSE progress stream resuming after Last-Event-ID."""

from __future__ import annotations

import asyncio
import json
import logging
import re
import uuid
from typing import Any

import pytest
from pydantic import BaseModel
from sqlalchemy import insert, select, update
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.requests import Request

from taskq.actor import actor
from taskq.actor_config_ops import ActorsClient, QueuesClient
from taskq.cron import Schedule
from taskq.cron import ops as cron_ops
from taskq.db.tables import jobs, workers
from taskq.ratelimit.registry import RateLimitRegistry
from taskq.ratelimit.token_bucket import TokenBucket
from taskq.settings import TaskQSettings
from taskq.ui import CronScheduleView
from tests.support import ops as s
from tests.support.ui import nonce_of, settings_with, sse_events, ui_client

pytestmark = pytest.mark.integration


@pytest.fixture
def on(settings: TaskQSettings) -> TaskQSettings:
    """Settings with every action enabled."""
    return settings_with(settings, admin_actions_enabled=True, admin_ui_allow_rate_limit_reset=True)


async def status_of(engine: AsyncEngine, job_id: uuid.UUID) -> str:
    async with engine.connect() as conn:
        return str((await conn.execute(select(jobs.c.status).where(jobs.c.id == job_id))).scalar())


class FakeCron:
    """A :class:`~taskq.ui.CronSource` in memory, recording what the page asked of it."""

    def __init__(self) -> None:
        self.enabled = {"nightly": True}
        self.runs: list[str] = []

    async def list(self) -> list[CronScheduleView]:
        return [
            CronScheduleView(k, "ops_actor", "0 3 * * *", "UTC", v, None, None)
            for k, v in self.enabled.items()
        ]

    async def enable(self, schedule_id: str) -> None:
        if schedule_id not in self.enabled:
            raise LookupError(f"no schedule {schedule_id!r}")
        self.enabled[schedule_id] = True

    async def disable(self, schedule_id: str) -> None:
        if schedule_id not in self.enabled:
            raise LookupError(f"no schedule {schedule_id!r}")
        self.enabled[schedule_id] = False

    async def run_now(self, schedule_id: str) -> str:
        self.runs.append(schedule_id)
        return "job-1"


# -- pages --------------------------------------------------------------------------


async def test_every_page_renders_what_the_store_holds(
    engine: AsyncEngine, on: TaskQSettings, unique_name: str
) -> None:
    failed = await s.seed(engine, 2, actor="ui_a", status="failed", error_class="Boom")
    pending = await s.seed(engine, 3, actor="ui_b", queue="mail")
    await ActorsClient(engine).set("ui_a", queue="default")
    await QueuesClient(engine).set_max_concurrent("mail", 4)
    async with engine.begin() as conn:
        await conn.execute(
            insert(workers).values(
                id=uuid.uuid4(),
                hostname="host-ui",
                pid=4242,
                queues=["default"],
                concurrency=3,
                last_heartbeat_at=s.BASE,
            )
        )
    registry = RateLimitRegistry()
    registry.register(TokenBucket(unique_name, 5, 1.0, backend="postgres"))
    async with ui_client(engine, on, rate_limit_registry=registry, cron=FakeCron()) as ui:
        overview = await ui.get("/")
        assert overview.status_code == 200
        assert "mail" in overview.text
        assert "<svg" in overview.text
        listing = await ui.get("/jobs")
        assert all(str(i) in listing.text for i in failed + pending)
        [child] = await s.seed(engine, 1, actor="ui_child", parent_job_id=failed[0])
        detail = await ui.get(f"/jobs/{failed[0]}")
        assert f'href="/jobs/{child}"' in detail.text
        child_page = await ui.get(f"/jobs/{child}")
        assert f'href="/jobs/{failed[0]}"' in child_page.text  # its parent
        assert "Boom" in detail.text
        assert "ui_a" in detail.text
        actors = await ui.get("/actors?window=7d")
        assert 'data-actor="ui_a"' in actors.text
        limits = await ui.get("/rate-limits")
        assert f'data-bucket="{unique_name}"' in limits.text
        assert "of 5 tokens" in limits.text
        queues = await ui.get("/queues")
        assert 'data-queue="mail"' in queues.text
        assert ">4<" in queues.text
        fleet = await ui.get("/workers?stopped=1")
        assert "host-ui" in fleet.text
        assert "4242" in fleet.text
        cron = await ui.get("/cron")
        assert 'data-schedule="nightly"' in cron.text
        assert "Disable" in cron.text
        for page in (overview, listing, detail, actors, limits, queues, fleet, cron):
            assert page.status_code == 200


async def test_jobs_filters_and_keyset_pages(engine: AsyncEngine, on: TaskQSettings) -> None:
    a = await s.seed(engine, 5, actor="ui_a", tags=["red"], identity_key="cust-1")
    b = await s.seed(engine, 2, actor="ui_b", status="failed", error_class="Boom")
    async with ui_client(engine, on) as ui:
        only_b = await ui.get("/jobs", params={"status": "failed"})
        assert all(str(i) in only_b.text for i in b)
        assert not any(str(i) in only_b.text for i in a)
        for params in ({"tag": "red"}, {"identity_key": "cust-1"}, {"actor": "ui_a"}):
            page = await ui.get("/jobs", params=params)
            assert sum(str(i) in page.text for i in a) == 5, params
            assert not any(str(i) in page.text for i in b), params
        error = await ui.get("/jobs", params={"error_class": "Boom"})
        assert sum(str(i) in error.text for i in b) == 2
        seen: list[str] = []
        url: str | None = "/jobs?actor=ui_a&limit=2"
        while url is not None:
            page = await ui.get(url)
            seen += re.findall(r'data-job-id="([^"]+)"', page.text)
            found = re.search(r'class="next" href="([^"]+)"', page.text)
            url = found.group(1).replace("&amp;", "&") if found else None
        assert seen == [str(i) for i in reversed(a)]  # newest first, each once


@pytest.mark.parametrize(
    "path",
    [
        "/jobs?status=bogus",
        "/jobs?limit=abc",
        "/jobs?limit=0",
        "/jobs?after=not-a-cursor",
        "/jobs?actor=has%20space",
        "/jobs/not-a-uuid",
        "/actors?window=forever",
        "/jobs/confirm?action=explode&actor=x",
        "/jobs/confirm?action=cancel",
    ],
)
async def test_bad_input_is_a_400_with_a_message(
    engine: AsyncEngine, on: TaskQSettings, path: str
) -> None:
    async with ui_client(engine, on) as ui:
        response = await ui.get(path)
    assert response.status_code == 400
    assert 'class="error"' in response.text


async def test_unknown_job_is_a_404(engine: AsyncEngine, on: TaskQSettings) -> None:
    async with ui_client(engine, on) as ui:
        assert (await ui.get(f"/jobs/{uuid.uuid4()}")).status_code == 404
        assert (await ui.get(f"/jobs/{uuid.uuid4()}/progress")).status_code == 404


# -- actions ------------------------------------------------------------------------


async def test_cancel_and_retry_one_job(engine: AsyncEngine, on: TaskQSettings) -> None:
    [pending] = await s.seed(engine, 1)
    [failed] = await s.seed(engine, 1, status="failed", error_class="Boom")
    async with ui_client(engine, on) as ui:
        done = await ui.post_form(f"/jobs/{pending}/cancel")
        assert done.status_code == 303
        assert await status_of(engine, pending) == "cancelled"
        assert (await ui.post_form(f"/jobs/{failed}/retry")).status_code == 303
        assert await status_of(engine, failed) == "pending"
        again = await ui.post_form(f"/jobs/{pending}/cancel")  # already finished: a no-op
        assert again.status_code == 303
        retried = await ui.post_form(f"/jobs/{pending}/retry", {})
        assert retried.status_code == 303  # cancelled jobs are retryable
        assert await status_of(engine, pending) == "pending"
        busy = await ui.post_form(f"/jobs/{pending}/retry")
        assert busy.status_code == 409  # pending now: not retryable, nothing changed
        assert await status_of(engine, pending) == "pending"


async def test_bulk_on_selected_ids(engine: AsyncEngine, on: TaskQSettings) -> None:
    ids = await s.seed(engine, 4)
    async with ui_client(engine, on) as ui:
        chosen = [("action", "cancel"), *(("job_id", str(i)) for i in ids[:3])]
        response = await ui.post_form("/jobs/bulk", chosen)
        assert response.status_code == 303
        assert "3 of 3" in response.headers["location"].replace("+", " ")
        assert [await status_of(engine, i) for i in ids] == ["cancelled"] * 3 + ["pending"]
        retry = await ui.post_form("/jobs/bulk", [("action", "retry"), ("job_id", str(ids[0]))])
        assert retry.status_code == 303
        assert await status_of(engine, ids[0]) == "pending"
        empty = await ui.post_form("/jobs/bulk", [("action", "cancel")])
        assert empty.status_code == 400
        bad = await ui.post_form("/jobs/bulk", [("action", "cancel"), ("job_id", "nope")])
        assert bad.status_code == 400


async def test_everything_matching_after_confirmation(
    engine: AsyncEngine, on: TaskQSettings
) -> None:
    mine = await s.seed(engine, 5, actor="ui_a")
    others = await s.seed(engine, 2, actor="ui_b")
    failed = await s.seed(engine, 3, actor="ui_c", status="failed", error_class="Boom")
    async with ui_client(engine, on) as ui:
        confirm = await ui.get("/jobs/confirm?action=cancel&actor=ui_a")
        assert confirm.status_code == 200
        assert re.search(r"data-confirm-count>5<", confirm.text)
        done = await ui.post_form("/jobs/where", {"action": "cancel", "actor": "ui_a"})
        assert done.status_code == 303
        assert {await status_of(engine, i) for i in mine} == {"cancelled"}
        assert {await status_of(engine, i) for i in others} == {"pending"}
        retried = await ui.post_form(
            "/jobs/where", {"action": "retry", "actor": "ui_c", "error_class": "Boom"}
        )
        assert retried.status_code == 303
        assert {await status_of(engine, i) for i in failed} == {"pending"}
        everything = await ui.post_form("/jobs/where", {"action": "cancel"})
        assert everything.status_code == 400  # no filter: refused, nothing changed
        assert {await status_of(engine, i) for i in others} == {"pending"}


async def test_queue_pause_resume_and_cap(engine: AsyncEngine, on: TaskQSettings) -> None:
    queues = QueuesClient(engine)
    async with ui_client(engine, on) as ui:
        assert (await ui.post_form("/queues/mail/pause")).status_code == 303
        assert (await queues.get("mail")).paused  # type: ignore[union-attr]
        assert (await ui.post_form("/queues/mail/resume")).status_code == 303
        assert not (await queues.get("mail")).paused  # type: ignore[union-attr]
        assert (await ui.post_form("/queues/mail/cap", {"max_concurrent": "7"})).status_code == 303
        assert (await queues.get("mail")).max_concurrent == 7  # type: ignore[union-attr]
        for bad in ("0", "-1", "many"):
            response = await ui.post_form("/queues/mail/cap", {"max_concurrent": bad})
            assert response.status_code == 400, bad
        assert (await queues.get("mail")).max_concurrent == 7  # type: ignore[union-attr]
        assert (await ui.post_form("/queues/mail/cap", {"max_concurrent": ""})).status_code == 303
        assert (await queues.get("mail")).max_concurrent is None  # type: ignore[union-attr]
        assert (await ui.post_form("/queues/bad%20name/pause")).status_code == 400


async def test_deregister_refuses_then_forces(engine: AsyncEngine, on: TaskQSettings) -> None:
    actors = ActorsClient(engine)
    await actors.set("ui_dereg", queue="dq")
    [queued] = await s.seed(engine, 1, actor="ui_dereg", queue="dq")
    async with ui_client(engine, on) as ui:
        refused = await ui.post_form("/actors/ui_dereg/deregister")
        assert refused.status_code == 409
        assert await actors.get("ui_dereg") is not None
        forced = await ui.post_form(
            "/actors/ui_dereg/deregister", {"force": "on", "purge_queue": "on"}
        )
        assert forced.status_code == 303
        assert await actors.get("ui_dereg") is None
        assert await status_of(engine, queued) == "cancelled"
        missing = await ui.post_form("/actors/ui_dereg/deregister")
        assert missing.status_code == 404


async def test_rate_limit_reset_refills_and_logs(
    engine: AsyncEngine,
    on: TaskQSettings,
    settings: TaskQSettings,
    unique_name: str,
    caplog: pytest.LogCaptureFixture,
) -> None:
    bucket = TokenBucket(unique_name, 2, 0.0, backend="postgres")
    registry = RateLimitRegistry()
    registry.register(bucket)
    for _ in range(2):
        assert (await bucket.acquire(pg_pool=engine, settings=settings)).allowed
    async with ui_client(engine, on, rate_limit_registry=registry) as ui:
        page = await ui.get("/rate-limits")
        assert "exhausted" in page.text
        assert f'data-reset="{unique_name}"' in page.text
        with caplog.at_level(logging.WARNING, logger="taskq.ratelimit"):
            done = await ui.post_form("/rate-limits/reset", {"name": unique_name})
        assert done.status_code == 303
        assert any(
            unique_name in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records
        )
        state = await bucket.peek(pg_pool=engine, settings=settings)
        assert state.tokens_remaining == 2
        assert (await ui.post_form("/rate-limits/reset", {"name": "no-such"})).status_code == 404
        assert (await ui.post_form("/rate-limits/reset", {})).status_code == 400


async def test_cron_actions_through_the_source(engine: AsyncEngine, on: TaskQSettings) -> None:
    cron = FakeCron()
    async with ui_client(engine, on, cron=cron) as ui:
        assert (await ui.post_form("/cron/nightly/disable")).status_code == 303
        assert cron.enabled["nightly"] is False
        assert (await ui.post_form("/cron/nightly/enable")).status_code == 303
        assert cron.enabled["nightly"] is True
        assert (await ui.post_form("/cron/nightly/run")).status_code == 303
        assert cron.runs == ["nightly"]
        assert (await ui.post_form("/cron/missing/enable")).status_code == 404
        assert (await ui.post_form("/cron/nightly/explode")).status_code == 400


class UiCronPayload(BaseModel):
    n: int


@actor(name="ui_cron_report", queue="ui-cron")
async def ui_cron_report(payload: UiCronPayload) -> None:
    """A schedule's actor, declared in the process that serves the UI (run now needs it)."""


async def test_cron_page_acts_on_the_stored_schedules(
    engine: AsyncEngine, on: TaskQSettings
) -> None:
    """Without a ``cron=`` source the page reads and acts on ``cron_schedules`` itself."""
    sid = f"ui-cron-{uuid.uuid4().hex[:8]}"
    await cron_ops.create_schedule(
        engine,
        ui_cron_report,
        Schedule(cron="0 3 * * *", payload=UiCronPayload(n=7), tz="Europe/Berlin", id=sid),
    )
    async with ui_client(engine, on) as ui:
        page = await ui.get("/cron")
        assert page.status_code == 200
        assert sid in page.text
        assert "Europe/Berlin" in page.text
        assert (await ui.post_form(f"/cron/{sid}/disable")).status_code == 303
        assert (await cron_ops.get_schedule(engine, sid)).enabled is False
        assert (await ui.post_form(f"/cron/{sid}/enable")).status_code == 303
        assert (await cron_ops.get_schedule(engine, sid)).enabled is True
        assert (await ui.post_form(f"/cron/{sid}/run")).status_code == 303
        assert (await ui.post_form("/cron/no-such-schedule/enable")).status_code == 404
    async with engine.connect() as conn:
        payloads = (
            (await conn.execute(select(jobs.c.payload).where(jobs.c.actor == ui_cron_report.name)))
            .scalars()
            .all()
        )
    assert [p["n"] for p in payloads] == [7]


# -- safety -------------------------------------------------------------------------


async def test_csrf_refusals_change_nothing(engine: AsyncEngine, on: TaskQSettings) -> None:
    [job] = await s.seed(engine, 1)
    async with ui_client(engine, on) as ui:
        token = await ui.token()
        cases: list[tuple[dict[str, str], str | None]] = [
            ({}, ""),  # no token
            ({}, "x" * 43),  # a token that is not the cookie's
            ({"Sec-Fetch-Site": "cross-site"}, None),
            ({"Sec-Fetch-Site": "same-site"}, None),
            ({"Origin": "http://evil.test", "Sec-Fetch-Site": ""}, None),
        ]
        for headers, sent in cases:
            response = await ui.post_form(
                f"/jobs/{job}/cancel", headers=headers, token=token if sent is None else sent
            )
            assert response.status_code == 403, (headers, sent)
            assert await status_of(engine, job) == "pending"
        # The token may come in a header instead of the form.
        ok = await ui.http.post(
            f"/jobs/{job}/cancel",
            headers={"X-CSRF-Token": token, "Sec-Fetch-Site": "same-origin"},
        )
        assert ok.status_code == 303
        assert await status_of(engine, job) == "cancelled"


async def test_actions_disabled_hide_and_refuse(
    engine: AsyncEngine, settings: TaskQSettings, unique_name: str
) -> None:
    [job] = await s.seed(engine, 1)
    async with ui_client(engine, settings) as ui:
        page = await ui.get(f"/jobs/{job}")
        assert "Cancel job" not in page.text
        assert "read-only" in page.text
        listing = await ui.get("/jobs")
        assert "Cancel selected" not in listing.text
        assert 'name="job_id"' not in listing.text
        for path in (f"/jobs/{job}/cancel", "/queues/default/pause", "/actors/x/deregister"):
            response = await ui.post_form(path)
            assert response.status_code == 403, path
            assert "TASKQ_ADMIN_ACTIONS_ENABLED" in response.text
        assert (await ui.get("/jobs/confirm?action=cancel&queue=default")).status_code == 403
    assert await status_of(engine, job) == "pending"
    default = await QueuesClient(engine).get("default")
    assert default is None or not default.paused
    # Actions on, resets still off: the reset alone is hidden and refused.
    no_reset = settings_with(settings, admin_actions_enabled=True)
    bucket = TokenBucket(unique_name, 1, 0.0, backend="postgres")
    registry = RateLimitRegistry()
    registry.register(bucket)
    await bucket.acquire(pg_pool=engine, settings=settings)
    async with ui_client(engine, no_reset, rate_limit_registry=registry) as ui:
        page = await ui.get("/rate-limits")
        assert "data-reset" not in page.text
        assert "TASKQ_ADMIN_UI_ALLOW_RATE_LIMIT_RESET" in page.text
        refused = await ui.post_form("/rate-limits/reset", {"name": unique_name})
        assert refused.status_code == 403
    assert (await bucket.peek(pg_pool=engine, settings=settings)).tokens_remaining == 0


async def test_authorize_hook_decides_per_request(engine: AsyncEngine, on: TaskQSettings) -> None:
    [job] = await s.seed(engine, 1)
    asked: list[tuple[str, str]] = []

    async def authorize(request: Request, action: str) -> bool:
        role = request.headers.get("x-role", "")
        asked.append((role, action))
        if role == "admin":
            return True
        return role == "viewer" and action == "view"

    async with ui_client(engine, on, authorize=authorize) as ui:
        assert (await ui.get("/jobs", headers={"x-role": "nobody"})).status_code == 403
        viewer = await ui.get(f"/jobs/{job}", headers={"x-role": "viewer"})
        assert viewer.status_code == 200
        assert "Cancel job" not in viewer.text
        # The viewer's page set the CSRF cookie: the refusal is the hook's, not CSRF's.
        refused = await ui.post_form(f"/jobs/{job}/cancel", headers={"x-role": "viewer"})
        assert refused.status_code == 403
        assert await status_of(engine, job) == "pending"
        admin = await ui.get(f"/jobs/{job}", headers={"x-role": "admin"})
        assert "Cancel job" in admin.text
        done = await ui.post_form(f"/jobs/{job}/cancel", headers={"x-role": "admin"})
        assert done.status_code == 303
    assert await status_of(engine, job) == "cancelled"
    assert ("viewer", "jobs.cancel") in asked
    assert ("admin", "jobs.cancel") in asked


async def test_payloads_are_redacted(engine: AsyncEngine, on: TaskQSettings) -> None:
    [job] = await s.seed(
        engine, 1, payload={"user": "ada", "password": "hunter2", "nested": {"api_key": "k-9"}}
    )
    async with ui_client(engine, on) as ui:
        page = await ui.get(f"/jobs/{job}")
    assert "hunter2" not in page.text
    assert "k-9" not in page.text
    assert "ada" in page.text
    assert "[redacted]" in page.text

    def hide_users(actor: str, field: str, value: Any) -> Any:
        return {"hidden": True} if field == "payload" else value

    async with ui_client(engine, on, redact=hide_users) as ui:
        page = await ui.get(f"/jobs/{job}")
    assert "ada" not in page.text
    assert "hidden" in page.text


async def test_security_headers_and_nonce(engine: AsyncEngine, on: TaskQSettings) -> None:
    async with ui_client(engine, on) as ui:
        first = await ui.get("/")
        second = await ui.get("/")
        forms = await ui.get("/queues")
        # The page's forms carry the cookie's token (the double submit a browser makes).
        hidden = re.findall(r'name="csrf_token" value="([^"]+)"', (await ui.get("/jobs")).text)
        assert hidden
        assert set(hidden) == {ui.http.cookies["taskq_csrf"]}
        assert forms.status_code == 200
    for response in (first, second):
        csp = response.headers["content-security-policy"]
        assert f"script-src 'nonce-{nonce_of(response.text)}'" in csp
        assert "frame-ancestors 'none'" in csp
        assert "unsafe-inline" not in csp
        assert response.headers["x-frame-options"] == "DENY"
        assert response.headers["referrer-policy"] == "same-origin"
    assert nonce_of(first.text) != nonce_of(second.text)
    cookie = first.headers["set-cookie"].lower()
    assert "httponly" in cookie
    assert "samesite=strict" in cookie


# -- progress stream ----------------------------------------------------------------


async def _set_progress(engine: AsyncEngine, job_id: uuid.UUID, **values: Any) -> None:
    async with engine.begin() as conn:
        await conn.execute(update(jobs).where(jobs.c.id == job_id).values(**values))


async def test_sse_from_the_store_resumes_after_last_event_id(
    engine: AsyncEngine, on: TaskQSettings
) -> None:
    [job] = await s.seed(engine, 1, status="running", progress={"percent": 10}, progress_seq=3)

    async def worker() -> None:
        for seq, percent in ((4, 40), (5, 80)):
            await asyncio.sleep(0.15)
            await _set_progress(engine, job, progress={"percent": percent}, progress_seq=seq)
        await asyncio.sleep(0.15)
        await _set_progress(engine, job, status="succeeded", progress_seq=6)

    async with ui_client(engine, on, progress_poll_interval=0.05) as ui:
        task = asyncio.create_task(worker())
        response = await ui.get(f"/jobs/{job}/progress", headers={"Last-Event-ID": "3"})
        await task
        assert response.headers["content-type"].startswith("text/event-stream")
        events = sse_events(response.text)
        assert [e["id"] for e in events] == ["4", "5", "6"]
        data = [json.loads(e["data"]) for e in events]
        assert [d["state"].get("percent") for d in data[:2]] == [40, 80]
        assert data[-1]["terminal"] is True
        assert data[-1]["status"] == "succeeded"
        # Reconnecting after an event before the end: the current (terminal) state only.
        resumed = sse_events((await ui.get(f"/jobs/{job}/progress?last_event_id=4")).text)
        assert [e["id"] for e in resumed] == ["6"]
        # Reconnecting after the terminal event: 204, EventSource stops.
        done = await ui.get(f"/jobs/{job}/progress", headers={"Last-Event-ID": "6"})
        assert done.status_code == 204
        bad = await ui.get(f"/jobs/{job}/progress", headers={"Last-Event-ID": "abc"})
        assert bad.status_code == 400


async def test_sse_from_redis_pubsub(
    pg_engine_redis: tuple[AsyncEngine, Any], on: TaskQSettings
) -> None:
    engine, redis = pg_engine_redis
    from taskq.progress import event_message, progress_channel

    [job] = await s.seed(engine, 1, status="running", progress={"percent": 5}, progress_seq=3)
    channel = progress_channel(job)

    async def subscribed() -> bool:
        return bool((await redis.pubsub_numsub(channel))[0][1])

    async def worker() -> None:
        for _ in range(500):  # the stream subscribes before it reads the row
            if await subscribed():
                break
            await asyncio.sleep(0.02)
        await redis.publish(channel, event_message(job, 4, "progress", "running", {"percent": 50}))
        await redis.publish(channel, event_message(job, 4, "progress", "running", {"percent": 50}))
        await redis.publish(channel, event_message(job, 2, "progress", "running", {"percent": 1}))
        await _set_progress(engine, job, status="succeeded", progress_seq=5)
        await redis.publish(channel, event_message(job, 5, "succeeded", "succeeded", {}))

    async with ui_client(engine, on, redis_client=redis, progress_poll_interval=0.05) as ui:
        task = asyncio.create_task(worker())
        response = await ui.get(f"/jobs/{job}/progress", headers={"Last-Event-ID": "2"})
        await task
    events = sse_events(response.text)
    assert [e["id"] for e in events] == ["3", "4", "5"]  # row state, then the channel, once each
    assert json.loads(events[1]["data"])["state"] == {"percent": 50}
    assert json.loads(events[-1]["data"])["terminal"] is True


async def test_sse_sends_what_was_published_before_a_quiet_poll_finds_the_end(
    pg_engine_redis: tuple[AsyncEngine, Any],
) -> None:
    """The race a loaded machine hit: the channel is quiet for one poll interval, and
    before the row is re-read the worker publishes seq 4, then ends the job (seq 5) and
    its terminal publish is lost. The stream sends 4 before the end, never 3 then 5."""
    engine, redis = pg_engine_redis
    from taskq.ops.progress_sse import ProgressFeed
    from taskq.ops.stats import ProgressSnapshot, StatsClient
    from taskq.progress import event_message, progress_channel

    [job] = await s.seed(engine, 1, status="running", progress={"percent": 5}, progress_seq=3)

    class RaceAtTheFirstQuietPoll(StatsClient):
        reads = 0

        async def progress(self, job_id: uuid.UUID | str) -> ProgressSnapshot | None:
            self.reads += 1
            if self.reads == 3:  # open, the re-read after subscribing, the first quiet poll
                message = event_message(job, 4, "progress", "running", {"percent": 50})
                await redis.publish(progress_channel(job), message)
                await _set_progress(engine, job, status="succeeded", progress_seq=5)
            return await super().progress(job_id)

    feed = ProgressFeed(RaceAtTheFirstQuietPoll(engine), redis, poll_interval=0.05)
    stream = await feed.open(job, 2)
    assert stream is not None
    events = sse_events("".join([chunk async for chunk in stream]))
    assert [e["id"] for e in events] == ["3", "4", "5"]
    assert json.loads(events[1]["data"])["state"] == {"percent": 50}
    assert json.loads(events[-1]["data"])["terminal"] is True


@pytest.fixture
async def pg_engine_redis(pg_url: Any, settings: TaskQSettings, redis_url: str) -> Any:
    from redis.asyncio import Redis

    from taskq.db.engine import make_engine

    engine = make_engine(pg_url, settings=settings)
    redis = Redis.from_url(redis_url)
    yield engine, redis
    await redis.aclose()
    await engine.dispose()


async def test_actor_statistics_over_a_window(engine: AsyncEngine, on: TaskQSettings) -> None:
    from datetime import UTC, datetime, timedelta

    from taskq.ops.stats import StatsClient

    start = datetime.now(UTC) - timedelta(minutes=10)
    started: dict[str, Any] = {"started_at": start}
    await s.seed(engine, 4, actor="ui_stat", status="succeeded", start=start, **started)
    await s.seed(
        engine, 1, actor="ui_stat", status="failed", error_class="Boom", start=start, **started
    )
    await s.seed(
        engine,
        1,
        actor="ui_stat",
        status="crashed",
        error_class="Late",
        start=start + timedelta(seconds=30),
        **started,
    )
    old = datetime.now(UTC) - timedelta(days=3)
    await s.seed(engine, 2, actor="ui_stat", status="failed", error_class="Old", start=old)
    stats = (await StatsClient(engine).actors_stats(timedelta(hours=1), ["ui_stat"]))["ui_stat"]
    assert (stats.completed, stats.failures, stats.last_error_class) == (6, 2, "Late")
    # Durations finished - started: 5, 6, 7, 8 (succeeded), 5 (failed), 35 (crashed) s.
    assert stats.p50_s == pytest.approx(6.0)
    assert stats.p99_s == pytest.approx(35.0)
    week = (await StatsClient(engine).actors_stats(timedelta(days=7), ["ui_stat"]))["ui_stat"]
    assert (week.completed, week.last_error_class) == (8, "Late")
    await ActorsClient(engine).set("ui_stat", queue="default")
    async with ui_client(engine, on) as ui:
        page = await ui.get("/actors?window=1h")
    row = page.text.split('data-actor="ui_stat"', 1)[1].split("</tr>", 1)[0]
    assert ">6<" in row
    assert "33.3%" in row
    assert "Late" in row


async def test_waiting_job_shows_when_it_runs_and_the_drain_estimate(
    engine: AsyncEngine, on: TaskQSettings
) -> None:
    from datetime import UTC, datetime, timedelta

    recent = datetime.now(UTC) - timedelta(minutes=30)
    await s.seed(engine, 6, actor="ui_done", queue="drain", status="succeeded", start=recent)
    [waiting] = await s.seed(engine, 1, actor="ui_wait", queue="drain", start=recent)
    await s.seed(engine, 2, actor="ui_wait", queue="drain", start=recent)
    async with ui_client(engine, on) as ui:
        page = await ui.get(f"/jobs/{waiting}")
        finished = await ui.get(f"/jobs/{(await s.seed(engine, 1, status='succeeded'))[0]}")
    assert "Why it is waiting" in page.text
    # 3 pending in the queue, 6 finished over the last hour: 30 minutes to drain.
    assert "has 3 pending jobs and finished 6 in the last hour" in page.text
    assert "drains in about 30 min" in page.text
    assert "Why it is waiting" not in finished.text
