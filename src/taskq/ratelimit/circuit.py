"""The Redis circuit breaker of rate-limit calls: a down Redis costs one timeout, not one per call.

Without it, every acquire against a frozen Redis waited out its timeouts before falling
back to Postgres, so rate-limited work nearly stopped (0.4 jobs/s instead of 20 in the
outside fault run). Per Redis client, one :class:`RedisCircuit`:

* **closed** (Redis answers): calls go to Redis, bounded by
  ``TASKQ_RATE_LIMIT_REDIS_TIMEOUT`` (async clients; a sync client is bounded by its own
  ``socket_timeout``);
* **open** (the last call failed): for ``TASKQ_RATE_LIMIT_REDIS_COOLDOWN`` every call that
  can fall back goes straight to the Postgres fallback, without touching Redis;
* after the cool-down **one** call probes Redis while the others keep falling back; its
  success closes the circuit at once, its failure opens it for another cool-down.

Calls with no fallback (``TASKQ_RATE_LIMIT_PG_FALLBACK_ENABLED=false``, no ``pg_pool``)
always try Redis and raise its error, as before. The state changes are logged once each
on the ``taskq.ratelimit`` logger (WARNING ``ratelimit.redis_down`` with ``backend="redis"``
and ``fallback="postgres"``, ``ratelimit.redis_back``) and, while down, at most one
``ratelimit.redis_summary`` per ``TASKQ_OUTAGE_LOG_INTERVAL`` with the counts of failures
and fallbacks (:class:`taskq.outage_log.OutageLog`).

Pure state (no I/O): the async and the generated sync code share it.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from taskq.outage_log import OutageLog
from taskq.ratelimit._redis_utils import REDIS_DOWN
from taskq.settings import TaskQSettings

__all__ = ["RedisCircuit", "bounded", "circuit_for", "register_circuit", "reset_circuits"]

T = TypeVar("T")

_log = logging.getLogger("taskq.ratelimit")


def _emit(event: str, **fields: Any) -> None:
    text = " ".join(f"{key}={value}" for key, value in fields.items())
    _log.warning("%s %s", event, text, extra={"event": event, **fields})


class RedisCircuit:
    """The breaker of one Redis client (see the module doc)."""

    def __init__(
        self,
        *,
        timeout_s: float,
        cooldown_s: float,
        log_interval_s: float,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.timeout_s = timeout_s
        self.cooldown_s = cooldown_s
        self._clock = clock
        self._open_until: float | None = None
        self._probe_since: float | None = None
        self.log = OutageLog(
            "ratelimit.redis", _emit, interval_s=log_interval_s, sep="_", clock=clock
        )

    @property
    def is_open(self) -> bool:
        """Whether the last Redis call failed (no success since)."""
        return self._open_until is not None

    def skip_redis(self) -> bool:
        """For a call that can fall back: ``True`` to go straight to the fallback; ``False``
        to call Redis (the circuit is closed, or this call is the cool-down's one probe)."""
        if self._open_until is None:
            return False
        now = self._clock()
        probe_stuck = (
            self._probe_since is not None
            and now - self._probe_since > self.timeout_s + self.cooldown_s
        )  # a probe cancelled before it could report: let another one go
        if now >= self._open_until and (self._probe_since is None or probe_stuck):
            self._probe_since = now
            return False
        self.log.counted("fallbacks")
        return True

    def failed(self, name: str, error: BaseException, *, falls_back: bool) -> None:
        """A Redis call for primitive ``name`` failed: open for one cool-down."""
        self._open_until = self._clock() + self.cooldown_s
        self._probe_since = None
        fields = {"bucket": name, "backend": "redis"}
        if falls_back:
            fields["fallback"] = "postgres"
        self.log.failed(error, **fields)
        if falls_back:
            self.log.counted("fallbacks")

    def succeeded(self) -> None:
        """A Redis call succeeded: close (and log the recovery) if open."""
        if self._open_until is None:
            return
        self._open_until = None
        self._probe_since = None
        self.log.succeeded()


_circuits: weakref.WeakKeyDictionary[Any, RedisCircuit] = weakref.WeakKeyDictionary()


def circuit_for(client: Any, settings: TaskQSettings | None) -> RedisCircuit:
    """The circuit of ``client`` (made on first use from ``settings``, or the environment)."""
    circuit = _circuits.get(client)
    if circuit is None:
        s = settings or TaskQSettings.load()
        circuit = RedisCircuit(
            timeout_s=s.rate_limit_redis_timeout.total_seconds(),
            cooldown_s=s.rate_limit_redis_cooldown.total_seconds(),
            log_interval_s=s.outage_log_interval.total_seconds(),
        )
        _circuits[client] = circuit
    return circuit


def register_circuit(client: Any, circuit: RedisCircuit) -> None:
    """Use ``circuit`` for ``client`` (other timeouts, a test's clock)."""
    _circuits[client] = circuit


def reset_circuits() -> None:
    """Forget every client's circuit (tests; a process that swaps its Redis)."""
    _circuits.clear()


async def bounded(timeout_s: float, call: Awaitable[T]) -> T:
    """Await a Redis ``call`` for at most ``timeout_s`` seconds; past it, redis-py's
    ``TimeoutError`` (what the fallback and the circuit treat as Redis being down). A
    call cut short this way disconnects its connection (see ``_redis_utils.evalsha``)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await call
    except TimeoutError as exc:
        if isinstance(exc, REDIS_DOWN):
            raise
        raise REDIS_DOWN[-1](f"no reply from Redis within {timeout_s}s") from None
