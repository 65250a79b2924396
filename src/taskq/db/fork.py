"""Fork safety: a child process never reuses a connection it inherited.

Pre-fork servers (gunicorn ``--preload``, uWSGI without ``lazy-apps``) import the app,
and often enqueue once, in the master, then ``fork()`` the workers. A connection open at
that moment is one socket shared by several processes: two of them talking on it corrupt
the protocol (``server sent data ("D" message) without prior row description``,
``DuplicatePreparedStatement``) or hang.

Every engine taskq holds is registered here; in the child, right after ``fork()``, each
gets SQLAlchemy's documented reset, ``dispose(close=False)``: a fresh pool, the inherited
connections left alone for the parent (psycopg itself never closes a connection from a
process other than the one that opened it). Objects that hold connections checked out
of a pool (the backend's held enqueue connections) check the process id themselves
(:func:`forked_since`) and forget what they hold.
"""

from __future__ import annotations

import os
import threading
import weakref
from typing import Any

__all__ = ["forked_since", "inherited", "track_engine"]

_ENGINES: weakref.WeakSet[Any] = weakref.WeakSet()
_LOCK = threading.Lock()
_INHERITED: list[object] = []
"""Connections checked out in a parent process, kept referenced in the child so that no
garbage collection ever returns (rolls back) them through the inherited socket."""


def track_engine(engine: Any) -> None:
    """Reset ``engine``'s pool (``dispose(close=False)``) in every child forked after this."""
    with _LOCK:
        _ENGINES.add(getattr(engine, "sync_engine", engine))


def forked_since(pid: int) -> bool:
    """Whether this process is not ``pid`` (a fork happened since ``pid`` was read)."""
    return os.getpid() != pid


def inherited(objects: list[Any]) -> None:
    """Keep ``objects`` (connections from the parent) alive and unused in this child."""
    _INHERITED.extend(objects)


def _after_fork_in_child() -> None:
    for engine in list(_ENGINES):
        engine.dispose(close=False)


if hasattr(os, "register_at_fork"):  # not on Windows, which has no fork
    os.register_at_fork(after_in_child=_after_fork_in_child)
