"""Core statements compiled once to SQL text, for the hot paths that run them with
``exec_driver_sql`` or on the driver itself (the enqueue statements, the COPY's
follow-up, the Postgres rate-limit functions): no per-call compile, cache-key or
bind-processing work."""

from __future__ import annotations

from collections.abc import Callable, Hashable, Mapping
from typing import Any

from sqlalchemy.engine import Dialect
from sqlalchemy.sql.compiler import Compiled

__all__ = ["compile_once"]

_CACHE: dict[tuple[Hashable, ...], Compiled] = {}


def compile_once(
    key: Hashable,
    build: Callable[[], Any],
    dialect: Dialect,
    schema_translate_map: Mapping[str | None, str | None] | None,
) -> Compiled:
    """``build()``'s statement compiled for ``dialect`` with the schema map rendered into
    its text, once per ``key``, driver and map (``key`` names the statement and whatever
    else changes what ``build`` makes)."""
    translate = tuple(sorted((schema_translate_map or {}).items(), key=repr))
    cache_key = (key, dialect.name, dialect.driver, translate)
    compiled = _CACHE.get(cache_key)
    if compiled is None:
        mapping = dict(translate)
        compiled = _CACHE[cache_key] = build().compile(
            dialect=dialect,
            schema_translate_map=mapping or None,
            render_schema_translate=bool(mapping),
        )
    return compiled
