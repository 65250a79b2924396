"""Settings are read once, where they are loaded: the paths deep inside the library take
the settings they were given and never read the environment themselves."""

from __future__ import annotations

from typing import Any, NoReturn
from uuid import uuid4

import pytest

from taskq.handle import JobHandle
from taskq.ratelimit import _redis_utils as rru
from taskq.settings import TaskQSettings
from taskq.testing.in_memory import InMemoryBackend


@pytest.fixture
def no_env_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if anything calls ``TaskQSettings.load()``."""

    def load(*_args: Any, **_kwargs: Any) -> NoReturn:
        raise AssertionError("TaskQSettings.load() called deep inside the library")

    monkeypatch.setattr(TaskQSettings, "load", load)


def test_the_redis_fallback_takes_the_settings_it_was_given(
    monkeypatch: pytest.MonkeyPatch, settings: TaskQSettings
) -> None:
    engine: Any = object()
    off = settings.model_copy(update={"rate_limit_pg_fallback_enabled": False})
    on = settings.model_copy(update={"rate_limit_pg_fallback_enabled": True})
    monkeypatch.setattr(
        TaskQSettings, "load", lambda *a, **k: pytest.fail("the environment was read")
    )
    assert rru.fallback_engine("b", OSError("down"), engine, off) is None
    assert rru.fallback_engine("b", OSError("down"), engine, on) is engine
    assert rru.fallback_engine("b", OSError("down"), None, on) is None  # no pg_pool


def test_without_settings_the_fallback_has_its_default_and_the_environment_is_not_read(
    monkeypatch: pytest.MonkeyPatch, no_env_reads: None
) -> None:
    monkeypatch.setenv("TASKQ_RATE_LIMIT_PG_FALLBACK_ENABLED", "false")
    engine: Any = object()
    assert rru.fallback_engine("b", OSError("down"), engine, None) is engine


async def test_progress_stream_takes_the_redis_url_from_the_clients_settings(
    no_env_reads: None,
) -> None:
    handle: JobHandle[Any] = JobHandle(InMemoryBackend(), uuid4())
    with pytest.raises(RuntimeError, match="needs Redis"):
        async for _ in handle.progress_stream():
            pass
