"""taskq: a Postgres-backed job queue with first-class rate limiting."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
