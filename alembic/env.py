"""Alembic environment for taskq: runs on the connection taskq hands it, or offline on a URL.

The tables carry no schema; on Postgres ``schema_translate_map`` puts them in the taskq
schema (``TASKQ_SCHEMA_NAME``), which is created first, and ``search_path`` is set for
the migration's transaction so reflection sees the same schema.
"""

from __future__ import annotations

from typing import Any

from alembic import context
from sqlalchemy.schema import CreateSchema

from taskq.db.dialect import is_postgres, set_local_search_path
from taskq.db.tables import metadata

config = context.config
schema: str = config.attributes.get("taskq_schema", "taskq")


def _include_name(name: str | None, type_: str, _parents: Any) -> bool:
    # alembic's own version table lives beside ours; it is not part of taskq's schema.
    return not (type_ == "table" and name == "alembic_version")


def _configure(**kwargs: Any) -> None:
    context.configure(
        target_metadata=metadata,
        include_name=_include_name,
        render_as_batch=True,
        compare_type=True,
        **kwargs,
    )


def run_offline() -> None:
    url = config.attributes["url"]
    pg = is_postgres(url)
    _configure(
        url=url,
        literal_binds=True,
        version_table_schema=schema if pg else None,
        dialect_opts={"paramstyle": "named"},
    )
    with context.begin_transaction():
        if pg:
            context.execute(CreateSchema(schema, if_not_exists=True))
            context.execute(f"SET search_path TO {schema}")
        context.run_migrations()


def run_online() -> None:
    connection = config.attributes["connection"]
    pg = connection.dialect.name == "postgresql"
    if pg:
        connection.execute(CreateSchema(schema, if_not_exists=True))
        connection.execute(set_local_search_path(schema))
        connection = connection.execution_options(schema_translate_map={None: schema})
    _configure(connection=connection, version_table_schema=schema if pg else None)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    run_offline()
else:
    run_online()
