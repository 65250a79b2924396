"""``taskq._compat``: the private attributes taskq reads are where it reads them, in the
versions installed (the public fallback is tested in
``tests/integration/test_sqlite_cancellation.py``).

These tests fail loudly when aiosqlite or SQLAlchemy change: a new version must be
checked against the module's docstring and added to its ``TESTED_VERSIONS``.
"""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path
from typing import Any

import aiosqlite
import sqlalchemy

from taskq._compat import aiosqlite as compat_aiosqlite
from taskq._compat import sqlalchemy as compat_sqlalchemy
from taskq.db.engine import make_engine
from taskq.settings import TaskQSettings


def test_the_installed_aiosqlite_is_one_whose_internals_were_checked() -> None:
    assert compat_aiosqlite.SUPPORTED, (
        f"aiosqlite {aiosqlite.__version__}: check Connection._tx, Connection._connection, "
        "Cursor._conn and Cursor._cursor against taskq/_compat/aiosqlite.py, then add the "
        "version to its TESTED_VERSIONS"
    )


def test_the_installed_sqlalchemy_is_one_whose_cursor_adapter_was_checked() -> None:
    assert compat_sqlalchemy.SUPPORTED, (
        f"SQLAlchemy {sqlalchemy.__version__}: check the asyncio cursor adapter's _cursor "
        "against taskq/_compat/sqlalchemy.py, then add the version to its TESTED_VERSIONS"
    )


async def test_a_call_queued_on_aiosqlites_thread_runs_there_in_order(tmp_path: Path) -> None:
    driver = await aiosqlite.connect(tmp_path / "x.db")
    try:
        ran: list[tuple[str, int]] = []
        cursor = await driver.execute("SELECT 1")
        parts = compat_aiosqlite.cursor_parts(cursor)
        assert parts is not None
        assert parts[0] is driver
        assert isinstance(parts[1], sqlite3.Cursor)
        queued = compat_aiosqlite.call_soon(
            driver, lambda conn: ran.append(("queued", threading.get_ident()))
        )
        assert queued
        await driver.execute("SELECT 2")  # queued after: runs after the call
        assert [name for name, _ in ran] == ["queued"]
        assert ran[0][1] != threading.get_ident()  # on aiosqlite's thread, not the loop's
    finally:
        await driver.close()


async def test_the_driver_cursor_under_sqlalchemys_adapter_is_aiosqlites(
    tmp_path: Path, settings: TaskQSettings
) -> None:
    engine = make_engine(f"sqlite:///{tmp_path / 'x.db'}", settings=settings)
    try:
        async with engine.connect() as conn:

            def driver_cursor(sync_conn: Any) -> Any:
                cursor = sync_conn.connection.dbapi_connection.cursor()
                try:
                    return compat_sqlalchemy.driver_cursor(cursor)
                finally:
                    cursor.close()

            assert isinstance(await conn.run_sync(driver_cursor), aiosqlite.Cursor)
    finally:
        await engine.dispose()
