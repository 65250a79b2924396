"""``retry_boot_step``: which failures a booting worker waits out, and for how long."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import structlog
from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError, ProgrammingError

from taskq.worker.boot import is_connection_failure, retry_boot_step

_log = structlog.get_logger("test")


def _operational() -> OperationalError:
    return OperationalError("SELECT 1", {}, Exception("connection refused"))


class _Step:
    """Fails with each of ``errors`` in turn, then succeeds."""

    def __init__(self, *errors: BaseException) -> None:
        self.errors = list(errors)
        self.calls = 0
        self.retried = asyncio.Event()

    async def __call__(self) -> None:
        self.calls += 1
        if self.calls == 2:
            self.retried.set()
        if self.errors:
            raise self.errors.pop(0)


@pytest.mark.parametrize(
    ("exc", "expected"),
    [
        (_operational(), True),
        (ConnectionRefusedError(), True),
        (DBAPIError("x", {}, Exception("gone"), connection_invalidated=True), True),
        (ProgrammingError("x", {}, Exception('relation "taskq.jobs" does not exist')), False),
        (IntegrityError("x", {}, Exception("duplicate key")), False),
        (ValueError("conflicting registration"), False),
    ],
)
def test_is_connection_failure(exc: BaseException, expected: bool) -> None:
    assert is_connection_failure(exc) is expected


async def test_connection_failures_are_retried_until_the_step_succeeds() -> None:
    step = _Step(_operational(), _operational(), OSError("reset"))
    with structlog.testing.capture_logs() as logs:
        done = await retry_boot_step("register", step, timeout_s=60, stop=asyncio.Event(), log=_log)
    assert done is True
    assert step.calls == 4
    retries = [e for e in logs if e["event"] == "worker-boot-retry"]
    assert [e["attempt"] for e in retries] == [1, 2, 3]
    assert [e["retry_in"] for e in retries] == [0.1, 0.2, 0.4]
    assert all(e["log_level"] == "warning" and e["step"] == "register" for e in retries)


async def test_any_other_error_fails_at_once() -> None:
    error = ProgrammingError("x", {}, Exception("undefined table"))
    step = _Step(error)
    with structlog.testing.capture_logs() as logs, pytest.raises(ProgrammingError) as raised:
        await retry_boot_step("register", step, timeout_s=60, stop=asyncio.Event(), log=_log)
    assert raised.value is error
    assert step.calls == 1
    assert [e["event"] for e in logs] == ["worker-boot-failed"]


async def test_the_timeout_bounds_the_retries() -> None:
    step = _Step(*(_operational() for _ in range(100)))
    with structlog.testing.capture_logs() as logs, pytest.raises(OperationalError):
        await retry_boot_step("register", step, timeout_s=0.25, stop=asyncio.Event(), log=_log)
    # 0.1 + 0.2 would pass 0.25 s: one retry, then the failure.
    assert step.calls == 2
    assert [e["event"] for e in logs] == ["worker-boot-retry", "worker-boot-failed"]


async def test_a_zero_timeout_fails_at_the_first_connection_failure() -> None:
    step = _Step(_operational())
    with pytest.raises(OperationalError):
        await retry_boot_step("register", step, timeout_s=0, stop=asyncio.Event(), log=_log)
    assert step.calls == 1


async def test_a_stop_between_retries_ends_the_boot() -> None:
    stop = asyncio.Event()
    step = _Step(*(_operational() for _ in range(100)))
    task = asyncio.ensure_future(
        retry_boot_step("register", step, timeout_s=600, stop=stop, log=_log)
    )
    await step.retried.wait()
    stop.set()
    assert await task is False
    assert step.calls == 2


async def test_a_stop_during_a_step_cancels_it() -> None:
    stop = asyncio.Event()
    entered = asyncio.Event()
    cancelled: list[Any] = []

    async def hanging() -> None:
        entered.set()
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.append(True)
            raise

    task = asyncio.ensure_future(
        retry_boot_step("rate-limits", hanging, timeout_s=60, stop=stop, log=_log)
    )
    await entered.wait()
    stop.set()
    assert await task is False
    assert cancelled == [True]
