"""``docs/cli.md``'s command reference is the commands' own help, regenerated, not edited."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click

from taskq.cli import main

ROOT = Path(__file__).resolve().parents[2]


def test_the_reference_in_docs_cli_md_is_current() -> None:
    done = subprocess.run(
        [sys.executable, "tools/cli_reference.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_every_operations_command_is_in_the_reference() -> None:
    page = (ROOT / "docs" / "cli.md").read_text()
    for group in ("jobs", "workers", "ratelimit", "queues"):
        command = main.commands[group]
        assert isinstance(command, click.Group)
        for name in command.commands:
            assert f"### `taskq {group} {name}`" in page
