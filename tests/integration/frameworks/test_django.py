"""Django: ``manage.py test`` of a real project passes from a fresh database and tears down.

The project (``django_project``) has taskq's app in ``INSTALLED_APPS``; its tests
(``shop/tests.py``) run under Django's own runner on real Postgres, with real worker
processes (``manage.py taskq_worker``). Here: the run passes (every test in it), its
test database got taskq's tables from ``migrate``, and it is gone afterwards (no
"being accessed by other users").
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import psycopg
import pytest

pytestmark = pytest.mark.e2e

PROJECT = Path(__file__).resolve().parent / "django_project"


def _databases() -> set[str]:
    with psycopg.connect("postgresql://postgres@127.0.0.1:5432/postgres") as conn:
        return {row[0] for row in conn.execute("SELECT datname FROM pg_database")}


def test_manage_py_test_passes_from_a_fresh_database(unique_name: str) -> None:
    name = f"djt_{os.getpid()}_{unique_name[-8:]}".lower()
    env = {
        **os.environ,
        "DJ_DB_NAME": name,
        "DJ_UNIQUE": unique_name,
        "PYTHONPATH": os.pathsep.join([str(PROJECT), *sys.path]),
    }
    proc = subprocess.run(
        [sys.executable, "manage.py", "test", "shop", "-v", "2", "--noinput"],
        cwd=PROJECT,
        env=env,
        capture_output=True,
        text=True,
        timeout=280,
        check=False,
    )
    out = proc.stdout + proc.stderr
    assert proc.returncode == 0, out
    # the same tests on Django 5.2 (django-tasks backport) and 6.1: `nox -s django`
    assert "Ran 15 tests" in out, out
    assert "OK" in out.splitlines()[-1] or "\nOK" in out, out
    assert "being accessed by other users" not in out, out
    assert f"test_{name}" not in _databases()
