"""``@actor``'s options are declared once, as :class:`ActorRef` fields: the option names,
the keyword overload of ``actor`` and the options ``_check_options`` validates agree."""

from __future__ import annotations

import importlib
import inspect
import typing

from taskq.actor import ActorRef, actor

# ``taskq.actor`` the module (``taskq`` re-exports the decorator under the same name)
actor_module = importlib.import_module("taskq.actor")


def _overload_keywords() -> set[str]:
    keywords: set[str] = set()
    for overload in typing.get_overloads(actor):
        params = inspect.signature(overload).parameters.values()
        keywords |= {p.name for p in params if p.kind is inspect.Parameter.KEYWORD_ONLY}
    return keywords


def test_the_option_names_are_the_actor_ref_fields_given_as_options() -> None:
    names = actor_module._OPTION_NAMES
    assert "queue" in names
    assert "priority" in names
    assert not names & actor_module._DERIVED_FIELDS
    assert names | actor_module._DERIVED_FIELDS == set(ActorRef.__dataclass_fields__)


def test_the_keyword_overload_names_every_option() -> None:
    assert _overload_keywords() == actor_module._OPTION_NAMES


def test_check_options_returns_every_option_but_the_name() -> None:
    def fail(param: str, message: str, exc: type[Exception] = TypeError) -> Exception:
        return exc(f"{param}: {message}")

    checked = actor_module._check_options({}, fail)
    assert set(checked) == actor_module._OPTION_NAMES - {"name"}
