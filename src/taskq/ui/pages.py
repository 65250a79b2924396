"""The admin UI's pages (GET, read-only): overview, jobs, job detail, actors, rate limits,
queues, workers, cron, and the confirmation page of a bulk action on a filter.

Counts are capped (``tq.jobs.count(..., cap=...)``) and lists keyset-paginated, so every
page stays fast on a table of millions of jobs.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from taskq.constants import JOB_STATUSES
from taskq.job_filter import JobFilter
from taskq.ops.results import JobCount
from taskq.ops.stats import SAMPLE_LIMIT, THROUGHPUT_LIMIT, ActorStats, actor_sample_size
from taskq.ui import inputs
from taskq.ui.app import admin_of
from taskq.ui.inputs import BadInput

__all__ = ["OVERVIEW_CAP", "routes"]

OVERVIEW_CAP = 1_000
"""Where the overview's, queues page's and actors page's counts stop counting ("1000+")."""
ACTIVE = ("pending", "scheduled", "running")
REFRESH_S = 5
"""How often the overview, queues and workers pages re-read themselves in the browser."""
LIST_CAP = 1_000
"""Where the jobs page's "N matching" stops counting."""
CONFIRM_CAP = 100_000
"""Where the confirmation page's count stops counting."""
STOPPED_SHOWN = 100
"""How many stopped workers the workers page lists (the newest; live ones always)."""


async def _view(request: Request) -> None:
    await admin_of(request).require(request, "view")


def _waiting(job: Any) -> dict[str, Any] | None:
    # ``waiting_on``/``ready_at`` come with the dispatch work (parked jobs); a store
    # without them shows the scheduled time only.
    waiting_on = getattr(job, "waiting_on", None)
    ready_at = getattr(job, "ready_at", None)
    if job.status not in ("pending", "scheduled"):
        return None
    return {"waiting_on": waiting_on, "ready_at": ready_at or job.scheduled_at}


async def overview(request: Request) -> Response:
    """Per queue: active counts (capped), paused, cap; the last hour's throughput chart;
    the workers and the leader; the rate limits holding jobs back now."""
    await _view(request)
    admin = admin_of(request)
    queues = await admin.tq.queues.list()
    names = sorted({q.name for q in queues} | {"default"})
    by_name = {q.name: q for q in queues}
    counts = await _active_counts(request, names)
    rows = [{"name": n, "config": by_name.get(n), "counts": counts[n]} for n in names]
    throughput = await admin.cached(
        "throughput", lambda: admin.stats.throughput(timedelta(hours=1), 12)
    )
    workers = await admin.workers.list()
    limits = await admin.rate_limits.list()
    holding = [r for r in limits if r.state is not None and r.state.is_exhausted]
    return await admin.render(
        request,
        "overview.html",
        page="overview",
        refresh=REFRESH_S,
        queues=rows,
        throughput=throughput,
        chart=_chart(throughput.succeeded, throughput.failed),
        workers=workers,
        leaders=[w for w in workers if w.leader],
        throughput_cap=THROUGHPUT_LIMIT
        if admin.engine.dialect.name == "postgresql"
        else SAMPLE_LIMIT,
        holding=holding,
    )


async def _active_counts(request: Request, queues: list[str]) -> dict[str, dict[str, JobCount]]:
    """Each queue's pending, scheduled and running counts (capped; one transaction,
    cached briefly)."""
    admin = admin_of(request)

    async def compute() -> dict[str, dict[str, JobCount]]:
        keys = [((status,), queue, None) for queue in queues for status in ACTIVE]
        found = iter(await admin.stats.active_counts(keys, cap=OVERVIEW_CAP))
        return {queue: {status: next(found) for status in ACTIVE} for queue in queues}

    counts: dict[str, dict[str, JobCount]] = await admin.cached(
        ("queue-counts", tuple(queues)), compute
    )
    return counts


