"""``taskq migrate up | down | status | sql`` against real Postgres and SQLite."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from taskq.cli import main
from taskq.db.migrations import head_revision
from tests.support import databases


@pytest.fixture(params=["postgres", "sqlite"])
def fresh_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    if request.param == "postgres":
        with databases.temporary_database("cli") as url:
            yield url.render_as_string(hide_password=False)
    else:
        yield f"sqlite:///{tmp_path / 'cli.db'}"


def _invoke(*args: str, env: dict[str, str] | None = None) -> tuple[int, str]:
    result = CliRunner().invoke(main, list(args), env=env, catch_exceptions=False)
    return result.exit_code, result.output


def test_up_status_down_status(fresh_url: str) -> None:
    head = head_revision()
    code, out = _invoke("migrate", "status", "--database-url", fresh_url, "--exit-code")
    assert code == 1
    assert "none (not migrated)" in out
    assert "migrations pending" in out

    code, out = _invoke("migrate", "up", "--database-url", fresh_url)
    assert code == 0, out
    assert f"at revision {head}" in out

    code, out = _invoke("migrate", "status", "--database-url", fresh_url, "--exit-code")
    assert code == 0, out
    assert f"current:  {head}" in out
    assert "up to date" in out

    code, out = _invoke("migrate", "down", "base", "--database-url", fresh_url)
    assert code == 0, out
    assert "base (no tables)" in out
    code, out = _invoke("migrate", "status", "--database-url", fresh_url)
    assert "none (not migrated)" in out


def test_database_url_from_environment(fresh_url: str) -> None:
    code, out = _invoke("migrate", "up", env={"TASKQ_DATABASE_URL": fresh_url})
    assert code == 0, out
    code, out = _invoke("migrate", "status", env={"TASKQ_DATABASE_URL": fresh_url})
    assert "up to date" in out


def test_sql_prints_ddl_without_connecting() -> None:
    code, out = _invoke("migrate", "sql", "--database-url", "postgresql://nobody@127.0.0.1:1/none")
    assert code == 0, out
    assert "CREATE SCHEMA IF NOT EXISTS taskq" in out
    assert "CREATE TABLE jobs" in out
    assert "CREATE UNIQUE INDEX uq_jobs_singleton_active ON jobs (actor) WHERE singleton" in out
    code, out = _invoke("migrate", "sql", "--down", "--database-url", "sqlite:///x.db")
    assert code == 0, out
    assert "DROP TABLE jobs" in out


def test_bad_input_is_a_clear_error_and_changes_nothing(tmp_path: Path) -> None:
    code, out = _invoke("migrate", "up", "--database-url", "mysql://u@h/db")
    assert code == 2
    assert "unsupported database URL" in out
    code, out = _invoke("migrate", "up", "--schema", "bad-name", "--database-url", "sqlite:///x")
    assert code == 2
    assert "--schema" in out
    code, out = _invoke("migrate", "up", "--database-url", "postgresql://postgres@127.0.0.1:1/x")
    assert code == 3
    assert "cannot migrate" in out
    assert "Traceback" not in out


def test_console_script_on_the_embedded_default(tmp_path: Path) -> None:
    """The installed ``taskq`` command migrates ./taskq.db when no URL is configured."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TASKQ_")}
    exe = Path(sys.executable).with_name("taskq")
    up = subprocess.run(
        [str(exe), "migrate", "up"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert up.returncode == 0, up.stderr
    assert (tmp_path / "taskq.db").is_file()
    status = subprocess.run(
        [str(exe), "migrate", "status"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    assert status.returncode == 0, status.stderr
    assert "sqlite+aiosqlite:///./taskq.db" in status.stdout
    assert "up to date" in status.stdout


def test_custom_schema_from_the_command_line(settings: object) -> None:
    with databases.temporary_database("clischema") as url:
        raw = url.render_as_string(hide_password=False)
        code, out = _invoke("migrate", "up", "--database-url", raw, "--schema", "other_schema")
        assert code == 0, out
        code, out = _invoke("migrate", "status", "--database-url", raw, "--schema", "other_schema")
        assert "up to date" in out
        code, out = _invoke("migrate", "status", "--database-url", raw)
        assert "none (not migrated)" in out
