"""Rate limits in Django views: take from a bucket, answer a denial with a 429."""

from __future__ import annotations

from typing import Any

from django.http import HttpResponse

from taskq.contrib.http import TOO_MANY_REQUESTS, retry_after_header
from taskq.ratelimit.decision import RateLimitDecision
from taskq.ratelimit.refs import KeyedRateLimitRef
from taskq_sync.ratelimit.registry import registry

__all__ = ["acquire_rate_limit", "too_many_requests"]


def too_many_requests(
    decision: RateLimitDecision, content: str = "Too Many Requests"
) -> HttpResponse:
    """A 429 ``HttpResponse`` with ``Retry-After`` (whole seconds) for a denied ``decision``."""
    return HttpResponse(content, status=TOO_MANY_REQUESTS, headers=retry_after_header(decision))


def acquire_rate_limit(
    limit: str | KeyedRateLimitRef[Any], *, key: str | None = None, count: float = 1.0
) -> RateLimitDecision:
    """Take ``count`` from rate limit ``limit`` (a registered name, or a keyed ref with
    ``key=``, e.g. the user's id) in the default registry, with the project's taskq
    settings (its ``REDIS_URL``) and database (Postgres-backed buckets); returns the decision (``too_many_requests`` it when
    denied)."""
    from taskq.contrib.django.client import get_taskq

    tq = get_taskq()
    with registry.acquire(
        limit, key=key, count=count, pg_pool=tq.engine, settings=tq.settings
    ) as decision:
        return decision
