"""Column types that behave the same on Postgres and SQLite."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from sqlalchemy import JSON, DateTime
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator

__all__ = ["JSONDoc", "UTCDateTime"]

JSONDoc = JSON().with_variant(JSONB(), "postgresql")
"""JSON everywhere, JSONB on Postgres."""


class UTCDateTime(TypeDecorator[datetime]):
    """A timezone-aware UTC timestamp: ``timestamptz`` on Postgres, ISO text on SQLite.

    SQLite keeps no zone, so values are stored as naive UTC and come back aware.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        """The value as written: an aware datetime in UTC (naive UTC on SQLite); a naive
        one is a ``ValueError``."""
        if value is None:
            return None
        if value.tzinfo is None:
            raise ValueError("naive datetime given to a UTC column; pass an aware datetime")
        value = value.astimezone(UTC)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: Any, dialect: Dialect) -> datetime | None:
        """The value as read: always an aware UTC datetime, on every engine."""
        if value is None:
            return None
        if isinstance(value, str):
            value = datetime.fromisoformat(value)
        assert isinstance(value, datetime)
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
