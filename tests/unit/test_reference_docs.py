"""The generated reference pages (exceptions, CLI, settings) are current and complete."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import click
import pytest

import taskq.exceptions
from taskq.cli import main as cli_main
from taskq.settings import WorkerSettings

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gen_reference_docs  # noqa: E402


def test_the_committed_pages_are_what_the_generator_writes() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_reference_docs.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def _section(page: str, heading: str) -> str:
    return page.split(heading, 1)[1].split("\n## ", 1)[0]


def test_every_exception_has_a_section_with_its_fields() -> None:
    page = gen_reference_docs.render_exceptions()
    for name in taskq.exceptions.__all__:
        assert f"## `{name}`" in page
    section = _section(page, "## `MaxPendingExceededError`")
    for field in ("actor", "current_count", "max_pending"):
        assert f"| `{field}` | `" in section
    assert "| `error_class` |" in _section(page, "## `JobCancelledError`")  # inherited fields
    assert "Also importable from `taskq.di`" in _section(page, "## `MissingProvider`")


def _commands(cmd: click.Command, path: str) -> list[tuple[str, click.Command]]:
    out = [(path, cmd)]
    if isinstance(cmd, click.Group):
        for name, sub in cmd.commands.items():
            out += _commands(sub, f"{path} {name}")
    return out


def test_every_command_and_option_is_in_the_cli_reference() -> None:
    page = gen_reference_docs.render_cli()
    for path, cmd in _commands(cli_main, "taskq"):
        section = _section(page, f"## `{path}`\n")
        for param in cmd.params:
            if isinstance(param, click.Option) and not param.hidden:
                assert f"`{param.opts[0]}`" in section, (path, param.opts)
    assert "Sentinel" not in page


def test_every_setting_is_in_the_settings_reference() -> None:
    page = gen_reference_docs.render_settings()
    for name in WorkerSettings.model_fields:
        assert f"| `TASKQ_{name.upper()}` |" in page
    assert "| `TASKQ_LOCK_LEASE` | timedelta | `60 s` |" in page


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    for name in gen_reference_docs.PAGES:
        shutil.copy(ROOT / "docs" / name, docs / name)
    monkeypatch.setattr(gen_reference_docs, "DOCS", docs)
    assert gen_reference_docs.main(["--check"]) == 0
    page = docs / "settings-reference.md"
    page.write_text(page.read_text().replace("TASKQ_POOL_SIZE", "TASKQ_POOL"))
    assert gen_reference_docs.main(["--check"]) == 1
    gen_reference_docs.main([])
    assert gen_reference_docs.main(["--check"]) == 0
