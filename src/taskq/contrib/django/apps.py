"""The ``taskq`` Django app: add ``"taskq.contrib.django"`` to ``INSTALLED_APPS``."""

from __future__ import annotations

from django.apps import AppConfig

__all__ = ["TaskQConfig"]


class TaskQConfig(AppConfig):
    """taskq's app: its migrations create taskq's tables; ``manage.py taskq_worker``."""

    name = "taskq.contrib.django"
    label = "taskq"
    verbose_name = "taskq"
    default_auto_field = "django.db.models.BigAutoField"
