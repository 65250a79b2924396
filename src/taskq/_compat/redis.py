"""redis-py's asyncio connection: one pre-encoded command written without a task.

Why: redis-py's asyncio ``Connection.send_packed_command`` runs the write under
``asyncio.wait_for`` whenever the connection has a ``socket_timeout`` (5 s by default
since redis-py 8). On Python 3.11 that is a new task and one more turn of the event loop
per command, a large share of an asyncio rate-limit acquire's client CPU (measured in
``docs/rate-limiting.md``). The write needs no timeout of its own: a connection carries one
command at a time, whatever the socket cannot take yet stays in the transport's buffer,
and the reply's read (``read_response``, under ``socket_timeout``) bounds the whole round
trip. redis-py has no public write without the ``wait_for``, so for the versions in
:data:`TESTED_VERSIONS` :func:`write` puts the bytes on the connection's
``asyncio.StreamWriter`` (``Connection._writer``). For any other version, a connection
with health checks (which ``send_packed_command`` runs), or one that is not connected or
closing, it returns ``False`` and the caller uses ``send_packed_command``.
"""

from __future__ import annotations

import asyncio
import importlib.metadata
from typing import Any, Final

TESTED_VERSIONS: Final = ((8, 1),)
"""redis-py ``(major, minor)`` versions whose asyncio ``Connection`` this module was
checked against (its ``_writer``, set by ``connect()``, cleared by ``disconnect()``)."""


def _version() -> tuple[int, int] | None:
    """The installed redis-py's ``(major, minor)``; ``None`` without redis-py (an extra)."""
    try:
        version = importlib.metadata.version("redis")
    except importlib.metadata.PackageNotFoundError:
        return None
    major, minor = (int(part) for part in version.split(".")[:2])
    return major, minor


SUPPORTED: Final = _version() in TESTED_VERSIONS
"""Whether the installed redis-py keeps an asyncio connection's writer where this module looks."""


def write(conn: Any, command: bytes) -> bool:
    """Write ``command`` on the asyncio connection ``conn`` and return ``True``, or return
    ``False`` (nothing written) where the public ``send_packed_command`` must do it."""
    if not SUPPORTED or conn.health_check_interval:
        return False
    writer = getattr(conn, "_writer", None)
    if type(writer) is not asyncio.StreamWriter or writer.transport.is_closing():
        return False
    writer.write(command)
    return True
