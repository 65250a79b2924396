"""Alembic configuration for taskq's migrations (no I/O; see ``taskq.db.migrate``).

The migration scripts live in the top-level ``alembic/`` folder of the source tree and
ship inside the wheel as ``taskq/_alembic``.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy.engine import URL

from taskq.db.dialect import is_postgres, sync_url

__all__ = ["MigrationStatus", "alembic_config", "head_revision", "offline_sql", "script_location"]


@dataclass(frozen=True, slots=True)
class MigrationStatus:
    """Where a database stands against the migrations this package ships."""

    current: str | None
    head: str | None

    @property
    def up_to_date(self) -> bool:
        """True when the database is at the newest revision."""
        return self.current is not None and self.current == self.head


_PACKAGE_DIR = Path(__file__).resolve().parent.parent


def script_location() -> Path:
    """The folder holding ``env.py`` and ``versions/``."""
    for candidate in (_PACKAGE_DIR / "_alembic", _PACKAGE_DIR.parent.parent / "alembic"):
        if (candidate / "env.py").is_file():
            return candidate
    raise RuntimeError("taskq's alembic migrations are missing from this installation")


def alembic_config(
    *, schema: str, url: str | URL | None = None, connection: Any = None, buffer: Any = None
) -> Config:
    """An alembic ``Config`` for taskq: the schema, and a connection or URL to run on."""
    cfg = Config(output_buffer=buffer) if buffer is not None else Config()
    cfg.set_main_option("script_location", str(script_location()))
    cfg.attributes["taskq_schema"] = schema
    if connection is not None:
        cfg.attributes["connection"] = connection
    if url is not None:
        cfg.attributes["url"] = sync_url(url)
    return cfg


def head_revision() -> str | None:
    """The newest migration the installed package ships."""
    script = ScriptDirectory.from_config(alembic_config(schema="taskq"))
    return script.get_current_head()


def offline_sql(url: str | URL, *, schema: str, revision: str = "head", down: bool = False) -> str:
    """The SQL ``migrate up`` (or ``down`` to ``revision``) would run, without connecting."""
    from alembic import command

    buffer = io.StringIO()
    cfg = alembic_config(schema=schema, url=url, buffer=buffer)
    if down:
        current = head_revision()
        command.downgrade(cfg, f"{current}:{revision}", sql=True)
    else:
        command.upgrade(cfg, revision, sql=True)
    return buffer.getvalue()


def version_table_schema(url: str | URL, schema: str) -> str | None:
    """Where alembic keeps its version table: the taskq schema on Postgres."""
    return schema if is_postgres(url) else None
