"""Identifiers: time-ordered UUIDv7 so new job rows land at the right edge of the index."""

from __future__ import annotations

import os
import threading
import time
from uuid import UUID

__all__ = ["new_job_id", "new_uuid"]

_lock = threading.Lock()
_last_ms = 0
_counter = 0


def new_uuid() -> UUID:
    """Return a UUIDv7 (RFC 9562): 48-bit Unix milliseconds, then a 12-bit counter, then random.

    Ids made in one process are strictly increasing, so B-tree inserts stay local.
    One ``os.urandom`` call per id (enqueue_many makes thousands a second).
    """
    global _last_ms, _counter
    entropy = int.from_bytes(os.urandom(10), "big")
    with _lock:
        ms = time.time_ns() // 1_000_000
        if ms <= _last_ms:
            _counter += 1
            if _counter > 0xFFF:
                _last_ms += 1
                _counter = 0
            ms = _last_ms
        else:
            _last_ms = ms
            _counter = (entropy >> 62) & 0x3FF
        counter = _counter
    rand = entropy & ((1 << 62) - 1)
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76
    value |= counter << 64
    value |= 0b10 << 62
    value |= rand
    return UUID(int=value)


def new_job_id() -> UUID:
    """A new job id (a UUIDv7)."""
    return new_uuid()
