"""``create_router``: the admin UI as one ASGI app, to mount in Starlette or FastAPI.

The app reads and acts only through the operations layer (``tq.jobs``, ``tq.queues``,
``tq.actors``, :class:`~taskq.ops.WorkersClient`, :class:`~taskq.ops.RateLimitsClient`,
:class:`~taskq.ops.stats.StatsClient`). Its pages are server-rendered Jinja2 templates;
one small script (``static/admin.js``, no third-party code) adds live progress over
Server-Sent Events and the select-all box.

Who may do what is decided per request: ``TASKQ_ADMIN_ACTIONS_ENABLED`` switches every
action on or off (off: hidden in the page and refused 403), and the optional
``authorize(request, action)`` hook decides each one (and ``"view"``, every page) for
the request at hand.
"""

from __future__ import annotations

import inspect
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlencode

from jinja2 import Environment, FileSystemLoader, select_autoescape
from sqlalchemy.ext.asyncio import AsyncEngine
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from taskq.client import TaskQ
from taskq.db.engine import with_schema
from taskq.exceptions import (
    ActorDeregistrationError,
    ActorNotFoundError,
    JobNotFoundError,
    JobNotRetryableError,
    SchemaNotReady,
    SingletonCollisionError,
    StoreUnavailable,
)
from taskq.ops import RateLimitsClient, WorkersClient
from taskq.ops.stats import StatsClient
from taskq.ratelimit.registry import RateLimitRegistry
from taskq.settings import TaskQSettings
from taskq.ui.cron import CronSource, StoredSchedules
from taskq.ui.inputs import BadInput
from taskq.ui.security import CSRF_COOKIE, CSRF_FIELD, CsrfError, SecurityHeaders, csrf_token

if TYPE_CHECKING:
    from redis.asyncio import Redis

__all__ = [
    "ACTIONS",
    "Admin",
    "Authorize",
    "Forbidden",
    "Redact",
    "create_router",
    "default_redact",
]

Authorize = Callable[[Request, str], bool | Awaitable[bool]]
"""``authorize(request, action) -> bool`` (or an awaitable of it): may this request see
the UI (``action == "view"``) or take ``action``?"""
Redact = Callable[[str, str, Any], Any]
"""``redact(actor, field, value) -> value``: what the UI shows of a job's ``payload``,
``result`` or ``progress`` (``field``)."""

ACTIONS = (
    "jobs.cancel",
    "jobs.retry",
    "queues.pause",
    "queues.resume",
    "queues.cap",
    "actors.deregister",
    "ratelimits.reset",
    "cron.enable",
    "cron.disable",
    "cron.run",
)
"""Every action the UI can take; ``authorize`` is asked about these and ``"view"``."""

_HERE = Path(__file__).parent
_log = logging.getLogger("taskq.ui")
_SECRET_WORDS = ("password", "passwd", "secret", "token", "api_key", "apikey", "authorization")


class Forbidden(Exception):
    """The request may not do this (answered 403 with the reason)."""


class Conflict(Exception):
    """The action cannot apply to the current state (answered 409 with the reason)."""