def _chart(ok: list[int], bad: list[int]) -> dict[str, Any]:
    """Bar geometry for the inline SVG chart (attributes only: the CSP allows no styles)."""
    width, height, gap = 24, 80, 4
    peak = max([a + b for a, b in zip(ok, bad, strict=True)] + [1])
    bars = []
    for i, (a, b) in enumerate(zip(ok, bad, strict=True)):
        ha = round(a / peak * height)
        hb = round(b / peak * height)
        x = i * (width + gap)
        bars.append(
            {
                "x": x,
                "w": width,
                "ok_y": height - ha,
                "ok_h": ha,
                "bad_y": height - ha - hb,
                "bad_h": hb,
                "ok": a,
                "bad": b,
            }
        )
    return {"bars": bars, "width": len(ok) * (width + gap), "height": height, "peak": peak}


async def jobs_page(request: Request) -> Response:
    """The jobs list: filters, keyset pages, bulk actions on the selection or the filter."""
    await _view(request)
    admin = admin_of(request)
    params = request.query_params
    flt = inputs.job_filter(params)
    limit = inputs.page_limit(params)
    after = params.get("after") or None
    try:
        page = await admin.tq.jobs.list(flt, limit=limit, after=after)
    except ValueError as exc:
        raise BadInput(str(exc)) from None
    count = await admin.tq.jobs.count(flt, cap=LIST_CAP)
    query = inputs.filter_query(params)
    return await admin.render(
        request,
        "jobs.html",
        page="jobs",
        jobs=page.jobs,
        next_cursor=page.next_cursor,
        count=count,
        flt=flt,
        statuses=JOB_STATUSES,
        query=query,
        limit=limit,
        values={name: params.get(name, "") for name in inputs.FILTER_FIELDS},
        waiting=_waiting,
    )


async def confirm_page(request: Request) -> Response:
    """Confirm cancel/retry on everything a filter matches, showing how many that is."""
    await _view(request)
    admin = admin_of(request)
    action = request.query_params.get("action")
    if action not in ("cancel", "retry"):
        raise BadInput("action must be cancel or retry")
    await admin.require(request, f"jobs.{action}")
    flt = inputs.job_filter(request.query_params)
    if flt == JobFilter():
        raise BadInput("give at least one filter: acting on every job is not offered here")
    count = await admin.tq.jobs.count(flt, cap=CONFIRM_CAP)
    return await admin.render(
        request,
        "confirm.html",
        page="jobs",
        action=action,
        flt=flt,
        count=count,
        query=inputs.filter_query(request.query_params),
        fields=[
            (name, value)
            for name in inputs.FILTER_FIELDS
            for value in request.query_params.getlist(name)
            if value.strip()
        ],
    )


async def job_page(request: Request) -> Response:
    """One job: payload (redacted), result, attempts, progress, timings, parent, children,
    why it is waiting and its queue's drain estimate."""
    await _view(request)
    admin = admin_of(request)
    job_id = inputs.job_id(request.path_params["job_id"])
    detail = await admin.tq.jobs.detail(job_id)
    job = detail.job
    children, more_children = await admin.stats.children(job.id, 50)
    redact = admin.redact
    waiting = _waiting(job)
    eta = None
    if waiting is not None:
        eta = await _drain_eta(request, job.queue)
    return await admin.render(
        request,
        "job.html",
        page="jobs",
        job=job,
        attempts=detail.attempts,
        retries=detail.manual_retries,
        payload=redact(job.actor, "payload", job.payload),
        result=redact(job.actor, "result", job.result),
        progress=redact(job.actor, "progress", job.progress),
        children=children,
        more_children=more_children,
        waiting=waiting,
        eta=eta,
    )


