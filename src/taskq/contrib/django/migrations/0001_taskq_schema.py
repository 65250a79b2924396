"""Create taskq's tables (Alembic ``head``); reversed, drop them."""

from __future__ import annotations

from typing import ClassVar

from django.db import migrations

from taskq.contrib.django.schema import create_tables, drop_tables


class Migration(migrations.Migration):
    """taskq's schema, through taskq's own migrations (on their own connection)."""

    atomic = False
    initial = True
    dependencies: ClassVar[list[tuple[str, str]]] = []
    operations: ClassVar[list[migrations.operations.base.Operation]] = [
        migrations.RunPython(create_tables, drop_tables),
    ]
