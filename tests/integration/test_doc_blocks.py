"""Every fenced ```python block in README.md and docs/*.md runs, file by file.

Each file goes through ``tools/run_doc_blocks.py`` as ``nox -s docs`` runs it: in a fresh
interpreter and a fresh working directory, against one PostgreSQL database migrated for
the pages of this test process (``TASKQ_DATABASE_URL``, shared by the pages as in the nox
session) and the test Redis. A block marked
```python no-run is skipped by the tool; a block that raises fails this test with the
tool's report (the file, the block's line and the traceback).
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import databases

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

pytestmark = pytest.mark.engine("postgres")


@pytest.fixture(scope="module")
def docs_url() -> Iterator[str]:
    """A migrated database for the pages run by this process, dropped afterwards."""
    name = f"taskq_docs_{databases.RUN_ID}_{uuid.uuid4().hex[:6]}"
    url = databases.create_database(name).render_as_string(hide_password=False)
    migrate = [sys.executable, "-c", "from taskq.cli import main; main()"]
    subprocess.run([*migrate, "migrate", "up", "--database-url", url], check=True)
    yield url
    databases.drop_database(name)


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_python_blocks_run(page: Path, docs_url: str) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    env.update(
        TASKQ_DATABASE_URL=docs_url,
        TASKQ_REDIS_URL=databases.REDIS_URL,
        TASKQ_TEST_DATABASE_URL=databases.ADMIN_URL,
        TASKQ_TEST_REDIS_URL=databases.REDIS_URL,
        PYTHONPATH=str(ROOT),
    )
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tools" / "run_doc_blocks.py"), str(page)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-8000:]
    assert "0 failed" in proc.stdout
