"""``taskq ratelimit list | peek | reset``: rate-limit state, read without consuming.

The limits are those the ``--actors`` module declares or registers, plus the ones
stored in ``rate_limit_buckets`` (Postgres-backed and keyed buckets). Redis-backed
state needs ``--redis-url`` (or ``TASKQ_REDIS_URL``).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.cli.ops_support import Refused, confirm, run_ops, table
from taskq.cli.options import database_options, echo_json, json_option, load_settings
from taskq.ops.ratelimits import RateLimitInfo, RateLimitsClient
from taskq.settings import TaskQSettings

__all__ = ["ratelimit"]

T = TypeVar("T")


def _options(fn: Callable[..., Any]) -> Callable[..., Any]:
    fn = click.option(
        "--redis-url", default=None, help="Redis holding the limits' state [env: TASKQ_REDIS_URL]."
    )(fn)
    fn = click.option(
        "--actors",
        "target",
        default=None,
        metavar="MODULE[:ATTR]",
        help="Import these actors (and what their module registers) to know their limits.",
    )(fn)
    return database_options(fn)


def _run(
    settings: TaskQSettings,
    redis_url: str | None,
    target: str | None,
    action: Callable[[RateLimitsClient], Awaitable[T]],
) -> T:
    from taskq.ratelimit import RateLimitRegistry
    from taskq.ratelimit import registry as default_registry

    actors = []
    if target is not None:
        from taskq.cli.actor_config import declared_actors

        actors = declared_actors(target)  # importing it registers what the module registers
    url = redis_url or settings.redis_url

    async def go(engine: AsyncEngine) -> T:
        redis_client = None
        if url:
            from redis.asyncio import Redis

            redis_client = Redis.from_url(url)
        registry = RateLimitRegistry()
        for primitive in default_registry.rate_limits().values():
            registry.register(primitive)
        client = RateLimitsClient(
            engine, registry=registry, redis_client=redis_client, settings=settings
        )
        client.register_actors(actors)
        try:
            return await action(client)
        finally:
            if redis_client is not None:
                await redis_client.aclose()

    return run_ops(settings, go)


def _row(info: RateLimitInfo) -> tuple[str, ...]:
    state = info.state
    if state is None:
        remaining = "?"
        detail = info.error or ""
    else:
        if state.capacity is not None:
            remaining = f"{state.tokens_remaining:g}/{state.capacity:g}"
        else:
            remaining = f"{state.remaining:g}/{state.limit}"
        detail = "exhausted" if state.is_exhausted else "ok"
        if state.retry_after is not None and state.is_exhausted:
            detail += f", retry in {state.retry_after.total_seconds():.1f}s"
    return (info.name, info.kind, info.backend, info.source, remaining, detail)


_HEADER = ("NAME", "KIND", "BACKEND", "SOURCE", "REMAINING", "STATE")


@click.group("ratelimit")
def ratelimit() -> None:
    """Read and reset rate-limit state."""


@ratelimit.command("list")
@_options
@json_option
def list_cmd(
    target: str | None,
    redis_url: str | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """List every known rate limit with its current state (nothing is consumed)."""
    settings = load_settings(database_url, schema_name)
    infos = _run(settings, redis_url, target, lambda c: c.list())
    if as_json:
        echo_json([i.to_json() for i in infos])
        return
    if not infos:
        click.echo("no rate limits (pass --actors to load the ones your actors declare)")
        return
    click.echo(table(_HEADER, [_row(i) for i in infos]))


def _one(
    settings: TaskQSettings,
    redis_url: str | None,
    target: str | None,
    action: Callable[[RateLimitsClient], Awaitable[RateLimitInfo]],
) -> RateLimitInfo:
    try:
        return _run(settings, redis_url, target, action)
    except KeyError as exc:
        raise Refused(str(exc.args[0])) from None


@ratelimit.command("peek")
@click.argument("name")
@_options
@json_option
def peek_cmd(
    name: str,
    target: str | None,
    redis_url: str | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Show NAME's current state without consuming anything."""
    settings = load_settings(database_url, schema_name)
    info = _one(settings, redis_url, target, lambda c: c.peek(name))
    if as_json:
        echo_json(info.to_json())
    else:
        click.echo(table(_HEADER, [_row(info)]))


@ratelimit.command("reset")
@click.argument("name")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@_options
@json_option
def reset_cmd(
    name: str,
    yes: bool,
    target: str | None,
    redis_url: str | None,
    database_url: str | None,
    schema_name: str | None,
    as_json: bool,
) -> None:
    """Refill NAME to full at once (logged at WARNING: it admits a burst)."""
    settings = load_settings(database_url, schema_name)
    confirm(f"reset rate limit {name!r} to full?", yes=yes)
    info = _one(settings, redis_url, target, lambda c: c.reset(name))
    if as_json:
        echo_json(info.to_json())
    else:
        click.echo(f"rate limit {name!r} reset")
        click.echo(table(_HEADER, [_row(info)]))
