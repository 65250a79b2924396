"""``taskq ui serve``: run the admin UI (``taskq.ui.create_router``) with uvicorn.

The UI is mounted at ``/admin`` (``/`` redirects there). Bound to anything but a loopback
address it refuses to start unless an ``--authorize`` hook is given or
``--allow-unauthenticated`` says that is intended (e.g. behind an authenticating proxy)::

    taskq ui serve --port 8080
    taskq ui serve --host 0.0.0.0 --authorize myapp.admin:authorize
"""

from __future__ import annotations

import importlib
import ipaddress
from typing import Any

import click

from taskq.cli.options import database_options, load_settings

__all__ = ["is_loopback", "ui"]


def is_loopback(host: str) -> bool:
    """True for ``localhost`` and loopback addresses (127.0.0.0/8, ::1)."""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _load(spec: str, option: str) -> Any:
    module_name, _, attr = spec.partition(":")
    if not module_name or not attr:
        raise click.BadParameter("expected module:attribute", param_hint=option)
    try:
        module = importlib.import_module(module_name)
        return getattr(module, attr)
    except (ImportError, AttributeError) as exc:
        raise click.BadParameter(f"cannot load {spec!r}: {exc}", param_hint=option) from None


@click.group()
def ui() -> None:
    """The admin UI (needs the ui extra: pip install "taskq-py[ui]")."""


@ui.command("serve")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to bind.")
@click.option("--port", default=8000, show_default=True, type=click.IntRange(0, 65535))
@click.option(
    "--authorize",
    "authorize_spec",
    default=None,
    help="module:function deciding each request, called as authorize(request, action).",
)
@click.option(
    "--rate-limit-registry",
    "registry_spec",
    default=None,
    help="module:attribute of the RateLimitRegistry whose buckets to list "
    "[default: taskq.ratelimit.registry].",
)
@click.option(
    "--allow-unauthenticated",
    is_flag=True,
    help="Serve a non-loopback address without an --authorize hook.",
)
@database_options
def serve(
    host: str,
    port: int,
    authorize_spec: str | None,
    registry_spec: str | None,
    allow_unauthenticated: bool,
    database_url: str | None,
    schema_name: str | None,
) -> None:
    """Serve the admin UI at http://HOST:PORT/admin with uvicorn."""
    if not is_loopback(host) and authorize_spec is None and not allow_unauthenticated:
        raise click.UsageError(
            f"refusing to serve the admin UI on non-loopback address {host!r} without "
            "authentication: pass --authorize module:function, or --allow-unauthenticated "
            "if something in front of it (a proxy) authenticates"
        )
    try:
        import uvicorn
        from starlette.applications import Starlette
        from starlette.responses import RedirectResponse
        from starlette.routing import Mount, Route

        from taskq.ui import create_router
    except ImportError as exc:
        raise click.ClickException(
            f'the admin UI needs the ui extra (pip install "taskq-py[ui]"): {exc}'
        ) from None
    from taskq.db.engine import make_engine

    settings = load_settings(database_url, schema_name)
    authorize = _load(authorize_spec, "--authorize") if authorize_spec else None
    registry = _load(registry_spec, "--rate-limit-registry") if registry_spec else None
    redis_client = None
    if settings.redis_url:
        from redis.asyncio import Redis

        redis_client = Redis.from_url(settings.redis_url)
    engine = make_engine(settings.effective_database_url, settings=settings)
    admin = create_router(
        engine=engine,
        rate_limit_registry=registry,
        settings=settings,
        authorize=authorize,
        redis_client=redis_client,
    )

    async def home(_: Any) -> RedirectResponse:
        return RedirectResponse("/admin/", status_code=307)

    app = Starlette(routes=[Route("/", home), Mount("/admin", admin)])
    click.echo(f"taskq admin UI on http://{host}:{port}/admin/", err=True)
    uvicorn.run(app, host=host, port=port, log_level="warning")
