"""Driver errors become taskq's at one boundary (``taskq.db.dialect.translate_error``):
a missing table is ``SchemaNotReady``, a store out of reach is ``StoreUnavailable``, and a
statement the store refused stays the driver's error."""

from __future__ import annotations

import sqlite3

import psycopg
import pytest
from psycopg import errors as pg_errors
from sqlalchemy.exc import DBAPIError

from taskq.db.dialect import translate_error
from taskq.exceptions import SchemaNotReady, StoreUnavailable, TaskQError


def _wrapped(orig: Exception, *, invalidated: bool = False) -> DBAPIError:
    return DBAPIError("SELECT 1", {}, orig, connection_invalidated=invalidated)


@pytest.mark.parametrize(
    "orig",
    [
        psycopg.OperationalError("connection refused"),  # no SQLSTATE: the connect failed
        pg_errors.ConnectionFailure("connection failure"),  # 08006
        pg_errors.AdminShutdown("terminating connection due to administrator command"),
        pg_errors.CannotConnectNow("the database system is starting up"),
        sqlite3.OperationalError("unable to open database file"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_store_out_of_reach_is_store_unavailable(orig: Exception) -> None:
    wrapped = _wrapped(orig)
    translated = translate_error(wrapped)
    assert isinstance(translated, StoreUnavailable)
    assert isinstance(translated, TaskQError)
    assert isinstance(translated, ConnectionError)  # what retry loops catching OSError see
    assert translated.__cause__ is wrapped
    assert str(orig) in translated.reason


def test_a_connection_sqlalchemy_invalidated_is_store_unavailable() -> None:
    translated = translate_error(_wrapped(pg_errors.QueryCanceled("x"), invalidated=True))
    assert isinstance(translated, StoreUnavailable)


def test_a_missing_table_is_schema_not_ready() -> None:
    translated = translate_error(_wrapped(sqlite3.OperationalError("no such table: jobs")))
    assert isinstance(translated, SchemaNotReady)


@pytest.mark.parametrize(
    "orig",
    [
        pg_errors.CheckViolation("new row violates check constraint"),
        pg_errors.QueryCanceled("canceling statement due to statement timeout"),
        sqlite3.OperationalError("database is locked"),
    ],
    ids=lambda e: type(e).__name__,
)
def test_a_refused_statement_stays_the_drivers_error(orig: Exception) -> None:
    wrapped = _wrapped(orig)
    assert translate_error(wrapped) is wrapped
