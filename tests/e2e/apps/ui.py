"""The actor the admin UI's browser tests run in a real worker: it reports progress step
by step and, at ``hold_at``, waits for a gate file (so a test decides when it goes on)."""

from __future__ import annotations

import asyncio
import os
from typing import Any

from pydantic import BaseModel

from taskq import actor
from taskq.context import JobContext


class Steps(BaseModel):
    steps: int = 10
    step_s: float = 0.2
    hold_at: int = 0
    gate: str = ""


@actor(name="e2e_ui_progress")
async def ui_progress(payload: Steps, ctx: JobContext[Steps]) -> None:
    """``steps`` progress reports ``step_s`` apart; cancellable at every step."""
    for i in range(1, payload.steps + 1):
        if payload.gate and i == payload.hold_at + 1:
            while not os.path.exists(payload.gate):  # noqa: ASYNC240 (a stat, in a test actor)
                ctx.check_cancelled()
                await asyncio.sleep(0.05)
        await ctx.progress(percent=100.0 * i / payload.steps, step=i, detail=f"step {i}")
        await asyncio.sleep(payload.step_s)
        ctx.check_cancelled()


registry: dict[str, Any] = {ui_progress.name: ui_progress}
