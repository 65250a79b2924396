"""pgqueuer worker for the comparison (runs in its own throwaway venv)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import UTC, datetime

import asyncpg
from pgqueuer import PgQueuer
from pgqueuer.db import AsyncpgDriver
from pgqueuer.models import Job

LATENCY_FILE = os.environ.get("BENCH_LATENCY_FILE")


@asynccontextmanager
async def main() -> AsyncIterator[PgQueuer]:
    conn = await asyncpg.connect(os.environ["PGDSN"])
    pgq = PgQueuer(AsyncpgDriver(conn))
    out = open(LATENCY_FILE, "a") if LATENCY_FILE else None  # noqa: SIM115, ASYNC230

    @pgq.entrypoint("noop")
    async def noop(job: Job) -> None:
        if out is not None:
            out.write(f"{(datetime.now(UTC) - job.created).total_seconds() * 1000:.3f}\n")
            out.flush()

    yield pgq
    await conn.close()
