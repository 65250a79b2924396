"""taskq in Flask: ``TaskQ(app)`` or ``TaskQ()`` + ``init_app(app)``, Flask's conventions.

* The database is ``TASKQ_DATABASE_URL`` from ``app.config``, else
  ``SQLALCHEMY_DATABASE_URI``; with Flask-SQLAlchemy (``TaskQ(app, db=db)``) taskq uses
  ``db.engine`` itself (the same pool; taskq's schema applied to its own statements).
  Other ``TASKQ_*`` keys of ``app.config`` are taskq's settings (``TASKQ_REDIS_URL``...).
* :meth:`TaskQ.enqueue` joins ``db.session``'s transaction: ``db.session.commit()``
  commits the row and the job together, ``rollback()`` (or an exception that Flask-SQLAlchemy
  rolls back at teardown) leaves neither. Without ``db`` it enqueues on its own connection.
* The ``taskq_sync.TaskQ`` of each app lives in ``app.extensions["taskq"]``; at the end of
  each app context the connections taskq keeps idle for enqueues are handed back when
  the context failed (their state is then unknown); :meth:`TaskQ.close` disposes of all.
* :func:`too_many_requests` turns a rate-limit denial into a 429 with ``Retry-After``;
  :meth:`TaskQ.acquire_rate_limit` takes from a bucket with the app's settings.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from flask import Flask, Response, current_app

import taskq_sync
from taskq.actor import ActorRef
from taskq.contrib.http import TOO_MANY_REQUESTS, retry_after_header
from taskq.ratelimit.decision import RateLimitDecision
from taskq.ratelimit.refs import KeyedRateLimitRef
from taskq.settings import TaskQSettings
from taskq_sync.handle import JobHandle
from taskq_sync.ratelimit.registry import registry

__all__ = ["TaskQ", "too_many_requests"]

_KEY = "taskq"


def too_many_requests(decision: RateLimitDecision, body: str = "Too Many Requests") -> Response:
    """A 429 response with ``Retry-After`` (whole seconds) for a denied ``decision``."""
    return Response(body, status=TOO_MANY_REQUESTS, headers=retry_after_header(decision))


class _AppState:
    """What the extension keeps per app (``app.extensions["taskq"]``)."""

    def __init__(self, settings: TaskQSettings, db: Any) -> None:
        self.settings = settings
        self.db = db
        self.tq: taskq_sync.TaskQ | None = None

    def client(self) -> taskq_sync.TaskQ:
        if self.tq is None:
            if self.db is not None:
                self.tq = taskq_sync.TaskQ(engine=self.db.engine, settings=self.settings)
            else:
                self.tq = taskq_sync.TaskQ(self.settings.database_url, settings=self.settings)
        return self.tq


def _settings(app: Flask) -> TaskQSettings:
    raw: dict[str, Any] = {}
    for name in TaskQSettings.model_fields:
        value = app.config.get(f"TASKQ_{name.upper()}")
        if value is not None:
            raw[name] = value
    if not raw.get("database_url"):
        uri = app.config.get("SQLALCHEMY_DATABASE_URI")
        if uri:
            raw["database_url"] = str(uri)
    return TaskQSettings.load(**raw)


class TaskQ:
    """The Flask extension. ``db``: a Flask-SQLAlchemy ``SQLAlchemy`` whose session
    transaction enqueues join."""

    def __init__(self, app: Flask | None = None, *, db: Any = None) -> None:
        self.db = db
        if app is not None:
            self.init_app(app)

    def init_app(self, app: Flask, *, db: Any = None) -> None:
        """Set the extension up on ``app`` (``app.extensions["taskq"]``, a teardown)."""
        app.extensions[_KEY] = _AppState(_settings(app), db if db is not None else self.db)
        app.teardown_appcontext(self._teardown)

    @staticmethod
    def _state(app: Flask | None = None) -> _AppState:
        target = app if app is not None else current_app
        try:
            state: _AppState = target.extensions[_KEY]
        except KeyError:
            raise RuntimeError(
                "taskq is not set up on this app: call TaskQ(app) or init_app(app)"
            ) from None
        return state

    @staticmethod
    def _teardown(exc: BaseException | None) -> None:
        state = current_app.extensions.get(_KEY)
        if exc is not None and state is not None and state.tq is not None:
            state.tq.backend.held.drop_idle()

    @property
    def tq(self) -> taskq_sync.TaskQ:
        """The current app's ``taskq_sync.TaskQ`` (jobs, queues, workers...)."""
        return self._state().client()

    def _connection(self) -> Any:
        db = self._state().db
        return None if db is None else db.session.connection()

    def enqueue(
        self, actor: ActorRef[Any, Any] | str, payload: Any, **options: Any
    ) -> JobHandle[Any]:
        """Enqueue in ``db.session``'s transaction (see the module); ``TaskQ.enqueue``'s options."""
        return self.tq.enqueue(actor, payload, connection=self._connection(), **options)

    def enqueue_many(self, items: Sequence[Any]) -> Sequence[JobHandle[Any]]:
        """``TaskQ.enqueue_many`` in ``db.session``'s transaction."""
        return self.tq.enqueue_many(items, connection=self._connection())

    def acquire_rate_limit(
        self, limit: str | KeyedRateLimitRef[Any], *, key: str | None = None, count: float = 1.0
    ) -> RateLimitDecision:
        """Take from ``limit`` (a name, or a keyed ref with ``key=``) with the app's
        settings (``TASKQ_REDIS_URL``) and engine (Postgres-backed buckets);
        :func:`too_many_requests` a denial."""
        state = self._state()
        with registry.acquire(
            limit, key=key, count=count, pg_pool=state.client().engine, settings=state.settings
        ) as decision:
            return decision

    def close(self, app: Flask | None = None) -> None:
        """Close the app's ``TaskQ`` (its held connections; its engine if taskq made it)."""
        state = self._state(app)
        if state.tq is not None:
            state.tq.close()
            state.tq = None
