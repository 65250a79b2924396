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

Three more ways a document can fail, each refused here with a named place rather than
a serialiser's bare error: a lone surrogate (``"\\ud800"``: not UTF-8, so not JSON),
nesting deeper than pydantic's serialiser goes (:func:`too_deep_error`), and a document
larger than ``TASKQ_PAYLOAD_MAX_BYTES`` (:func:`too_large_error`). And one way the check
itself could be fooled: pydantic's JSON-mode dump turns an infinite or NaN float inside
an ``Any``-typed field into ``null`` (it keeps it in a ``float`` field), so a model with
such a field is also checked on its Python-mode dump (:func:`first_hidden_nonfinite`)
instead of being stored with ``null`` where the caller's number was.

Pure: the async and the generated sync code share it.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from pydantic_core import PydanticSerializationError, to_json

__all__ = [
    "describe",
    "document_size",
    "first_hidden_nonfinite",
    "first_unstorable",
    "may_be_unstorable",
    "storable_text",
    "too_deep_error",
    "too_large_error",
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
        if _NUL in document:
            return (), "string_nul"
        return ((), "string_surrogate") if _has_surrogate(document) else None
    if isinstance(document, dict):
        items: Any = document.items()
    elif isinstance(document, (list, tuple)):
        items = enumerate(document)
    else:
        return None
    for key, value in items:
        if isinstance(key, str) and _NUL in key:
            return (key,), "string_nul"
        if isinstance(key, str) and _has_surrogate(key):
            return (key,), "string_surrogate"
        found = unstorable_path(value)
        if found is not None:
            return (key, *found[0]), found[1]
    return None


def unstorable_error(document: Any) -> dict[str, Any] | None:
    """The validation error, shaped as one of pydantic's ``errors()`` entries, for the
    first unstorable value of ``document`` (:func:`unstorable_path`); ``None`` if it has
    none. Cheap when there is none: the document is dumped to JSON text and searched
    (:func:`may_be_unstorable`) before it is walked."""
    try:
        raw = to_json(document)
    except PydanticSerializationError:  # a lone surrogate: not UTF-8
        return _error_at(document) or _unserializable(document)
    if not may_be_unstorable(raw):
        return None
    return _error_at(document)


def document_size(document: Any) -> int:
    """Bytes of ``document``'s JSON text (as stored, before the database's own encoding)."""
    return len(to_json(document))


def first_unstorable(
    documents: Sequence[Any], raws: Sequence[bytes] | None = None
) -> tuple[int, dict[str, Any]] | None:
    """Index and error (:func:`unstorable_error`) of the first of ``documents`` with an
    unstorable value, or ``None`` if none has one.

    ``raws``: their JSON texts, in the same order, when the caller has made them (then
    nothing is dumped again). Either way one search over the whole text when none has.
    """
    try:
        joined = to_json(documents) if raws is None else b"".join(raws)
    except PydanticSerializationError:
        joined = b"NaN"  # a lone surrogate somewhere: walk them to find it
    if not may_be_unstorable(joined):
        return None
    for index, document in enumerate(documents):
        error = _error_at(document)
        if error is not None:
            return index, error
    return None


def first_hidden_nonfinite(documents: Sequence[Any]) -> tuple[int, dict[str, Any]] | None:
    """Like :func:`first_unstorable`, for Python-mode dumps (``model_dump()``): the
    infinite and NaN floats that the JSON-mode dump of an ``Any``-typed field turned into
    ``null``. One search over their JSON text when none has one."""
    try:
        joined = to_json(list(documents), inf_nan_mode="constants", serialize_unknown=True)
    except PydanticSerializationError:  # what the JSON-mode check reports first
        return None
    if b"Infinity" not in joined and b"NaN" not in joined:
        return None
    for index, document in enumerate(documents):
        found = unstorable_path(document)
        if found is not None and found[1] == "finite_number":
            return index, _error_at(document) or {}
    return None


def too_deep_error(loc: Path, exc: BaseException) -> dict[str, Any]:
    """The validation error of a value nested too deep to serialise, at ``loc``."""
    return {
        "type": "too_deep",
        "loc": loc,
        "msg": f"Value is nested too deep to store as JSON ({exc})",
        "input": "...",
    }


def too_large_error(size: int, limit: int) -> dict[str, Any]:
    """The validation error of a document over ``TASKQ_PAYLOAD_MAX_BYTES``."""
    return {
        "type": "too_large",
        "loc": (),
        "msg": f"Payload is {size} bytes of JSON; the limit is {limit} (TASKQ_PAYLOAD_MAX_BYTES)",
        "input": size,
    }


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _unserializable(document: Any) -> dict[str, Any]:
    return {
        "type": "unserializable",
        "loc": (),
        "msg": "Value cannot be written as JSON",
        "input": repr(document)[:200],
    }


def storable_text(text: str) -> str:
    """``text`` with each NUL character written as ``\\x00`` (a Postgres ``text`` column
    cannot hold NUL); the same object when it has none."""
    return text.replace(_NUL, "\\x00") if _NUL in text else text


_MESSAGES = {
    "finite_number": "Input should be a finite number: JSON, which stores the job, has no "
    "Infinity or NaN",
    "string_nul": "String should not contain a NUL character: the database cannot store it",
    "string_surrogate": "String should not contain a lone surrogate: it is not valid UTF-8, "
    "so not JSON",
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
    if kind == "string_surrogate" and not (isinstance(value, str) and _has_surrogate(value)):
        value = path[-1]
    return {"type": kind, "loc": path, "msg": _MESSAGES[kind], "input": value}


def describe(error: dict[str, Any]) -> str:
    """One line for an error of :func:`unstorable_error`: what and where."""
    where = ".".join(map(str, error["loc"])) or "the document itself"
    return f"{error['input']!r} at {where}: {error['msg']}"