def default_redact(actor: str, field: str, value: Any) -> Any:
    """Mask the values of keys that look secret (password, token, api_key, ...), at any depth."""
    if isinstance(value, Mapping):
        return {
            k: "[redacted]"
            if isinstance(k, str) and any(w in k.lower() for w in _SECRET_WORDS)
            else default_redact(actor, field, v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [default_redact(actor, field, v) for v in value]
    return value


@dataclass
class Admin:
    """What every view shares: the clients, the settings and the hooks."""

    engine: AsyncEngine
    settings: TaskQSettings
    tq: TaskQ
    rate_limits: RateLimitsClient
    workers: WorkersClient
    stats: StatsClient
    authorize: Authorize | None
    redact: Redact
    cron: CronSource | None
    redis_client: Redis | None
    progress_poll_s: float
    cache_ttl_s: float
    env: Environment = field(repr=False)
    _cache: dict[Any, tuple[float, Any]] = field(default_factory=dict, repr=False)
    _store_errors: set[str] = field(default_factory=set, repr=False)

    def store_error(self, kind: str, message: str) -> None:
        """Log a store problem of ``kind`` (``SchemaNotReady``, ``StoreUnavailable``) at
        ERROR the first time this app meets it, at DEBUG after: one line per problem, not
        one per request (every page of an unmigrated database fails the same way)."""
        if kind in self._store_errors:
            _log.debug("admin-ui store-error %s", message)
            return
        self._store_errors.add(kind)
        _log.error("admin-ui store-error %s (answering 503 until it is fixed)", message)

    async def cached(self, key: Any, compute: Callable[[], Awaitable[Any]]) -> Any:
        """``compute()``'s value, reused for ``cache_ttl_s`` seconds (per process): the
        overview's, queues' and actors' counts and statistics, so a page left open or
        reloaded costs the store nothing new for a few seconds."""
        now = time.monotonic()
        hit = self._cache.get(key)
        if hit is not None and hit[0] > now:
            return hit[1]
        value = await compute()
        if self.cache_ttl_s > 0:
            if len(self._cache) > 1000:
                self._cache.clear()
            self._cache[key] = (now + self.cache_ttl_s, value)
        return value

    def gate(self, action: str) -> str | None:
        """Why ``action`` is off by configuration, or ``None`` when it is on."""
        if not self.settings.admin_actions_enabled:
            return "actions are disabled: set TASKQ_ADMIN_ACTIONS_ENABLED=true to enable them"
        if action == "ratelimits.reset" and not self.settings.admin_ui_allow_rate_limit_reset:
            return "rate-limit resets are disabled: set TASKQ_ADMIN_UI_ALLOW_RATE_LIMIT_RESET=true"
        if action.startswith("cron.") and self.cron is None:
            return "no cron schedule source is configured"
        return None

    async def allowed(self, request: Request, action: str) -> bool:
        """True when ``action`` is on and ``authorize`` (if any) lets this request take it."""
        if action != "view" and self.gate(action) is not None:
            return False
        return await self._hook(request, action)

    async def _hook(self, request: Request, action: str) -> bool:
        if self.authorize is None:
            return True
        verdict = self.authorize(request, action)
        if inspect.isawaitable(verdict):
            verdict = await verdict
        return bool(verdict)

    async def require(self, request: Request, action: str) -> None:
        """Raise :class:`Forbidden` unless the request may take ``action``."""
        reason = self.gate(action) if action != "view" else None
        if reason is not None:
            raise Forbidden(reason)
        if not await self._hook(request, action):
            raise Forbidden(f"not authorized: {action}")

    async def render(
        self, request: Request, template: str, status_code: int = 200, **context: Any
    ) -> HTMLResponse:
        """Render ``template`` with the page's shared context; sets the CSRF cookie."""
        token = csrf_token(request)
        can = {a: await self.allowed(request, a) for a in ACTIONS}
        html = self.env.get_template(template).render(
            request=request,
            base=request.scope.get("root_path", "").rstrip("/"),
            nonce=request.state.csp_nonce,
            csrf_field=CSRF_FIELD,
            csrf_token=token,
            can=can,
            any_action=any(can.values()),
            actions_enabled=self.settings.admin_actions_enabled,
            message=request.query_params.get("msg"),
            **context,
        )
        response = HTMLResponse(html, status_code=status_code)
        if request.cookies.get(CSRF_COOKIE) != token:
            response.set_cookie(
                CSRF_COOKIE,
                token,
                path=(request.scope.get("root_path", "") or "/"),
                httponly=True,
                samesite="strict",
                secure=request.url.scheme == "https",
            )
        return response


def admin_of(request: Request) -> Admin:
    """The :class:`Admin` of the app serving ``request``."""
    admin: Admin = request.app.state.admin
    return admin


def redirect(request: Request, path: str, message: str | None = None) -> RedirectResponse:
    """A 303 to ``path`` inside the UI, carrying ``message`` for the next page to show."""
    base = request.scope.get("root_path", "").rstrip("/")
    if message:
        path += ("&" if "?" in path else "?") + urlencode({"msg": message})
    return RedirectResponse(base + path, status_code=303)


def _json(value: Any) -> str:
    return json.dumps(value, indent=2, sort_keys=True, default=str)


def _store_message(exc: SchemaNotReady | StoreUnavailable) -> str:
    if isinstance(exc, SchemaNotReady):
        return (
            f"the taskq schema is not ready (SchemaNotReady: table {exc.table!r} does not "
            f"exist): run `{exc.command}`"
        )
    return f"the job store cannot be reached (StoreUnavailable: {exc.reason})"


async def _error(request: Request, exc: Exception) -> Response:
    status = 500
    message: str | None = None
    if isinstance(exc, SchemaNotReady | StoreUnavailable):
        status = 503
        message = _store_message(exc)
        admin_of(request).store_error(type(exc).__name__, message)
    elif isinstance(exc, BadInput):
        status = 400
    elif isinstance(exc, Forbidden | CsrfError):
        status = 403
    elif isinstance(exc, JobNotFoundError | LookupError | ActorNotFoundError):
        status = 404
    elif isinstance(
        exc, Conflict | JobNotRetryableError | SingletonCollisionError | ActorDeregistrationError
    ):
        status = 409
    elif isinstance(exc, HTTPException):
        status = exc.status_code
    if message is None:
        message = exc.detail if isinstance(exc, HTTPException) else str(exc)
    if isinstance(exc, KeyError) and exc.args:
        message = str(exc.args[0])
    if request.headers.get("accept", "").startswith("application/json"):
        return Response(json.dumps({"error": message}), status, media_type="application/json")
    admin = admin_of(request)
    return await admin.render(
        request, "error.html", status_code=status, status=status, error=message
    )


def create_router(
    *,
    engine: AsyncEngine,
    rate_limit_registry: RateLimitRegistry | None = None,
    settings: TaskQSettings | None = None,
    authorize: Authorize | None = None,
    redis_client: Redis | None = None,
    redact: Redact | None = None,
    cron: CronSource | None = None,
    progress_poll_interval: float = 0.5,
    cache_ttl: float = 5.0,
) -> Starlette:
    """The admin UI as an ASGI app: ``app.mount("/admin", create_router(engine=...))``.

    ``rate_limit_registry`` is the registry whose buckets the rate-limits page lists
    (default: ``taskq.ratelimit.registry``); ``redis_client`` reads live Redis state and
    feeds the progress stream (without it the stream polls the job's row every
    ``progress_poll_interval`` seconds). ``authorize(request, action)`` decides each
    request; ``redact(actor, field, value)`` what a job page shows of payloads and
    results (default :func:`default_redact`); ``cron`` the schedules of the cron page.
    The overview's, queues page's and actors page's counts and statistics are reused for
    ``cache_ttl`` seconds (0: read every time); job lists and details are always fresh.
    """
    from taskq.ui import actions, pages, progress

    if not isinstance(engine, AsyncEngine):
        raise TypeError(f"engine must be an AsyncEngine, got {type(engine).__name__}")
    if progress_poll_interval <= 0:
        raise ValueError("progress_poll_interval must be > 0")
    if cache_ttl < 0:
        raise ValueError("cache_ttl must be >= 0")
    settings = settings or TaskQSettings.load()
    # An engine the user made gets taskq's schema map too (as TaskQ(engine=...) does).
    engine = with_schema(engine, settings=settings)
    env = Environment(
        loader=FileSystemLoader(str(_HERE / "templates")),
        autoescape=select_autoescape(default=True),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.filters["tojson_pretty"] = _json
    admin = Admin(
        engine=engine,
        settings=settings,
        tq=TaskQ(engine=engine, settings=settings),
        rate_limits=RateLimitsClient(
            engine, registry=rate_limit_registry, redis_client=redis_client, settings=settings
        ),
        workers=WorkersClient(engine),
        stats=StatsClient(engine),
        authorize=authorize,
        redact=redact or default_redact,
        cron=cron if cron is not None else StoredSchedules(engine, settings),
        redis_client=redis_client,
        progress_poll_s=progress_poll_interval,
        cache_ttl_s=cache_ttl,
        env=env,
    )
    routes = [
        *pages.routes(),
        *actions.routes(),
        Route("/jobs/{job_id}/progress", progress.stream, methods=["GET"]),
        Mount("/static", StaticFiles(directory=str(_HERE / "static")), name="static"),
    ]
    handlers: dict[Any, Any] = {
        cls: _error
        for cls in (
            BadInput,
            Forbidden,
            Conflict,
            CsrfError,
            JobNotFoundError,
            LookupError,
            JobNotRetryableError,
            SingletonCollisionError,
            ActorDeregistrationError,
            SchemaNotReady,
            StoreUnavailable,
            HTTPException,
        )
    }
    app = Starlette(routes=routes, exception_handlers=handlers)
    app.state.admin = admin
    app.add_middleware(SecurityHeaders)
    return app
