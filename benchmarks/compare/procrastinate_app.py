"""procrastinate app for the comparison (runs in its own throwaway venv)."""

from __future__ import annotations

import os

from procrastinate import App, PsycopgConnector

app = App(connector=PsycopgConnector(conninfo=os.environ.get("PGDSN", "")))


@app.task(name="noop")
async def noop() -> None:
    return None
