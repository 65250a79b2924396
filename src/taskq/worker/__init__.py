"""The async worker runtime: claim, execute, complete, heartbeat, sweep, shut down.

Entry point: :func:`taskq.worker.run.worker_main` (or ``taskq worker MODULE:ATTR``).
"""

from __future__ import annotations

__all__: list[str] = []
