"""Boot steps that wait out a database that is not answering yet.

A worker started next to its database (``docker compose up``, a rolling restart of
Postgres, a failover) can meet a refused or dropped connection before it has registered.
Each boot step is retried on a *connection* failure, with exponential backoff, until
``boot_retry_timeout`` has passed since the first failure; then the boot fails loudly
(the error propagates and the process exits 1, for its supervisor to restart). Any other
error (a missing schema, a bad configuration, a conflicting rate-limit registration, a
rate limit or reservation an actor names but no registry holds) fails the boot at once:
waiting would not fix it.

A step is whole or absent: the worker-row step is one transaction, and the rate-limit
step's registrations and slot sync are idempotent, so a retried step never half-applies.
A shutdown signal during a boot step or between retries ends the boot: the step is
cancelled and :func:`retry_boot_step` returns ``False``.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable

import structlog
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError
from sqlalchemy.exc import TimeoutError as PoolTimeout

__all__ = ["is_connection_failure", "retry_boot_step"]

_FIRST_DELAY_S = 0.1
_MAX_DELAY_S = 5.0


def is_connection_failure(exc: BaseException) -> bool:
    """Whether ``exc`` says the database could not be reached or the connection died.

    ``OperationalError`` is the DB-API's class for a refused connect, a server that went
    away and ``AdminShutdown``; SQLAlchemy marks any other error that invalidated its
    connection with ``connection_invalidated``.
    """
    if isinstance(exc, OperationalError | InterfaceError | PoolTimeout | OSError):
        return True
    return isinstance(exc, DBAPIError) and exc.connection_invalidated


async def retry_boot_step(
    name: str,
    step: Callable[[], Awaitable[None]],
    *,
    timeout_s: float,
    stop: asyncio.Event,
    log: structlog.typing.FilteringBoundLogger,
) -> bool:
    """Run ``step`` until it succeeds (``True``) or ``stop`` is set (``False``).

    A connection failure is logged (``worker-boot-retry``, WARNING) and retried after a
    doubling delay (0.1 s up to 5 s) while less than ``timeout_s`` has passed since the
    step first failed; after that, or on any other error, the error propagates.
    """
    delay = _FIRST_DELAY_S
    first_failure: float | None = None
    attempt = 0
    while True:
        attempt += 1
        task = asyncio.ensure_future(step())
        stopping = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait([task, stopping], return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopping.cancel()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task
            return False
        exc = task.exception()
        if exc is None:
            return True
        now = time.monotonic()
        first_failure = now if first_failure is None else first_failure
        waited = now - first_failure
        if not is_connection_failure(exc) or waited + delay > timeout_s:
            log.error("worker-boot-failed", step=name, attempt=attempt, error=str(exc))
            raise exc
        log.warning("worker-boot-retry", step=name, attempt=attempt, retry_in=delay, error=str(exc))
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(delay):
                await stop.wait()
        if stop.is_set():
            return False
        delay = min(delay * 2, _MAX_DELAY_S)
