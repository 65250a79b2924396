# sync twin: src/taskq_sync/ratelimit/settings_redis.py
"""The Redis client a rate limit uses when none is passed: one made from ``TASKQ_REDIS_URL``.

Web code takes tokens in views, where threading a client through every call is a chore:
with ``redis_client=None`` a Redis-backed primitive uses the client of ``settings``
(``settings.redis_url``, else ``TASKQ_REDIS_URL`` from the environment). One client is
made per URL and process (and, under asyncio, per event loop: a redis-py asyncio client
belongs to the loop it first ran on), so a forked child never talks on its parent's
sockets.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from taskq._acompat import ASYNC
from taskq.settings import TaskQSettings

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = ["settings_redis"]

_CLIENTS: dict[tuple[int, str, int], Any] = {}
_LOCK = threading.Lock()
_ENV_URL: dict[int, str | None] = {}
"""``TASKQ_REDIS_URL`` as read once per process (settings are not re-parsed per acquire)."""


def settings_redis(settings: TaskQSettings | None) -> Redis | None:
    """The shared client for ``settings.redis_url`` (or ``TASKQ_REDIS_URL``); ``None`` when
    no URL is configured or redis-py is not installed."""
    pid = os.getpid()
    if settings is not None:
        url = settings.redis_url
    else:
        if pid not in _ENV_URL:
            _ENV_URL[pid] = TaskQSettings.load().redis_url
        url = _ENV_URL[pid]
    if not url:
        return None
    loop = 0
    if ASYNC:
        import asyncio

        loop = id(asyncio.get_running_loop())
    key = (pid, url, loop)
    client = _CLIENTS.get(key)
    if client is None:
        try:
            from redis.asyncio import Redis as Client
        except ImportError:  # pragma: no cover - the redis extra is not installed
            return None
        with _LOCK:
            client = _CLIENTS.get(key)
            if client is None:
                client = _CLIENTS[key] = Client.from_url(url)
    return client
