"""Helpers for the worker-process tests: reading the runs file and the job tables."""

from __future__ import annotations

import itertools
from collections import defaultdict
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.tables import job_attempts, jobs


def runs(path: Path) -> dict[str, list[tuple[int, int, str, float]]]:
    """Per job id: ``(attempt, pid, event, time)`` lines the actors recorded."""
    out: dict[str, list[tuple[int, int, str, float]]] = defaultdict(list)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        job_id, attempt, pid, event, stamp = line.split()
        out[job_id].append((int(attempt), int(pid), event, float(stamp)))
    return out


def overlapping(events: list[tuple[int, int, str, float]]) -> bool:
    """True when two attempts of one job ran at the same time (start before the last end)."""
    spans: dict[int, list[float]] = {}
    for attempt, _pid, event, stamp in events:
        spans.setdefault(attempt, [stamp, stamp])
        if event == "start":
            spans[attempt][0] = stamp
        else:
            spans[attempt][1] = stamp
    ordered = sorted(spans.values())
    return any(nxt[0] < cur[1] for cur, nxt in itertools.pairwise(ordered))


async def job_rows(engine: AsyncEngine) -> dict[Any, Any]:
    async with engine.connect() as conn:
        return {r.id: r for r in (await conn.execute(select(jobs))).all()}


async def attempt_rows(engine: AsyncEngine) -> dict[Any, list[Any]]:
    out: dict[Any, list[Any]] = defaultdict(list)
    async with engine.connect() as conn:
        stmt = select(job_attempts).order_by(job_attempts.c.job_id, job_attempts.c.attempt)
        for row in (await conn.execute(stmt)).all():
            out[row.job_id].append(row)
    return out
