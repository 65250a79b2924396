"""Enqueue from Django code, in the request's transaction.

:func:`enqueue` runs on Django's own connection (``django.db.connections[alias]``), so
the job is part of whatever ``transaction.atomic()`` block is open, nested savepoints
included: the block commits, the job is there; it rolls back (or the savepoint does), no
job. Outside any block, Django's autocommit applies: the enqueue commits by itself.

:func:`enqueue_on_commit` is the explicitly weaker alternative for a queue that lives
in another database: the job is enqueued (on taskq's own connection) after the outer
transaction commits, so a crash between the commit and the enqueue loses it.

:func:`get_taskq` is the process's ``taskq_sync.TaskQ`` (job lookups, ``get_result``,
``enqueue_on_commit``), made on first use from :mod:`taskq.contrib.django.conf`. Its
engine pools connections only when Django does (``CONN_MAX_AGE`` other than 0); with
Django's default (0) it keeps none open, so the test runner can drop its database.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from typing import Any

from django.db import connections, transaction
from sqlalchemy import create_engine
from sqlalchemy.pool import NullPool

import taskq_sync
from taskq.actor import ActorRef
from taskq.contrib.django.conf import database_alias, taskq_settings
from taskq.db.dialect import sync_url
from taskq_sync.handle import JobHandle

__all__ = [
    "close_taskq",
    "enqueue",
    "enqueue_many",
    "enqueue_on_commit",
    "get_taskq",
    "raw_connection",
]

_LOCK = threading.Lock()
_STATE: dict[str, Any] = {}


def get_taskq() -> taskq_sync.TaskQ:
    """This process's ``taskq_sync.TaskQ`` on the project's taskq database.

    Remade when the database changes under it (the test runner switches ``NAME`` to the
    test database).
    """
    settings = taskq_settings()
    url = str(settings.database_url)
    with _LOCK:
        current = _STATE.get("tq")
        if current is not None and _STATE.get("url") == url:
            return current  # type: ignore[no-any-return]
        if current is not None:
            current.close()
        alias = database_alias()
        pooled = connections[alias].settings_dict.get("CONN_MAX_AGE", 0) != 0
        engine = None
        if not pooled and not url.startswith("sqlite"):
            engine = create_engine(sync_url(url), poolclass=NullPool)
        tq = (
            taskq_sync.TaskQ(url, settings=settings)
            if engine is None
            else taskq_sync.TaskQ(engine=engine, settings=settings)
        )
        _STATE.update(tq=tq, url=url, engine=engine)
        return tq


def close_taskq() -> None:
    """Close the process's ``TaskQ`` (and its engine); the next use makes a new one."""
    with _LOCK:
        tq = _STATE.pop("tq", None)
        engine = _STATE.pop("engine", None)
        _STATE.pop("url", None)
    if tq is not None:
        tq.close()
    if engine is not None:
        engine.dispose()


def raw_connection(connection: Any) -> Any:
    """The psycopg connection under a Django database connection (opened if needed).

    Anything that is not Django's connection is returned unchanged (for
    ``connection=``'s own check).
    """
    # A DatabaseWrapper, or django.db.connection (a proxy to the default one).
    if hasattr(connection, "ensure_connection") and hasattr(connection, "settings_dict"):
        connection.ensure_connection()
        return connection.connection
    return connection


def enqueue(
    actor: ActorRef[Any, Any] | str,
    payload: Any,
    *,
    using: str | None = None,
    connection: Any = None,
    **options: Any,
) -> JobHandle[Any]:
    """Enqueue on Django's connection ``using`` (default: taskq's database alias) inside
    the open ``atomic()`` block, if any; ``options`` are ``TaskQ.enqueue``'s.

    ``connection``: a Django connection, a psycopg or SQLAlchemy connection to use instead.
    """
    from taskq.contrib.django.testing import immediate_mode, run_now

    if immediate_mode():
        return run_now(actor, payload)  # type: ignore[return-value]
    alias = using or database_alias()
    conn = connection if connection is not None else connections[alias]
    with transaction.atomic(using=alias, savepoint=False):
        return get_taskq().enqueue(actor, payload, connection=raw_connection(conn), **options)


def enqueue_many(
    items: Sequence[Any], *, using: str | None = None, connection: Any = None
) -> Sequence[JobHandle[Any]]:
    """:func:`enqueue` for many jobs at once (``TaskQ.enqueue_many``'s items)."""
    alias = using or database_alias()
    conn = connection if connection is not None else connections[alias]
    with transaction.atomic(using=alias, savepoint=False):
        return get_taskq().enqueue_many(items, connection=raw_connection(conn))


def enqueue_on_commit(
    actor: ActorRef[Any, Any] | str,
    payload: Any,
    *,
    using: str | None = None,
    **options: Any,
) -> None:
    """Enqueue on taskq's own connection once Django's transaction on ``using`` commits.

    Weaker than :func:`enqueue`: the job is not part of the transaction (a crash between
    the commit and the enqueue loses it). For a taskq database other than the app's.
    Outside a transaction it enqueues at once, as ``on_commit`` does.
    """
    extra: Mapping[str, Any] = dict(options)
    transaction.on_commit(
        lambda: get_taskq().enqueue(actor, payload, **extra), using=using or "default"
    )
