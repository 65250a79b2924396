"""Settings of the Django example: Postgres, taskq's app, taskq as the Tasks backend."""

from __future__ import annotations

import os

SECRET_KEY = "example-only"
DEBUG = True
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "shopsite.urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "taskq.contrib.django",  # `migrate` creates taskq's tables; `manage.py taskq_worker`
    "orders",
]
try:
    import django.tasks  # noqa: F401  (Django 6 has Tasks built in)
except ImportError:
    INSTALLED_APPS.append("django_tasks")  # the backport on Django 5.2
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DB_NAME", "postgres"),
        "USER": os.environ.get("DB_USER", "postgres"),
        "HOST": os.environ.get("DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DB_PORT", "5432"),
    }
}
TASKQ: dict[str, str] = {}  # e.g. {"REDIS_URL": "redis://127.0.0.1:6379/0"}
TASKS = {"default": {"BACKEND": "taskq.contrib.django.TaskQBackend"}}
SHIPPING_API_URL = os.environ.get("SHIPPING_API_URL", "http://127.0.0.1:8000/shipping-api")
