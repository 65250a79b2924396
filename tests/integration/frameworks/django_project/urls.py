"""One view: place an order (a row and a job), limited per user by a keyed bucket."""

from __future__ import annotations

import os

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.urls import path
from pydantic import BaseModel
from shop.actors import OrderRef, ship_order
from shop.models import Order

from taskq.contrib.django import acquire_rate_limit, enqueue, too_many_requests
from taskq.ratelimit import KeyedRateLimitRef


class User(BaseModel):
    user: str


PER_USER = KeyedRateLimitRef.typed(
    User,
    base_name=f"dj_orders_{os.environ.get('DJ_UNIQUE', 'x')}",
    key_fn=lambda u: u.user,
    capacity=3,
    refill_per_second=0.001,
)


def place_order(request: HttpRequest, user: str) -> HttpResponse:
    decision = acquire_rate_limit(PER_USER, key=user)
    if not decision.allowed:
        return too_many_requests(decision)
    with transaction.atomic():
        order = Order.objects.create(user=user)
        handle = enqueue(ship_order, OrderRef(order_id=order.pk))
    return JsonResponse({"order": order.pk, "job": str(handle.job_id)})


urlpatterns = [path("orders/<str:user>", place_order)]
