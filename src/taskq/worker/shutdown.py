"""Graceful shutdown: stop claiming, then CANCELLING, FORCING, RELEASING; a watchdog behind.

On SIGTERM/SIGINT the worker stops claiming and enqueuing cron ticks (the cron loop
returns at its next :func:`pause`: ticks falling due during a long drain are left to
the next worker's catch-up budget, not piled up for nobody to run), and walks the phases:

- CANCELLING (up to ``cancellation_grace_period``): every attempt's cancel event is set,
  so ``ctx.should_abort()`` is True. Attempts that finish now are written normally.
- FORCING (up to ``cleanup_grace_period``): every attempt's asyncio task is cancelled. An
  async actor unwinds; a sync actor's await unwinds while its thread keeps running.
- RELEASING: rows of interrupted attempts go back ``pending`` at once; a row whose sync
  thread is still running here is held ``scheduled`` for the rest of the termination
  grace plus the watchdog tail (capped by ``lock_lease``), then brought forward the
  moment the thread exits.

Then the teardown stops the background loops (heartbeat, completer, cancel poll, sweep,
progress flush) between two rounds, never inside one: once the stop event is set each
returns at its next :func:`pause` (the completer after its write in flight), so a
round's transaction always ends on its own. Cancelling the task instead is not safe on
SQLite: a task cancelled while aiosqlite runs a row-returning statement (the leader
renewal's ``INSERT ... RETURNING``, the sweep's ``SELECT``) inside ``BEGIN IMMEDIATE``
gets its connection closed with that statement unfinished, and ``sqlite3`` keeps the
closed connection, its transaction and the write lock alive until the garbage collector
frees the cursor; the leader release and the ``stopped`` write that follow then wait
for the write lock for the whole busy timeout (30 s). A loop still busy when the
termination grace runs out is cancelled all the same, so the shutdown stays bounded.

A second signal skips to the next phase. The watchdog thread calls ``os._exit`` when
the process outlives ``termination_grace_period`` plus the tail (reason
``tracked-actor-outlived-teardown`` when an actor thread is what kept it alive).
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Final

import structlog

__all__ = ["WATCHDOG_TAIL_S", "Phase", "ShutdownState", "Watchdog", "pause"]

WATCHDOG_TAIL_S: Final = 5.0
"""Seconds the watchdog waits beyond ``termination_grace_period`` before ``os._exit``."""
WATCHDOG_EXIT_CODE: Final = 70

_log = structlog.get_logger("taskq.worker.shutdown")


class Phase(enum.IntEnum):
    """Where the worker is in its life; shutdown phases only move forward."""

    RUNNING = 0
    DRAINING = 1
    CANCELLING = 2
    FORCING = 3
    RELEASING = 4
    STOPPED = 5


class ShutdownState:
    """Signals in, phase transitions out: ``requested`` is set by the first signal and
    ``escalate`` by each later one, so a phase wait can be cut short."""

    def __init__(self) -> None:
        self.phase = Phase.RUNNING
        self.requested = asyncio.Event()
        self.escalate = asyncio.Event()
        self.signals = 0
        self.started_mono: float | None = None
        self.reason = ""

    def signal(self, signame: str) -> None:
        """Record a signal: the first starts the shutdown, each later one escalates it."""
        self.signals += 1
        if self.signals == 1:
            self.started_mono = time.monotonic()
            self.reason = signame
            _log.info("worker-shutdown-requested", signal=signame)
            self.requested.set()
        else:
            _log.warning("worker-shutdown-escalated", signal=signame, phase=self.phase.name)
            self.escalate.set()

    def enter(self, phase: Phase) -> None:
        """Move to ``phase`` (logged once) and re-arm the escalation event."""
        if phase > self.phase:
            self.phase = phase
            self.escalate.clear()
            _log.info("worker-shutdown-phase", phase=phase.name)

    async def wait_phase(
        self, done: Callable[[], bool], limit_s: float, changed: asyncio.Event
    ) -> None:
        """Wait until ``done()`` (re-checked whenever ``changed`` fires), ``limit_s``, or a signal."""
        deadline = time.monotonic() + limit_s
        while not done() and not self.escalate.is_set():
            left = deadline - time.monotonic()
            if left <= 0:
                return
            changed.clear()
            waiters = [
                asyncio.ensure_future(changed.wait()),
                asyncio.ensure_future(self.escalate.wait()),
            ]
            try:
                await asyncio.wait(waiters, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for w in waiters:
                    w.cancel()


async def pause(stop: asyncio.Event, seconds: float) -> bool:
    """Wait ``seconds`` between two rounds of a background loop, or until ``stop`` is set.

    Returns ``False`` once ``stop`` is set: the loop then returns instead of starting
    another round (see the module docstring).
    """
    if not stop.is_set():
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await stop.wait()
    return not stop.is_set()


class Watchdog:
    """A daemon thread that ends the process with ``os._exit`` at a deadline.

    A thread, not a task: it must fire even if the event loop is wedged. ``reason()`` is
    asked at the deadline so the log says what kept the process alive.
    """

    def __init__(self, deadline_s: float, reason: Callable[[], str]) -> None:
        self._deadline = time.monotonic() + deadline_s
        self._reason = reason
        self._disarmed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="taskq-watchdog", daemon=True)

    def start(self) -> None:
        """Arm the watchdog."""
        self._thread.start()

    def disarm(self) -> None:
        """The process is exiting on its own: stand down."""
        self._disarmed.set()

    def _run(self) -> None:
        if self._disarmed.wait(max(0.0, self._deadline - time.monotonic())):
            return
        reason = self._reason()
        _log.error("worker-watchdog-exit", reason=reason)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(WATCHDOG_EXIT_CODE)
