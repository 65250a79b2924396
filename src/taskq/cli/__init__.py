"""The ``taskq`` command line (Click). Subcommands live in modules named after them."""

from __future__ import annotations

from taskq.cli.main import main

__all__ = ["main"]
