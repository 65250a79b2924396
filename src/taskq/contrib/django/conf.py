"""taskq's settings in a Django project: ``settings.TASKQ`` or ``TASKQ_*``, and DATABASES.

``TASKQ = {"SCHEMA_NAME": "jobs", "REDIS_URL": "redis://..."}`` (keys are
:class:`~taskq.settings.TaskQSettings` field names, any case), or the same as separate
``TASKQ_SCHEMA_NAME = ...`` settings; both on top of the environment's ``TASKQ_*``.
Without a database URL, taskq uses the Django database ``TASKQ["DATABASE"]`` (default
``"default"``) as Django currently sees it, so the test runner's test database is the
one used under ``manage.py test``.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings as django_settings
from django.db import connections
from sqlalchemy.engine import URL

from taskq.settings import TaskQSettings, WorkerSettings

__all__ = ["database_alias", "database_url", "taskq_settings"]


def _options() -> dict[str, Any]:
    raw: dict[str, Any] = {}
    fields = WorkerSettings.model_fields
    for name in fields:
        value = getattr(django_settings, f"TASKQ_{name.upper()}", None)
        if value is not None:
            raw[name] = value
    block = getattr(django_settings, "TASKQ", None) or {}
    if not isinstance(block, dict):
        raise TypeError(f"settings.TASKQ must be a dict, got {type(block).__name__}")
    for key, value in block.items():
        name = str(key).lower()
        if name == "database":
            continue
        if name not in fields:
            raise ValueError(f"settings.TASKQ[{key!r}]: unknown taskq setting")
        raw[name] = value
    return raw


def database_alias() -> str:
    """The Django database taskq's tables live in: ``TASKQ["DATABASE"]``, else ``default``."""
    block = getattr(django_settings, "TASKQ", None) or {}
    alias = block.get("DATABASE") or getattr(django_settings, "TASKQ_DATABASE", None)
    return str(alias or "default")


def database_url(alias: str | None = None) -> URL:
    """A SQLAlchemy URL for Django database ``alias`` (Postgres through psycopg, or SQLite)."""
    conf = connections[alias or database_alias()].settings_dict
    engine = str(conf.get("ENGINE", ""))
    if "sqlite" in engine:
        return URL.create("sqlite", database=str(conf["NAME"]))
    if "postgresql" not in engine:
        raise ValueError(f"taskq runs on PostgreSQL or SQLite; Django database uses {engine!r}")
    port = conf.get("PORT")
    return URL.create(
        "postgresql+psycopg",
        username=conf.get("USER") or None,
        password=conf.get("PASSWORD") or None,
        host=conf.get("HOST") or None,
        port=int(port) if port else None,
        database=conf.get("NAME") or None,
    )


def taskq_settings(kind: type[TaskQSettings] = TaskQSettings) -> TaskQSettings:
    """taskq's settings for this project (``kind``: ``WorkerSettings`` for a worker)."""
    raw = _options()
    if kind is TaskQSettings:
        raw = {k: v for k, v in raw.items() if k in TaskQSettings.model_fields}
    if not raw.get("database_url"):
        raw["database_url"] = database_url().render_as_string(hide_password=False)
    return kind.load(**raw)
