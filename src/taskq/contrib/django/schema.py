"""Create and drop taskq's tables from a Django migration (``manage.py migrate``).

The migration runs taskq's own Alembic migrations (the same ones ``taskq migrate up``
runs) on the Django database taskq uses, through a short-lived engine disposed of
before it returns, so nothing stays connected to a test database that is about to be
dropped. Reversing the migration (``manage.py migrate taskq zero``) drops the tables.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

from taskq.contrib.django.conf import database_alias, database_url, taskq_settings
from taskq.db.dialect import sync_url
from taskq_sync.db import migrate

__all__ = ["create_tables", "drop_tables"]


def _run(schema_editor: Any, revision: str, up: bool) -> None:
    alias = schema_editor.connection.alias
    if alias != database_alias():
        return  # taskq's tables live in one database only
    settings = taskq_settings()
    engine = create_engine(sync_url(database_url(alias)), poolclass=NullPool)
    try:
        if up:
            migrate.upgrade(engine, revision, settings=settings)
        else:
            migrate.downgrade(engine, revision, settings=settings)
    finally:
        engine.dispose()


def create_tables(apps: Any, schema_editor: Any) -> None:
    """RunPython forward: migrate taskq's schema up to the newest revision."""
    _run(schema_editor, "head", up=True)


def drop_tables(apps: Any, schema_editor: Any) -> None:
    """RunPython backward: migrate taskq's schema down to nothing."""
    _run(schema_editor, "base", up=False)
