"""The admin UI: a mountable, server-rendered dashboard over the operations layer.

``create_router(engine=..., rate_limit_registry=..., settings=..., authorize=...)``
returns an ASGI app; mount it (``app.mount("/admin", ...)``) or run it with
``taskq ui serve``. Needs the ``ui`` extra (Starlette, Jinja2, uvicorn).
"""

from __future__ import annotations

from taskq.ui.app import ACTIONS, Authorize, Redact, create_router, default_redact
from taskq.ui.cron import CronScheduleView, CronSource, StoredSchedules

__all__ = [
    "ACTIONS",
    "Authorize",
    "CronScheduleView",
    "CronSource",
    "Redact",
    "StoredSchedules",
    "create_router",
    "default_redact",
]
