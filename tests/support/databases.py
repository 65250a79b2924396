"""Test databases: one migrated Postgres database per xdist worker, SQLite files by copy.

``TASKQ_TEST_DATABASE_URL`` points at a Postgres server (any database on it; the admin
connection uses it to create and drop the per-worker databases). ``TASKQ_TEST_REDIS_URL``
points at Redis; each xdist worker gets its own logical database.
"""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from sqlalchemy import create_engine, text
from sqlalchemy.engine import URL, make_url

from taskq.db import tables

ADMIN_URL = os.environ.get(
    "TASKQ_TEST_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1:5432/postgres"
)
REDIS_URL = os.environ.get("TASKQ_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
RUN_ID = uuid.uuid4().hex[:8]


def admin_url() -> URL:
    return make_url(ADMIN_URL).set(drivername="postgresql+psycopg")


def worker_index(worker_id: str) -> int:
    return 0 if worker_id == "master" else int(worker_id.removeprefix("gw"))


def create_database(name: str) -> URL:
    """Create an empty Postgres database and return its URL."""
    admin = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    admin.dispose()
    return admin_url().set(database=name)


def drop_database(name: str) -> None:
    admin = create_engine(admin_url(), isolation_level="AUTOCOMMIT")
    with admin.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    admin.dispose()


@contextmanager
def temporary_database(prefix: str) -> Iterator[URL]:
    name = f"taskq_{prefix}_{RUN_ID}_{uuid.uuid4().hex[:6]}"
    url = create_database(name)
    try:
        yield url
    finally:
        drop_database(name)


def truncate_all(url: URL | str, schema: str = "taskq") -> None:
    """Empty every taskq table (keeps the migrated schema)."""
    engine = create_engine(make_url(url).set(drivername="postgresql+psycopg"))
    names = ", ".join(f'"{schema}"."{t.name}"' for t in tables.metadata.sorted_tables)
    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {names} RESTART IDENTITY CASCADE"))
    engine.dispose()


def copy_sqlite(template: Path, target: Path) -> Path:
    shutil.copyfile(template, target)
    return target


@contextmanager
def migrated_database(prefix: str, schema: str) -> Iterator[URL]:
    """A fresh Postgres database migrated into ``schema`` (nothing in ``taskq``), dropped
    after the block."""
    import asyncio

    from taskq.db import migrate
    from taskq.db.engine import make_engine
    from taskq.settings import TaskQSettings

    settings = TaskQSettings.load(database_url=None, redis_url=None, schema_name=schema)
    with temporary_database(prefix) as url:

        async def _migrate() -> None:
            engine = make_engine(url, settings=settings)
            await migrate.upgrade(engine, settings=settings)
            await engine.dispose()

        asyncio.run(_migrate())
        yield url
