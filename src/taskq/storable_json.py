"""Storable JSON: what every engine can keep of a job's payload, result and progress.

A job's documents are stored as JSON: ``jsonb`` on Postgres, JSON text on SQLite, Python
objects in the in-memory backend. Two kinds of value pass pydantic but not all three:

* an infinite or NaN float: pydantic's JSON-mode dump keeps ``float("inf")`` as a float
  and ``pydantic_core.to_json`` writes the bare token ``Infinity`` (or ``NaN``), which is
  not JSON; ``jsonb`` refuses it;
* a NUL character (``"\\x00"``) in a string or a key: ``jsonb`` cannot hold ``\\u0000``.

SQLite and memory keep both, so the same payload would enqueue on one engine and raise a
driver error on another, and a result or progress update refused by Postgres would fail
the worker's whole batch of outcomes with it. taskq refuses such documents everywhere,
before anything is written, with an error that says where the value is. A model that
must carry one can declare the field as ``str`` (or ``float | None``), or encode it.

The check runs on the JSON text: a search for the three tokens (``Infinity``, ``NaN``,
``\\u0000``), a C-speed substring search. A bulk batch searches the texts it stores, one
search over the 1,000 joined; a single payload is dumped once more to search it (about
0.5 µs for a small one, against some 250 µs for the enqueue's round trip). Only when one is
found is the document walked, to tell a real offending value from the same letters
inside a string, and to name its place.

Text columns (an attempt's error and traceback) cannot hold NUL either, on Postgres:
:func:`storable_text` writes it as the four characters ``\\x00``.

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic_core import to_json

__all__ = [
    "describe",
    "first_unstorable",
    "may_be_unstorable",
    "storable_text",
    "unstorable_error",
    "unstorable_path",
]

Path = tuple[str | int, ...]

_NUL = "\x00"


def may_be_unstorable(raw: bytes) -> bool:
    """Whether the JSON text ``raw`` contains ``Infinity``, ``NaN`` or ``\\u0000``
    anywhere (inside a string too): ``False`` means every value in it is storable."""
    return b"Infinity" in raw or b"NaN" in raw or b"\\u0000" in raw


def unstorable_path(document: Any) -> tuple[Path, str] | None:
    """Where the first unstorable value of a JSON-mode ``document`` is (the keys and
    indexes leading to it, ``()`` for the document itself) and its error type
    (``"finite_number"`` or ``"string_nul"``), or ``None`` if it has none. A key with
    a NUL is reported at the path of its value."""
    if isinstance(document, float):
        return None if math.isfinite(document) else ((), "finite_number")
    if isinstance(document, str):
        return ((), "string_nul") if _NUL in document else None
    if isinstance(document, dict):
        items: Any = document.items()
    elif isinstance(document, (list, tuple)):
        items = enumerate(document)
    else:
        return None
    for key, value in items:
        if isinstance(key, str) and _NUL in key:
            return (key,), "string_nul"
        found = unstorable_path(value)
        if found is not None:
            return (key, *found[0]), found[1]
    return None


def unstorable_error(document: Any) -> dict[str, Any] | None:
    """The validation error, shaped as one of pydantic's ``errors()`` entries, for the
    first unstorable value of ``document`` (:func:`unstorable_path`); ``None`` if it has
    none. Cheap when there is none: the document is dumped to JSON text and searched
    (:func:`may_be_unstorable`) before it is walked."""
    if not may_be_unstorable(to_json(document)):
        return None
    return _error_at(document)


def first_unstorable(
    documents: Sequence[Any], raws: Sequence[bytes] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """Index and error (:func:`unstorable_error`) of the first of ``documents`` with an
    unstorable value, or ``None`` if none has one.

    ``raws``: their JSON texts, in the same order, when the caller has made them (then
    nothing is dumped again). Either way one search over the whole text when none has.
    """
    joined = to_json(documents) if raws is None else b"".join(raws)
    if not may_be_unstorable(joined):
        return None
    for index, document in enumerate(documents):
        error = _error_at(document)
        if error is not None:
            return index, error
    return None


def storable_text(text: str) -> str:
    """``text`` with each NUL character written as ``\\x00`` (a Postgres ``text`` column
    cannot hold NUL); the same object when it has none."""
    return text.replace(_NUL, "\\x00") if _NUL in text else text


_MESSAGES = {
    "finite_number": "Input should be a finite number: JSON, which stores the job, has no "
    "Infinity or NaN",
    "string_nul": "String should not contain a NUL character: the database cannot store it",
}


def _error_at(document: Any) -> dict[str, Any] | None:
    found = unstorable_path(document)
    if found is None:
        return None
    path, kind = found
    value: Any = document
    for key in path:
        value = value[key]
    if kind == "string_nul" and not (isinstance(value, str) and _NUL in value):
        value = path[-1]  # the key holds the NUL
    return {"type": kind, "loc": path, "msg": _MESSAGES[kind], "input": value}


def describe(error: dict[str, Any]) -> str:
    """One line for an error of :func:`unstorable_error`: what and where."""
    where = ".".join(map(str, error["loc"])) or "the document itself"
    return f"{error['input']!r} at {where}: {error['msg']}"
