"""Reading the audit table and checking a scenario's invariants against the job tables.

For every job the scenario enqueued:

* **no job lost**: it ended ``succeeded`` (or as the scenario expects);
* **attempts equal runs**: every attempt the store counted (``jobs.attempt``) has a run
  in the audit table, except attempts claimed by a worker the scenario killed or froze
  before its actor started (their ``job_attempts`` row names that worker), claims a
  worker handed back unrun as its shutdown began (``WorkerShutdown``), and rate-limit
  denials (recorded ``snoozed``: the actor never ran);
* **no overlapping runs** of one job, except where the earlier run's process was frozen
  (the documented window: from the freeze until the resumed worker stopped it).
"""

from __future__ import annotations

import itertools
import json
import os
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.db.tables import job_attempts, jobs, workers

_UNRUN = ("WorkerShutdown", "WorkerIsolated")
"""Attempts a worker may hand back unrun: claimed as its shutdown began, or as it isolated."""
RESUME_SLACK_S = 2.0
"""How long after SIGCONT a frozen worker's run may still end (it is stopped at resume)."""


@dataclass
class Run:
    attempt: int
    pid: int
    start: float
    end: float | None = None
    event: str | None = None


@dataclass
class Faults:
    """What the scenario did: ``killed`` pid -> time, ``frozen`` pid -> (stop, cont)."""

    killed: dict[int, float] = field(default_factory=dict)
    frozen: dict[int, tuple[float, float]] = field(default_factory=dict)
    other: int = 0

    @property
    def count(self) -> int:
        return len(self.killed) + len(self.frozen) + self.other


def read(path: Path) -> dict[str, dict[int, Run]]:
    """Per job id, per attempt: its run."""
    out: dict[str, dict[int, Run]] = defaultdict(dict)
    if not path.exists():
        return out
    for line in path.read_text().splitlines():
        job, attempt_s, pid_s, event, stamp_s = line.split()
        attempt, stamp = int(attempt_s), float(stamp_s)
        if event == "start":
            out[job][attempt] = Run(attempt, int(pid_s), stamp)
        else:
            run = out[job].setdefault(attempt, Run(attempt, int(pid_s), stamp))
            run.end, run.event = stamp, event
    return out


async def check(
    engine: AsyncEngine,
    audit_path: Path,
    job_ids: set[Any],
    faults: Faults,
    *,
    scenario: str,
    expect: str = "succeeded",
    extra: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Assert the invariants; return the scenario's figures (also appended to
    ``$TASKQ_CHAOS_REPORT`` when set)."""
    async with engine.connect() as conn:
        rows = {
            r.id: r
            for r in (await conn.execute(select(jobs.c.id, jobs.c.status, jobs.c.attempt))).all()
            if r.id in job_ids
        }
        history = (
            await conn.execute(
                select(
                    job_attempts.c.job_id,
                    job_attempts.c.attempt,
                    job_attempts.c.error_class,
                    job_attempts.c.outcome,
                    workers.c.pid,
                ).join(workers, workers.c.id == job_attempts.c.worker_id, isouter=True)
            )
        ).all()
    pid_of = {(h.job_id, h.attempt): h.pid for h in history}
    handed_back = {
        (h.job_id, h.attempt)
        for h in history
        if h.error_class in _UNRUN or h.outcome == "snoozed"  # a rate-limit denial
    }
    runs = read(audit_path)
    lost = [job for job in job_ids if job not in rows or rows[job].status != expect]
    unexplained: list[tuple[Any, int]] = []
    overlaps: list[tuple[Any, int, int]] = []
    allowed = 0
    total_runs = 0
    for job in job_ids:
        row = rows.get(job)
        mine = runs.get(str(job), {})
        total_runs += len(mine)
        if row is None:
            continue
        for attempt in range(1, row.attempt + 1):
            if attempt in mine or (job, attempt) in handed_back:
                continue
            if pid_of.get((job, attempt)) not in (faults.killed.keys() | faults.frozen.keys()):
                unexplained.append((job, attempt))
        assert all(1 <= a <= row.attempt for a in mine), (job, sorted(mine), row.attempt)
        ordered = sorted(mine.values(), key=lambda r: r.start)
        for cur, nxt in itertools.pairwise(ordered):
            end = cur.end if cur.end is not None else faults.killed.get(cur.pid, float("inf"))
            if nxt.start >= end:
                continue
            window = faults.frozen.get(cur.pid)
            if window is not None and end <= window[1] + RESUME_SLACK_S:
                allowed += 1
                continue
            overlaps.append((job, cur.attempt, nxt.attempt))
    figures = {
        "scenario": scenario,
        "jobs": len(job_ids),
        "faults": faults.count,
        "lost": len(lost),
        "runs": total_runs,
        "re_runs": total_runs - len(job_ids),
        "overlaps": len(overlaps),
        "overlaps_in_freeze_window": allowed,
        "attempts_without_run": len(unexplained),
        **(extra or {}),
    }
    report = os.environ.get("TASKQ_CHAOS_REPORT")
    if report:
        fd = os.open(report, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, (json.dumps(figures) + "\n").encode())
        finally:
            os.close(fd)
    print("CHAOS-FIGURES", json.dumps(figures))
    assert not lost, f"{len(lost)} jobs lost, e.g. {[rows.get(j) for j in lost[:5]]}"
    assert not overlaps, f"overlapping runs: {overlaps[:5]}"
    assert not unexplained, f"attempts without a run: {unexplained[:5]}"
    return figures
