"""Settings of the Django test project: Postgres from ``DJ_DB_*``, taskq's app, Tasks."""

from __future__ import annotations

import os

SECRET_KEY = "test-only"
DEBUG = False
ALLOWED_HOSTS = ["*"]
USE_TZ = True
ROOT_URLCONF = "urls"
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = [
    "django.contrib.contenttypes",
    "django.contrib.auth",
    "taskq.contrib.django",
    "shop",
]
try:
    import django.tasks  # noqa: F401  (Django >= 6)
except ImportError:
    INSTALLED_APPS.append("django_tasks")
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": os.environ.get("DJ_DB_NAME", "taskq_django"),
        "USER": os.environ.get("DJ_DB_USER", "postgres"),
        "HOST": os.environ.get("DJ_DB_HOST", "127.0.0.1"),
        "PORT": os.environ.get("DJ_DB_PORT", "5432"),
    }
}
TASKQ = {"REDIS_URL": os.environ.get("DJ_REDIS_URL", "redis://127.0.0.1:6379/0")}
TASKS = {
    "default": {
        "BACKEND": "taskq.contrib.django.TaskQBackend",
        "QUEUES": ["default", "limited", "other"],
    }
}
