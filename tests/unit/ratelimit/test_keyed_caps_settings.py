"""``TASKQ_MAX_KEYED_RATE_LIMITS`` / ``TASKQ_MAX_KEYED_RESERVATIONS`` are settings the
worker's registry honours; caps given to ``RateLimitRegistry(...)`` win over them."""

from __future__ import annotations

import uuid
from typing import Any

import pytest
from pydantic import BaseModel

from taskq import actor
from taskq.clock import SystemClock
from taskq.exceptions import ReservationUnavailable
from taskq.ratelimit import KeyedRateLimitRef, RateLimitRegistry
from taskq.ratelimit import registry as default_registry
from taskq.settings import WorkerSettings
from taskq.worker.resources import Limits


class Tenant(BaseModel):
    tenant: str


PER_TENANT = KeyedRateLimitRef.typed(
    Tenant,
    base_name="caps.tenant",
    key_fn=lambda p: p.tenant,
    capacity=5,
    refill_per_second=1,
    backend="memory",
)


@actor(name="caps_sync_tenant", rate_limits=[PER_TENANT])
async def sync_tenant(payload: Tenant) -> None:
    """One bucket per tenant."""


def _settings(monkeypatch: pytest.MonkeyPatch) -> WorkerSettings:
    monkeypatch.setenv("TASKQ_MAX_KEYED_RATE_LIMITS", "2")
    monkeypatch.setenv("TASKQ_MAX_KEYED_RESERVATIONS", "3")
    return WorkerSettings.load()


def _limits(settings: WorkerSettings, registry: Any) -> Limits:
    limits = Limits(None, settings, uuid.uuid4(), registry)  # type: ignore[arg-type]
    limits.prepare([sync_tenant])  # in process only: prepare never touches the store
    return limits


async def _hit(registry: RateLimitRegistry, tenant: str) -> None:
    await registry.acquire_for_actor(
        sync_tenant, {"tenant": tenant}, job_id=None, worker_id=uuid.uuid4(), clock=SystemClock()
    )


def test_settings_read_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = _settings(monkeypatch)
    assert (settings.max_keyed_rate_limits, settings.max_keyed_reservations) == (2, 3)
    assert WorkerSettings.load(max_keyed_rate_limits=7).max_keyed_rate_limits == 7
    with pytest.raises(ValueError):
        WorkerSettings.load(max_keyed_reservations=0)


async def test_the_workers_registry_honours_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = RateLimitRegistry()
    _limits(_settings(monkeypatch), registry)
    assert (registry.max_keyed_rate_limits, registry.max_keyed_reservations) == (2, 3)
    await _hit(registry, "acme")
    await _hit(registry, "globex")
    with pytest.raises(ReservationUnavailable) as info:
        await _hit(registry, "initech")  # a third key: past TASKQ_MAX_KEYED_RATE_LIMITS=2
    assert info.value.bucket_name == "caps.tenant:initech"


async def test_the_constructor_overrides_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    registry = RateLimitRegistry(max_keyed_rate_limits=3)
    _limits(_settings(monkeypatch), registry)
    # The given cap stays; the one left unset follows the settings.
    assert (registry.max_keyed_rate_limits, registry.max_keyed_reservations) == (3, 3)
    for tenant in ("acme", "globex", "initech"):
        await _hit(registry, tenant)


def test_the_default_registry_honours_the_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    before = (default_registry.max_keyed_rate_limits, default_registry.max_keyed_reservations)
    try:
        limits = _limits(_settings(monkeypatch), None)
        assert limits.registry is default_registry
        assert (
            default_registry.max_keyed_rate_limits,
            default_registry.max_keyed_reservations,
        ) == (
            2,
            3,
        )
    finally:
        default_registry.apply_settings(
            max_keyed_rate_limits=before[0], max_keyed_reservations=before[1]
        )


def test_bad_caps_are_refused() -> None:
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError):
            RateLimitRegistry(max_keyed_reservations=bad)  # type: ignore[arg-type]
