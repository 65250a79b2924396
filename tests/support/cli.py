"""Shared by the CLI tests: a way to run async store code from a synchronous test (the CLI
runs its own event loop). Their ``url`` fixture is in ``tests/integration/conftest.py``."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings

T = TypeVar("T")


def db(url: str, settings: TaskQSettings, fn: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """Run ``fn`` on a fresh engine (the CLI runs its own loop, so the tests are sync)."""

    async def go() -> T:
        engine = make_engine(url, settings=settings)
        try:
            return await fn(engine)
        finally:
            await engine.dispose()

    return asyncio.run(go())
