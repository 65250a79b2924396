"""Place an order: the row and its shipping job commit together (``atomic()``)."""

from __future__ import annotations

from django.db import transaction
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt

from orders.actors import Ship, ship
from orders.models import Order
from taskq.contrib.django import enqueue


@csrf_exempt
def place_order(request: HttpRequest) -> HttpResponse:
    with transaction.atomic():
        order = Order.objects.create(item=request.GET.get("item", "book"))
        job = enqueue(ship, Ship(order_id=order.pk))  # on Django's connection, in atomic()
    return JsonResponse({"order": order.pk, "job": str(job.job_id)})


def shipping_api(request: HttpRequest) -> HttpResponse:
    """Stands in for the shipping company's API."""
    return JsonResponse({"booked": request.GET.get("order")})
