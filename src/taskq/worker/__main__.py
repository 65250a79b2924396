"""``python -m taskq.worker MODULE:ATTR [options]``: the same as ``taskq worker``."""

from __future__ import annotations

from taskq.cli.worker import worker

if __name__ == "__main__":
    worker(prog_name="python -m taskq.worker")
