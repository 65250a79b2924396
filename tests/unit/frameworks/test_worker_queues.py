"""A worker claims its actors' queues unless told otherwise, and warns of one it misses."""

from __future__ import annotations

import structlog
from pydantic import BaseModel

from taskq import actor
from taskq.settings import WorkerSettings
from taskq.worker.queues import claimed_queues


class P(BaseModel):
    n: int


@actor(name="t_wq_flask", queue="flask")
async def on_flask(payload: P) -> None: ...


@actor(name="t_wq_mail", queue="mail")
async def on_mail(payload: P) -> None: ...


@actor(name="t_wq_default")
async def on_default(payload: P) -> None: ...


ACTORS = {ref.name: ref for ref in (on_flask, on_mail, on_default)}


def test_without_queues_the_worker_claims_its_actors_queues() -> None:
    settings = WorkerSettings.load(database_url="sqlite:///x.db")
    assert claimed_queues(settings, {"t_wq_flask": on_flask}).queues == ("flask",)
    assert claimed_queues(settings, ACTORS).queues == ("default", "flask", "mail")


def test_an_explicit_list_is_kept_and_each_missed_actor_is_warned() -> None:
    settings = WorkerSettings.load(database_url="sqlite:///x.db", queues=("default", "mail"))
    with structlog.testing.capture_logs() as logs:
        assert claimed_queues(settings, ACTORS).queues == ("default", "mail")
    warned = [e for e in logs if e["log_level"] == "warning"]
    assert [(e["actor"], e["queue"]) for e in warned] == [("t_wq_flask", "flask")]


def test_an_explicit_list_covering_every_actor_warns_nothing() -> None:
    settings = WorkerSettings.load(database_url="sqlite:///x.db", queues=("flask",))
    with structlog.testing.capture_logs() as logs:
        claimed_queues(settings, {"t_wq_flask": on_flask})
    assert [e for e in logs if e["log_level"] == "warning"] == []
