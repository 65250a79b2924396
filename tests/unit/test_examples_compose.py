"""examples/compose.yaml is a valid Compose file for what it promises (parsed and checked
here: Docker is not available on the test machines)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "examples" / "compose.yaml"
ALLOWED_SERVICE_KEYS = {
    "image", "working_dir", "volumes", "environment", "depends_on", "ports", "healthcheck",
    "command", "restart", "stop_signal", "stop_grace_period", "profiles",
}  # fmt: skip
CONDITIONS = {"service_started", "service_healthy", "service_completed_successfully"}


def _services() -> dict[str, dict[str, Any]]:
    document = yaml.safe_load(COMPOSE.read_text())
    assert isinstance(document, dict)
    assert set(document) <= {"services", "x-taskq"}
    services = document["services"]
    assert isinstance(services, dict)
    return services


def test_structure_is_valid() -> None:
    services = _services()
    assert {"postgres", "redis", "migrate", "worker", "admin"} <= set(services)
    for name, service in services.items():
        assert isinstance(service, dict), name
        assert set(service) <= ALLOWED_SERVICE_KEYS, (name, set(service) - ALLOWED_SERVICE_KEYS)
        assert isinstance(service.get("image"), str), name
        for dep, spec in (service.get("depends_on") or {}).items():
            assert dep in services, (name, dep)
            assert spec["condition"] in CONDITIONS, (name, dep)
            if spec["condition"] == "service_healthy":
                assert "healthcheck" in services[dep], (name, dep)
        for port in service.get("ports", []):
            assert re.fullmatch(r"(?:\d+\.\d+\.\d+\.\d+:)?\d+:\d+", port), (name, port)
        command = service.get("command")
        assert command is None or isinstance(command, list), name


def test_the_stack_is_wired_together() -> None:
    services = _services()
    worker = services["worker"]
    assert worker["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert services["migrate"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    env = worker["environment"]
    db = re.fullmatch(r"postgresql://(\w+):(\w+)@postgres:5432/(\w+)", env["TASKQ_DATABASE_URL"])
    assert db is not None
    pg = services["postgres"]["environment"]
    assert db.groups() == (pg["POSTGRES_USER"], pg["POSTGRES_PASSWORD"], pg["POSTGRES_DB"])
    assert env["TASKQ_REDIS_URL"].startswith("redis://redis:6379")
    assert "taskq migrate up" in " ".join(services["migrate"]["command"])
    # The worker's target exists and its queues are the ones the demo's actors use.
    line = " ".join(worker["command"])
    target = re.search(r"taskq worker (\S+):(\S+)((?: -q \S+)+)", line)
    assert target is not None
    module, attr, flags = target.groups()
    assert (ROOT / (module.replace(".", "/") + ".py")).is_file()
    from examples.fleet_demo import actors

    registry = getattr(actors, attr)
    assert module == actors.__name__
    assert {ref.queue for ref in registry.values()} == set(flags.split()[1::2])
    # The admin UI on the same database, reachable from the host only.
    admin = services["admin"]
    assert admin["depends_on"]["migrate"]["condition"] == "service_completed_successfully"
    assert admin["environment"]["TASKQ_DATABASE_URL"] == env["TASKQ_DATABASE_URL"]
    assert "taskq ui serve --host 0.0.0.0 --port 8000" in " ".join(admin["command"])
    assert admin["ports"] == ["127.0.0.1:8000:8000"]
    # The supervisor waits longer than the worker's own shutdown budget (60 s + 5 s).
    assert worker["stop_signal"] == "SIGTERM"
    assert int(worker["stop_grace_period"].removesuffix("s")) > 65
