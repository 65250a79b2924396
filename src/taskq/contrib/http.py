"""What every framework's "429 Too Many Requests" helper shares: the ``Retry-After`` value.

A denial carries ``retry_after`` (when the bucket will have the tokens again); HTTP wants
whole seconds, rounded up so a client that waits exactly that long is admitted. A fixed
quota that is used up (``retry_after is None``) has no time to give: no header.
"""

from __future__ import annotations

import math

from taskq.ratelimit.decision import RateLimitDecision

__all__ = ["TOO_MANY_REQUESTS", "retry_after_header"]

TOO_MANY_REQUESTS = 429


def retry_after_header(decision: RateLimitDecision) -> dict[str, str]:
    """The response headers for a denied ``decision``: ``{"Retry-After": "<seconds>"}``
    (at least 1), or none for an exhausted fixed quota."""
    if decision.retry_after is None:
        return {}
    return {"Retry-After": str(max(1, math.ceil(decision.retry_after.total_seconds())))}
