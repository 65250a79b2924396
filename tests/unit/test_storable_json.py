"""``taskq.storable_json``: which JSON documents every engine can store, and where not."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from pydantic_core import to_json

from taskq.storable_json import (
    describe,
    first_unstorable,
    may_be_unstorable,
    storable_text,
    unstorable_error,
    unstorable_path,
)

_text = st.text().filter(lambda t: "\x00" not in t)
_storable: st.SearchStrategy[Any] = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | _text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(_text, children, max_size=4),
    max_leaves=20,
)
_bad = st.sampled_from([float("inf"), float("-inf"), float("nan"), "x\x00y"])


@given(_storable)
def test_a_storable_document_has_no_error(document: Any) -> None:
    assert unstorable_error(document) is None
    assert unstorable_path(document) is None
    assert first_unstorable([document, document]) is None
    # the fast search may fire on words inside strings; the walk then clears them
    assert unstorable_error(["NaN", {"Infinity": "\\u0000"}, document]) is None


@given(_storable, _bad, st.data())
def test_a_bad_value_is_found_where_it_was_put(document: Any, bad: Any, data: Any) -> None:
    """Put one bad value at a random place of a storable document: it is found, there."""
    root: dict[str, Any] = {"root": document}
    parent: Any = root
    key: str | int = "root"
    path: list[str | int] = [key]
    while isinstance(parent[key], (list, dict)) and parent[key] and data.draw(st.booleans()):
        node = parent[key]
        keys = sorted(node) if isinstance(node, dict) else list(range(len(node)))
        parent, key = node, data.draw(st.sampled_from(keys))
        path.append(key)
    parent[key] = bad
    error = unstorable_error(root)
    assert error is not None
    assert error["loc"] == tuple(path)
    assert error["type"] == ("string_nul" if isinstance(bad, str) else "finite_number")
    assert may_be_unstorable(to_json(root))


def test_a_key_with_a_nul_is_reported_at_its_place() -> None:
    error = unstorable_error({"ok": 1, "k\x00": [1]})
    assert error is not None
    assert (error["type"], error["loc"], error["input"]) == ("string_nul", ("k\x00",), "k\x00")


def test_first_unstorable_names_the_first_bad_document_and_uses_given_texts() -> None:
    documents = [{"a": 1}, {"b": "fine"}, {"c": [float("nan")]}, {"d": float("inf")}]
    raws = [to_json(d) for d in documents]
    found = first_unstorable(documents, raws)
    assert found is not None
    assert (found[0], found[1]["loc"]) == (2, ("c", 0))
    # the texts given are what is searched: texts without the tokens mean "none"
    assert first_unstorable(documents, [b"{}"] * 4) is None


@pytest.mark.parametrize(
    ("document", "shown"),
    [
        ({"x": float("inf")}, "inf at x: Input should be a finite number"),
        (float("nan"), "nan at the document itself"),
        ({"s": ["a\x00"]}, "'a\\x00' at s.0: String should not contain a NUL character"),
    ],
)
def test_describe(document: Any, shown: str) -> None:
    error = unstorable_error(document)
    assert error is not None
    assert describe(error).startswith(shown)


def test_storable_text_writes_nul_as_an_escape() -> None:
    assert storable_text("a\x00b\x00") == "a\\x00b\\x00"
    text = "no nul here"
    assert storable_text(text) is text
