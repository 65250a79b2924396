"""What a worker process runs: the actors at ``MODULE:ATTR``, with settings from the
environment and the command line.

Shared by the two ways to start a worker, ``taskq worker`` (the Click CLI) and
``python -m taskq.worker`` (:mod:`taskq.worker.__main__`), which each report a
:class:`TargetError` or a :class:`~taskq.exceptions.ConfigurationError` in their own way.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from taskq.settings import WorkerSettings

__all__ = ["TargetError", "load_target", "worker_settings"]


class TargetError(ValueError):
    """``MODULE:ATTR`` is malformed, or names a module or attribute that cannot be loaded."""


def load_target(target: str) -> Any:
    """Import ``MODULE:ATTR`` (the current directory first on the path) and return the
    attribute: a dict or list of actors, or one actor."""
    module_name, sep, attr = target.partition(":")
    if not sep or not module_name or not attr:
        raise TargetError("expected MODULE:ATTR, e.g. myapp.actors:registry")
    if "" not in sys.path:
        sys.path.insert(0, "")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise TargetError(f"cannot import {module_name!r}: {exc}") from None
    try:
        return getattr(module, attr)
    except AttributeError:
        raise TargetError(f"{module_name!r} has no attribute {attr!r}") from None


def worker_settings(
    *,
    database_url: str | None = None,
    schema_name: str | None = None,
    queues: tuple[str, ...] = (),
    concurrency: int | None = None,
) -> WorkerSettings:
    """``WorkerSettings.load()`` with what the command line gave overriding the environment."""
    overrides: dict[str, Any] = {}
    if database_url is not None:
        overrides["database_url"] = database_url
    if schema_name is not None:
        overrides["schema_name"] = schema_name
    if queues:
        overrides["queues"] = queues
    if concurrency is not None:
        overrides["max_concurrency"] = concurrency
    return WorkerSettings.load(**overrides)
