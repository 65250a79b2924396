"""SQLAlchemy's asyncio cursor adapter: the driver cursor it wraps.

Why: to close the aiosqlite cursor of a statement a cancelled task abandoned, without
waiting for that statement (see :mod:`taskq._compat.aiosqlite`), taskq needs the
aiosqlite cursor under SQLAlchemy's adapted one; SQLAlchemy keeps it in a private slot
(``_cursor``) and its public ``close()`` waits. For the versions in
:data:`TESTED_VERSIONS` :func:`driver_cursor` returns it; for any other it returns
``None`` and the caller uses the adapter's public ``close()``.
"""

from __future__ import annotations

from typing import Any, Final

import sqlalchemy

TESTED_VERSIONS: Final = ((2, 0), (2, 1))
"""SQLAlchemy ``(major, minor)`` versions whose cursor adapter this module was checked against."""


def _version() -> tuple[int, int]:
    major, minor = (int(part) for part in sqlalchemy.__version__.split(".")[:2])
    return major, minor


SUPPORTED: Final = _version() in TESTED_VERSIONS
"""Whether the installed SQLAlchemy keeps the driver cursor where this module looks."""


def driver_cursor(cursor: Any) -> Any:
    """The driver's cursor under SQLAlchemy's asyncio cursor adapter ``cursor``, or
    ``None`` (not an adapter, or a SQLAlchemy this module does not know)."""
    if not SUPPORTED:
        return None
    return getattr(cursor, "_cursor", None)