async def _drain_eta(request: Request, queue: str) -> dict[str, Any]:
    """Jobs ready in ``queue`` and, at the last hour's rate, how long they take to drain."""
    admin = admin_of(request)
    ahead = await admin.stats.active_count(("pending",), queue=queue, cap=OVERVIEW_CAP)
    done, _capped = await admin.stats.finished_since(timedelta(hours=1), queue)
    per_s = done / 3600
    seconds = ahead.count / per_s if per_s > 0 else None
    return {"ahead": ahead, "per_hour": done, "seconds": seconds}


async def actors_page(request: Request) -> Response:
    """Every ``actor_config`` row: active jobs, schedules, executor statistics."""
    await _view(request)
    admin = admin_of(request)
    label, window = inputs.window(request.query_params)
    rows = await admin.tq.actors.list()
    schedules = await admin.stats.schedule_counts()
    names = [row.actor for row in rows]
    stats_by_actor = await admin.cached(
        ("actors-stats", label, tuple(names)), lambda: admin.stats.actors_stats(window, names)
    )

    async def active() -> list[JobCount]:
        keys = [(ACTIVE, None, name) for name in names]
        return await admin.stats.active_counts(keys, cap=OVERVIEW_CAP)

    counts: list[JobCount] = await admin.cached(("actor-active", tuple(names)), active)
    out = [
        {
            "row": row,
            "active": count,
            "schedules": schedules.get(row.actor, (0, 0)),
            "stats": stats_by_actor.get(row.actor)
            or ActorStats(row.actor, window, 0, 0, None, None, None, None, False),
        }
        for row, count in zip(rows, counts, strict=True)
    ]
    return await admin.render(
        request,
        "actors.html",
        page="actors",
        actors=out,
        window=label,
        windows=inputs.WINDOWS,
        sample=actor_sample_size(len(names)),
    )


async def rate_limits_page(request: Request) -> Response:
    """Static and published keyed buckets with their decoded peek state."""
    await _view(request)
    admin = admin_of(request)
    limits = await admin.rate_limits.list()
    return await admin.render(
        request,
        "rate_limits.html",
        page="rate-limits",
        limits=limits,
        reset_gate=admin.gate("ratelimits.reset"),
    )


async def queues_page(request: Request) -> Response:
    """Queues: paused, cap, actors, active counts; pause/resume and cap forms."""
    await _view(request)
    admin = admin_of(request)
    queues = await admin.tq.queues.list()
    counts = await _active_counts(request, [q.name for q in queues])
    rows = [{"q": q, "counts": counts[q.name]} for q in queues]
    return await admin.render(request, "queues.html", page="queues", queues=rows, refresh=REFRESH_S)


async def workers_page(request: Request) -> Response:
    """The fleet: host, pid, queues, heartbeat age, running jobs, leader leases."""
    await _view(request)
    admin = admin_of(request)
    include = inputs.parse_bool(request.query_params, "stopped")
    workers = await admin.workers.list(include_stopped=include, stopped_limit=STOPPED_SHOWN)
    return await admin.render(
        request,
        "workers.html",
        page="workers",
        workers=workers,
        include_stopped=include,
        stopped_shown=STOPPED_SHOWN,
        refresh=REFRESH_S,
    )


async def cron_page(request: Request) -> Response:
    """The cron schedules of the configured source, with enable/disable/run now."""
    await _view(request)
    admin = admin_of(request)
    schedules = await admin.cron.list() if admin.cron is not None else None
    return await admin.render(request, "cron.html", page="cron", schedules=schedules)


def routes() -> list[Route]:
    """The page routes."""
    return [
        Route("/", overview, methods=["GET"]),
        Route("/jobs", jobs_page, methods=["GET"]),
        Route("/jobs/confirm", confirm_page, methods=["GET"]),
        Route("/jobs/{job_id}", job_page, methods=["GET"]),
        Route("/actors", actors_page, methods=["GET"]),
        Route("/rate-limits", rate_limits_page, methods=["GET"]),
        Route("/queues", queues_page, methods=["GET"]),
        Route("/workers", workers_page, methods=["GET"]),
        Route("/cron", cron_page, methods=["GET"]),
    ]
