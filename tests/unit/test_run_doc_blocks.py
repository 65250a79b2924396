"""tools/run_doc_blocks.py: a ``title="file.py"`` block is written where a later block (or
a command the page shows) imports it, and a failing block fails the page."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "run_doc_blocks.py"


def _run(page: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(TOOL), str(page)], capture_output=True, text=True, timeout=120
    )


def test_a_titled_block_is_a_file_later_blocks_import(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text(
        'Write `pkg/mod.py`:\n\n```python title="pkg/mod.py"\nVALUE = 41\n```\n\n'
        "Then use it:\n\n```python\nfrom pkg.mod import VALUE\n\nassert VALUE + 1 == 42\n```\n"
    )
    proc = _run(page)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 runnable block(s), 0 no-run, 0 failed" in proc.stdout


def test_a_failing_block_fails_the_page(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text('```python title="broken.py"\nraise RuntimeError("boom")\n```\n')
    proc = _run(page)
    assert proc.returncode == 1
    assert "RuntimeError: boom" in proc.stderr
    assert "1 failed" in proc.stdout
