"""The shop's taskq actors (``manage.py taskq_worker`` finds this module)."""

from __future__ import annotations

import urllib.request

from django.conf import settings
from pydantic import BaseModel

from taskq import actor
from taskq.ratelimit import TokenBucket

SHIPPING_API = TokenBucket("shipping_api", capacity=2, refill_per_second=2, backend="postgres")
"""The shipping company's quota: 2 calls a second, fleet-wide (kept in Postgres)."""


class Ship(BaseModel):
    order_id: int


@actor(name="django_example_ship", queue="shipping", rate_limits=[SHIPPING_API])
def ship(payload: Ship) -> None:
    """Book the shipment with the (rate-limited) shipping API, then mark the order."""
    from orders.models import Order

    url = f"{settings.SHIPPING_API_URL}?order={payload.order_id}"
    with urllib.request.urlopen(url, timeout=10) as reply:
        reply.read()
    Order.objects.filter(pk=payload.order_id).update(shipped=True)
