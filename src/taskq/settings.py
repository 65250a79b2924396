"""Settings read from ``TASKQ_*`` environment variables.

:meth:`TaskQSettings.load` is the one entry point. An invalid value raises
:class:`~taskq.exceptions.ConfigurationError` naming the variable, so a misconfigured
process fails at startup, not on its first job.
"""

from __future__ import annotations

import logging
from datetime import timedelta
from typing import Any, ClassVar, Literal, Self

from pydantic import Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from taskq.constants import DEFAULT_SCHEMA, DEFAULT_SQLITE_URL, SCHEMA_NAME_RE
from taskq.exceptions import ConfigurationError

__all__ = ["TaskQSettings", "WorkerSettings"]

_log = logging.getLogger("taskq.settings")
_ENV_PREFIX = "TASKQ_"


def seconds_or_iso(value: Any) -> Any:
    """A duration setting's raw value: a string of seconds (``"0.5"``) becomes a float;
    anything else (an ISO 8601 duration, a timedelta) is left for pydantic."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            return value
    return value


class TaskQSettings(BaseSettings):
    """Settings every taskq process reads: where the stores are and how to talk to them."""

    model_config = SettingsConfigDict(
        env_prefix=_ENV_PREFIX, extra="ignore", frozen=True, validate_default=True
    )

    database_url: str | None = Field(
        default=None,
        description="SQLAlchemy URL of the job store. Unset: the embedded SQLite file "
        f"{DEFAULT_SQLITE_URL}.",
    )
    redis_url: str | None = Field(default=None, description="Redis URL for rate limits/progress.")
    schema_name: str = Field(default=DEFAULT_SCHEMA, description="Postgres schema for the tables.")
    rate_limit_pg_fallback_enabled: bool = Field(
        default=True, description="Fall back to Postgres when Redis is unreachable."
    )
    default_start_to_close: timedelta | None = Field(
        default=None,
        description="Worker-wide per-attempt timeout when neither enqueue nor actor sets one.",
    )
    actor_config_cache_ttl: timedelta = Field(
        default=timedelta(seconds=5), description="TTL of the enqueue-side actor_config cache."
    )
    rate_limit_redis_timeout: timedelta = Field(
        default=timedelta(seconds=1),
        description="Longest wait for one rate-limit call to Redis (async clients) before "
        "it counts as Redis being down.",
    )
    rate_limit_redis_cooldown: timedelta = Field(
        default=timedelta(seconds=1),
        description="After a failed Redis rate-limit call, how long calls go straight to "
        "the Postgres fallback before one probes Redis again.",
    )
    outage_log_interval: timedelta = Field(
        default=timedelta(seconds=60),
        description="While Redis is down, the period of the one summary line with counts.",
    )
    payload_max_bytes: int | None = Field(
        default=1_048_576,
        ge=1,
        description="Largest job payload (bytes of its JSON) an enqueue accepts; unset or "
        "empty for no limit.",
    )
    admin_ui_allow_rate_limit_reset: bool = Field(
        default=False, description="Lets the admin UI reset rate limits."
    )
    admin_actions_enabled: bool = Field(
        default=False, description="Enables admin UI write actions (deregister, cancel)."
    )
    sqlite_busy_timeout_ms: int = Field(
        default=30_000, ge=0, description="How long a SQLite writer waits for the write lock."
    )
    pool_size: int = Field(
        default=10,
        ge=1,
        description="Connections in each engine's pool (it may overflow by as many again).",
    )

    _warned_default_db: ClassVar[bool] = False

    @field_validator("schema_name")
    @classmethod
    def _check_schema(cls, value: str) -> str:
        if SCHEMA_NAME_RE.fullmatch(value) is None or len(value) > 63:
            raise ValueError(f"must match {SCHEMA_NAME_RE.pattern} and be at most 63 characters")
        return value

    @field_validator("payload_max_bytes", mode="before")
    @classmethod
    def _empty_is_none(cls, value: Any) -> Any:
        """``TASKQ_PAYLOAD_MAX_BYTES=`` (empty) means no limit."""
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator(
        "rate_limit_redis_timeout",
        "rate_limit_redis_cooldown",
        "outage_log_interval",
        mode="before",
    )
    @classmethod
    def _seconds_or_iso(cls, value: Any) -> Any:
        """Accept seconds (``TASKQ_RATE_LIMIT_REDIS_TIMEOUT=0.5``) as well as ISO 8601."""
        return seconds_or_iso(value)

    @field_validator(
        "default_start_to_close",
        "actor_config_cache_ttl",
        "rate_limit_redis_timeout",
        "rate_limit_redis_cooldown",
        "outage_log_interval",
    )
    @classmethod
    def _check_positive(cls, value: timedelta | None) -> timedelta | None:
        if value is not None and value <= timedelta(0):
            raise ValueError("must be a positive duration")
        return value

    @classmethod
    def load(cls, **overrides: Any) -> Self:
        """Read the environment (plus explicit ``overrides``) into a validated instance.

        Raises :class:`ConfigurationError` naming the first offending variable.
        """
        try:
            return cls(**overrides)
        except ValidationError as exc:
            err = exc.errors()[0]
            field = str(err["loc"][0]) if err["loc"] else "?"
            variable = field if field in overrides else f"{_ENV_PREFIX}{field.upper()}"
            raise ConfigurationError(variable, str(err["msg"])) from None

    @property
    def effective_database_url(self) -> str:
        """The configured URL, or the embedded SQLite default (announced once at INFO)."""
        if self.database_url:
            return self.database_url
        if not TaskQSettings._warned_default_db:
            TaskQSettings._warned_default_db = True
            _log.info("TASKQ_DATABASE_URL is not set; using the embedded %s", DEFAULT_SQLITE_URL)
        return DEFAULT_SQLITE_URL


class WorkerSettings(TaskQSettings):
    """Settings of a worker process, on top of :class:`TaskQSettings`."""

    max_concurrency: int = Field(default=10, ge=1, description="Jobs one process runs at once.")
    queues: tuple[str, ...] = Field(
        default=("default",),
        description=(
            "Queues this worker claims. Unset, a worker claims the queues of its actors "
            "(taskq.worker.queues); this default applies where no actors are known."
        ),
    )
    lock_lease: timedelta = Field(
        default=timedelta(seconds=60),
        description="How long a claimed job stays this worker's without a heartbeat.",
    )
    heartbeat_interval: timedelta = Field(
        default=timedelta(seconds=10), description="Lease renewal and worker-row stamp period."
    )
    sweep_interval: timedelta = Field(
        default=timedelta(seconds=30),
        description="How often the leader reclaims expired leases and drops expired results.",
    )
    poll_interval: timedelta = Field(
        default=timedelta(milliseconds=200),
        description="Longest idle sleep between claims (SQLite's only wake-up).",
    )
    claim_batch_size: int = Field(
        default=100, ge=1, description="Most jobs one claim statement takes."
    )
    cancellation_grace_period: timedelta = Field(
        default=timedelta(seconds=30),
        description="Cooperative phase of a job cancel and of shutdown's CANCELLING.",
    )
    cleanup_grace_period: timedelta = Field(
        default=timedelta(seconds=10),
        description="Forced phase of a job cancel (before abandon) and of shutdown's FORCING.",
    )
    termination_grace_period: timedelta = Field(
        default=timedelta(seconds=60),
        description="Total shutdown budget; the watchdog ends the process 5 s after it.",
    )
    progress_data_max_bytes: int = Field(
        default=8192, ge=1, description="Largest ctx.progress(data=...) in JSON bytes."
    )
    progress_flush_interval: timedelta = Field(
        default=timedelta(seconds=2), description="How often coalesced progress is written."
    )
    log_level: str = Field(default="INFO", description="Worker log level (structlog).")
    log_format: Literal["auto", "json", "console"] = Field(
        default="auto",
        description=(
            "Worker log lines: JSON objects, or the console renderer; auto: JSON unless "
            "stderr is a terminal. Ignored when the application configured structlog."
        ),
    )
    otel_process_parent: Literal["parent", "link"] = Field(
        default="parent",
        description=(
            "An attempt's process span: a child of the context stored at enqueue (parent), "
            "or the root of a new trace linked to it (link)."
        ),
    )
    max_keyed_rate_limits: int = Field(
        default=10_000,
        ge=1,
        description="Most keyed rate limits the worker's registry holds at once.",
    )
    max_keyed_reservations: int = Field(
        default=10_000,
        ge=1,
        description="Most keyed reservations the worker's registry holds at once.",
    )
    boot_retry_timeout: timedelta = Field(
        default=timedelta(seconds=60),
        description=(
            "How long a booting worker keeps retrying a refused or dropped database "
            "connection before it exits 1; 0 fails at the first one."
        ),
    )

    @field_validator(
        "lock_lease",
        "heartbeat_interval",
        "sweep_interval",
        "poll_interval",
        "cancellation_grace_period",
        "cleanup_grace_period",
        "termination_grace_period",
        "progress_flush_interval",
        "boot_retry_timeout",
        mode="before",
    )
    @classmethod
    def _seconds_string(cls, value: Any) -> Any:
        """Accept ``TASKQ_POLL_INTERVAL=0.2`` (seconds) as well as ISO 8601 durations."""
        return seconds_or_iso(value)

    @field_validator("log_level")
    @classmethod
    def _check_level(cls, value: str) -> str:
        level = value.upper()
        if level not in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"):
            raise ValueError("must be one of DEBUG, INFO, WARNING, ERROR, CRITICAL")
        return level

    @field_validator(
        "lock_lease",
        "heartbeat_interval",
        "sweep_interval",
        "poll_interval",
        "cancellation_grace_period",
        "cleanup_grace_period",
        "termination_grace_period",
        "progress_flush_interval",
    )
    @classmethod
    def _check_durations(cls, value: timedelta) -> timedelta:
        if value <= timedelta(0):
            raise ValueError("must be a positive duration")
        return value

    @field_validator("boot_retry_timeout")
    @classmethod
    def _check_not_negative(cls, value: timedelta) -> timedelta:
        if value < timedelta(0):
            raise ValueError("must not be negative")
        return value
