"""Settings: read from TASKQ_* variables; a bad value names the variable and stops startup."""

from __future__ import annotations

from datetime import timedelta

import pytest

from taskq.constants import DEFAULT_SQLITE_URL
from taskq.exceptions import ConfigurationError
from taskq.settings import TaskQSettings, WorkerSettings


def test_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    for var in ("TASKQ_DATABASE_URL", "TASKQ_SCHEMA_NAME", "TASKQ_MAX_CONCURRENCY"):
        monkeypatch.delenv(var, raising=False)
    s = WorkerSettings.load()
    assert s.database_url is None
    assert s.effective_database_url == DEFAULT_SQLITE_URL
    assert s.schema_name == "taskq"
    assert s.rate_limit_pg_fallback_enabled is True
    assert s.max_concurrency == 10
    assert s.actor_config_cache_ttl == timedelta(seconds=5)
    assert s.boot_retry_timeout == timedelta(seconds=60)


def test_reads_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TASKQ_DATABASE_URL", "postgresql://u@h/db")
    monkeypatch.setenv("TASKQ_SCHEMA_NAME", "jobs_v2")
    monkeypatch.setenv("TASKQ_MAX_CONCURRENCY", "32")
    monkeypatch.setenv("TASKQ_RATE_LIMIT_PG_FALLBACK_ENABLED", "false")
    monkeypatch.setenv("TASKQ_DEFAULT_START_TO_CLOSE", "PT90S")
    s = WorkerSettings.load()
    assert s.effective_database_url == "postgresql://u@h/db"
    assert s.schema_name == "jobs_v2"
    assert s.max_concurrency == 32
    assert s.rate_limit_pg_fallback_enabled is False
    assert s.default_start_to_close == timedelta(seconds=90)


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        ("TASKQ_MAX_CONCURRENCY", "lots"),
        ("TASKQ_MAX_CONCURRENCY", "0"),
        ("TASKQ_SCHEMA_NAME", "drop table;"),
        ("TASKQ_RATE_LIMIT_PG_FALLBACK_ENABLED", "perhaps"),
        ("TASKQ_DEFAULT_START_TO_CLOSE", "-5"),
        ("TASKQ_LOCK_LEASE", "0"),
        ("TASKQ_BOOT_RETRY_TIMEOUT", "-1"),
    ],
)
def test_bad_value_names_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigurationError) as info:
        WorkerSettings.load()
    assert info.value.variable == variable
    assert variable in str(info.value)


@pytest.mark.parametrize(("value", "expected"), [("0", 0.0), ("2.5", 2.5), ("PT5M", 300.0)])
def test_boot_retry_timeout_takes_seconds_or_a_duration(
    monkeypatch: pytest.MonkeyPatch, value: str, expected: float
) -> None:
    monkeypatch.setenv("TASKQ_BOOT_RETRY_TIMEOUT", value)
    assert WorkerSettings.load().boot_retry_timeout.total_seconds() == expected


def test_bad_override_names_the_argument() -> None:
    with pytest.raises(ConfigurationError) as info:
        TaskQSettings.load(schema_name="no-dashes")
    assert info.value.variable == "schema_name"


def test_settings_are_immutable() -> None:
    s = TaskQSettings.load(schema_name="taskq")
    with pytest.raises(ValueError, match="frozen"):
        s.schema_name = "other"  # type: ignore[misc]


def test_default_database_is_announced_once(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.delenv("TASKQ_DATABASE_URL", raising=False)
    monkeypatch.setattr(TaskQSettings, "_warned_default_db", False)
    caplog.set_level("INFO", logger="taskq.settings")
    s = TaskQSettings.load()
    assert s.effective_database_url == DEFAULT_SQLITE_URL
    assert s.effective_database_url == DEFAULT_SQLITE_URL
    announcements = [r for r in caplog.records if "embedded" in r.getMessage()]
    assert len(announcements) == 1
    assert announcements[0].levelname == "INFO"
