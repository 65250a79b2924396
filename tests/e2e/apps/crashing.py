"""The basic actors in a worker whose claim loop has a bug: every claim raises.

Used to check that a worker whose own code crashes exits non-zero.
"""

from __future__ import annotations

from typing import Any

from taskq.worker.dispatch import Dispatcher
from tests.e2e.apps.basic import registry as _basic


async def _broken_claim(self: Dispatcher, free: int) -> list[dict[str, Any]]:
    raise RuntimeError("a planned bug in the claim loop")


setattr(Dispatcher, "claim", _broken_claim)  # noqa: B010
registry: dict[str, Any] = dict(_basic)
