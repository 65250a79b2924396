"""The shop's tables: orders, and the shipments a job makes for them."""

from __future__ import annotations

from django.db import models


class Order(models.Model):
    """An order placed by a view."""

    user = models.CharField(max_length=50)


class Shipment(models.Model):
    """Written by the ``ship_order`` job, in the worker."""

    order = models.ForeignKey(Order, on_delete=models.CASCADE)
