"""The documentation site builds with ``mkdocs build --strict``: no broken link or anchor,
and every page of docs/ in the navigation (mkdocs.yml turns each of those into a warning,
and ``--strict`` makes a warning fail the build)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_site_builds_strict(tmp_path: Path) -> None:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-f", str(ROOT / "mkdocs.yml"),
         "-d", str(tmp_path / "site")],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    pages = {p.stem for p in (ROOT / "docs").glob("*.md")} - {"README"}
    built = {p.parent.name for p in (tmp_path / "site").glob("*/index.html")}
    assert pages <= built, pages - built
    assert (tmp_path / "site" / "index.html").is_file()  # docs/README.md is the home page
