"""The admin UI's actions (POST): cancel and retry jobs (one, the selected ones, or all
that match a filter), pause/resume a queue and set its cap, deregister an actor, reset
a rate limit, and the cron schedule actions.

Each one checks, in order: the CSRF protections, that actions are enabled and the
``authorize`` hook allows it, then its input; only then does it act, through the
operations layer, and redirect (303) back with a message saying what it did.
"""

from __future__ import annotations

import logging
from typing import Any

from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from taskq.exceptions import JobNotFoundError, JobNotRetryableError, SingletonCollisionError
from taskq.job_filter import JobFilter
from taskq.ui import inputs
from taskq.ui.app import Admin, Conflict, admin_of, redirect
from taskq.ui.inputs import BadInput
from taskq.ui.security import check_csrf

__all__ = ["routes"]

_log = logging.getLogger("taskq.ui")


async def _form(request: Request, action: str) -> tuple[Admin, Any]:
    """The request's form, once CSRF and the action's gate and hook have passed."""
    admin = admin_of(request)
    try:
        form = await request.form()
    except Exception as exc:  # a malformed multipart body
        raise BadInput(f"unreadable form: {exc}") from None
    check_csrf(request, form)
    await admin.require(request, action)
    return admin, form


def _back(form: Any, default: str) -> str:
    return inputs.safe_next(form.get("next"), default)


async def cancel_job(request: Request) -> Response:
    """Cancel one job (pending/scheduled at once; running through the cancel ladder)."""
    admin, form = await _form(request, "jobs.cancel")
    job_id = inputs.job_id(request.path_params["job_id"])
    record = await admin.tq.jobs.cancel(job_id)
    _log.info("admin-ui job-cancel job_id=%s status=%s", job_id, record.status)
    note = "cancel requested" if record.status == "running" else f"now {record.status}"
    return redirect(request, _back(form, f"/jobs/{job_id}"), f"job {job_id}: {note}")


async def retry_job(request: Request) -> Response:
    """Retry one failed, cancelled, crashed or abandoned job."""
    admin, form = await _form(request, "jobs.retry")
    job_id = inputs.job_id(request.path_params["job_id"])
    await admin.tq.jobs.retry(job_id)
    return redirect(request, _back(form, f"/jobs/{job_id}"), f"job {job_id}: retried")


async def bulk(request: Request) -> Response:
    """Cancel or retry the selected jobs (``job_id`` repeated)."""
    form = await request.form()
    action = form.get("action")
    if action not in ("cancel", "retry"):
        check_csrf(request, form)
        raise BadInput("action must be cancel or retry")
    admin, form = await _form(request, f"jobs.{action}")
    ids = inputs.job_ids(form)
    done = skipped = 0
    for job_id in ids:
        try:
            if action == "cancel":
                record = await admin.tq.jobs.cancel(job_id)
                done += record.status in ("cancelled", "running")
            else:
                await admin.tq.jobs.retry(job_id)
                done += 1
        except (JobNotFoundError, JobNotRetryableError, SingletonCollisionError):
            skipped += 1  # one job in a state that refuses never stops the others
    verb = "cancelled or cancel requested" if action == "cancel" else "retried"
    return redirect(
        request, _back(form, "/jobs"), f"{done} of {len(ids)} {verb}; {skipped} skipped"
    )


async def where(request: Request) -> Response:
    """Cancel or retry everything matching the submitted filter (after the confirm page)."""
    form = await request.form()
    action = form.get("action")
    if action not in ("cancel", "retry"):
        check_csrf(request, form)
        raise BadInput("action must be cancel or retry")
    admin, form = await _form(request, f"jobs.{action}")
    flt = inputs.job_filter(form)
    if flt == JobFilter():
        raise BadInput("give at least one filter: acting on every job is not offered here")
    back = "/jobs?" + inputs.filter_query(form)
    if action == "cancel":
        result = await admin.tq.jobs.cancel_where(flt)
        message = (
            f"cancelled {result.cancelled_before_start} before start, "
            f"requested cancel of {result.cancel_requested} running"
            + (f", {result.not_reached} not reached (try again)" if result.not_reached else "")
        )
    else:
        retried = await admin.tq.jobs.retry_where(flt)
        message = f"retried {retried.retried}" + (
            f"; {len(retried.singleton_blocked)} singleton jobs left (actor busy)"
            if retried.singleton_blocked
            else ""
        )
    _log.info("admin-ui jobs-%s-where filter=%s %s", action, flt.to_json(), message)
    return redirect(request, back, message)


