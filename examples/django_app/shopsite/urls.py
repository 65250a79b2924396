"""The example's URLs."""

from __future__ import annotations

from django.urls import path
from orders import views

urlpatterns = [
    path("orders", views.place_order),
    path("shipping-api", views.shipping_api),
]
