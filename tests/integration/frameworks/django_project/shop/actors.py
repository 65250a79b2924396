"""The shop's taskq actors (``manage.py taskq_worker`` finds this module)."""

from __future__ import annotations

from pydantic import BaseModel

from taskq import actor


class OrderRef(BaseModel):
    order_id: int


@actor(name="dj_ship_order", queue="shop")
def ship_order(payload: OrderRef) -> None:
    """Ship the order: one shipment row, written in the worker."""
    from shop.models import Shipment

    Shipment.objects.create(order_id=payload.order_id)


ACTORS = [ship_order]
