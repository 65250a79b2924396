"""docs/exceptions.md is generated from ``taskq.exceptions`` and must be current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import taskq.exceptions

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools"))
import gen_exceptions_doc  # noqa: E402


def test_the_committed_page_is_what_the_generator_writes() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "gen_exceptions_doc.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_every_exception_has_a_section_with_its_fields() -> None:
    page = gen_exceptions_doc.render()
    for name in taskq.exceptions.__all__:
        assert f"## `{name}`" in page
    section = page.split("## `MaxPendingExceededError`")[1].split("\n## ")[0]
    for field in ("actor", "current_count", "max_pending"):
        assert f"| `{field}` | `" in section
    inherited = page.split("## `JobCancelledError`")[1].split("\n## ")[0]
    assert "| `error_class` |" in inherited  # fields of the base class are listed too
    assert "Also importable from `taskq.di`" in page.split("## `MissingProvider`")[1]


def test_check_fails_on_a_stale_page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stale = tmp_path / "exceptions.md"
    stale.write_text(gen_exceptions_doc.render().replace("Root of every", "Root of no"))
    monkeypatch.setattr(gen_exceptions_doc, "TARGET", stale)
    monkeypatch.setattr(gen_exceptions_doc, "ROOT", tmp_path)
    assert gen_exceptions_doc.main(["--check"]) == 1
    gen_exceptions_doc.main([])
    assert gen_exceptions_doc.main(["--check"]) == 0
