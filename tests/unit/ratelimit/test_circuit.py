"""The Redis circuit breaker and the outage log, on an injected monotonic clock."""

from __future__ import annotations

from typing import Any

from taskq.outage_log import OutageLog
from taskq.ratelimit.circuit import RedisCircuit


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _circuit(clock: Clock, lines: list[tuple[str, dict[str, Any]]]) -> RedisCircuit:
    circuit = RedisCircuit(timeout_s=0.5, cooldown_s=1.0, log_interval_s=10.0, clock=clock)
    circuit.log = OutageLog(
        "ratelimit.redis",
        lambda event, **fields: lines.append((event, fields)),
        interval_s=10.0,
        sep="_",
        clock=clock,
    )
    return circuit


def test_a_failure_opens_the_circuit_for_a_cooldown_then_one_probe_goes_through() -> None:
    clock = Clock()
    lines: list[tuple[str, dict[str, Any]]] = []
    circuit = _circuit(clock, lines)
    assert not circuit.is_open
    assert circuit.skip_redis() is False  # closed: every call goes to Redis

    circuit.failed("b", ConnectionError("refused"), falls_back=True)
    assert circuit.is_open
    assert [circuit.skip_redis() for _ in range(5)] == [True] * 5  # cool-down: fallback
    clock.now += 1.0
    assert circuit.skip_redis() is False  # the one probe
    assert [circuit.skip_redis() for _ in range(3)] == [True] * 3  # others: fallback
    circuit.failed("b", ConnectionError("refused"), falls_back=True)  # probe failed
    assert circuit.skip_redis() is True
    clock.now += 1.0
    assert circuit.skip_redis() is False  # next probe
    circuit.succeeded()
    assert not circuit.is_open
    assert circuit.skip_redis() is False

    events = [event for event, _ in lines]
    assert events == ["ratelimit.redis_down", "ratelimit.redis_back"]
    down, back = lines[0][1], lines[1][1]
    assert (down["backend"], down["fallback"], down["bucket"]) == ("redis", "postgres", "b")
    assert back["failures"] == 2
    assert back["fallbacks"] == 2 + 5 + 3 + 1  # two after failures, nine skipped calls


def test_a_probe_that_never_reports_does_not_keep_the_circuit_open_forever() -> None:
    clock = Clock()
    circuit = _circuit(clock, [])
    circuit.failed("b", TimeoutError("frozen"), falls_back=True)
    clock.now += 1.0
    assert circuit.skip_redis() is False  # a probe, cancelled before it reports
    assert circuit.skip_redis() is True
    clock.now += 2.0  # past timeout + cool-down
    assert circuit.skip_redis() is False  # another probe


def test_a_long_outage_logs_one_summary_per_interval_with_counts() -> None:
    clock = Clock()
    lines: list[tuple[str, dict[str, Any]]] = []
    log = OutageLog(
        "worker-progress-publish",
        lambda e, **f: lines.append((e, f)),
        interval_s=10.0,
        clock=clock,
    )
    for _ in range(30):  # 30 s of failures, 100 a second
        for _ in range(100):
            log.failed("timeout")
        clock.now += 1.0
    log.succeeded()
    log.succeeded()  # already up: nothing more
    events = [event for event, _ in lines]
    assert events[0] == "worker-progress-publish-down"
    assert events[-1] == "worker-progress-publish-back"
    summaries = [fields for event, fields in lines if event.endswith("-summary")]
    assert len(summaries) == 2  # at 10 s and 20 s (the 30th second is in the "back" line)
    assert summaries[0]["failures"] == 1000
    assert lines[-1][1]["failures"] == 3000