async def queue_pause(request: Request) -> Response:
    """Pause a queue: workers claim none of its jobs until it is resumed."""
    admin, form = await _form(request, "queues.pause")
    name = _queue(request)
    await admin.tq.queues.pause(name)
    return redirect(request, _back(form, "/queues"), f"queue {name}: paused")


async def queue_resume(request: Request) -> Response:
    """Resume a paused queue."""
    admin, form = await _form(request, "queues.resume")
    name = _queue(request)
    await admin.tq.queues.resume(name)
    return redirect(request, _back(form, "/queues"), f"queue {name}: resumed")


async def queue_cap(request: Request) -> Response:
    """Set (or clear, with an empty value) a queue's fleet-wide concurrency cap."""
    admin, form = await _form(request, "queues.cap")
    name = _queue(request)
    cap = inputs.queue_cap(form)
    await admin.tq.queues.set_max_concurrent(name, cap)
    shown = "none" if cap is None else str(cap)
    return redirect(
        request,
        _back(form, "/queues"),
        f"queue {name}: max_concurrent {shown} (workers apply it as they restart)",
    )


def _queue(request: Request) -> str:
    from taskq.constants import validate_queue_name

    try:
        return validate_queue_name(request.path_params["name"])
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from None


async def deregister(request: Request) -> Response:
    """Deregister an actor (``force`` and ``purge_queue`` as the actors page describes)."""
    admin, form = await _form(request, "actors.deregister")
    name = request.path_params["name"]
    from taskq.actor import validate_actor_name

    try:
        validate_actor_name(name)
    except (TypeError, ValueError) as exc:
        raise BadInput(str(exc)) from None
    force = inputs.parse_bool(form, "force")
    purge = inputs.parse_bool(form, "purge_queue")
    result = await admin.tq.actors.deregister(name, force=force, purge_queue=purge)
    _log.warning("admin-ui actor-deregistered actor=%s force=%s purge_queue=%s", name, force, purge)
    return redirect(
        request,
        _back(form, "/actors"),
        f"actor {name}: deregistered; {result.jobs_cancelled} jobs cancelled, "
        f"{result.schedules_disabled} schedules disabled"
        + (", queue removed" if result.queue_purged else ""),
    )


async def reset_limit(request: Request) -> Response:
    """Refill a rate limit at once (logged at WARNING by the operations layer)."""
    admin, form = await _form(request, "ratelimits.reset")
    name = form.get("name")
    if not isinstance(name, str) or not name.strip():
        raise BadInput("name: which rate limit to reset")
    await admin.rate_limits.reset(name.strip())
    return redirect(request, _back(form, "/rate-limits"), f"rate limit {name.strip()}: reset")


async def cron_action(request: Request) -> Response:
    """Enable, disable or run a cron schedule now, through the configured source."""
    verb = request.path_params["verb"]
    if verb not in ("enable", "disable", "run"):
        raise BadInput("unknown cron action")
    admin, form = await _form(request, f"cron.{verb}")
    source = admin.cron
    if source is None:
        raise Conflict("no cron schedule source is configured")
    schedule_id = request.path_params["schedule_id"]
    if verb == "enable":
        await source.enable(schedule_id)
        message = f"schedule {schedule_id}: enabled"
    elif verb == "disable":
        await source.disable(schedule_id)
        message = f"schedule {schedule_id}: disabled"
    else:
        job = await source.run_now(schedule_id)
        message = f"schedule {schedule_id}: enqueued job {job}"
    return redirect(request, _back(form, "/cron"), message)


def routes() -> list[Route]:
    """The action routes (POST only)."""
    return [
        Route("/jobs/bulk", bulk, methods=["POST"]),
        Route("/jobs/where", where, methods=["POST"]),
        Route("/jobs/{job_id}/cancel", cancel_job, methods=["POST"]),
        Route("/jobs/{job_id}/retry", retry_job, methods=["POST"]),
        Route("/queues/{name}/pause", queue_pause, methods=["POST"]),
        Route("/queues/{name}/resume", queue_resume, methods=["POST"]),
        Route("/queues/{name}/cap", queue_cap, methods=["POST"]),
        Route("/actors/{name}/deregister", deregister, methods=["POST"]),
        Route("/rate-limits/reset", reset_limit, methods=["POST"]),
        Route("/cron/{schedule_id}/{verb}", cron_action, methods=["POST"]),
    ]
