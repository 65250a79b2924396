"""taskq uses other libraries through their public APIs only.

Outside ``taskq/_compat`` (one module per library, each version-guarded with a public
fallback; see ``tests/unit/test_compat.py``), no module in ``src/`` imports another
package's underscore module or name, or reads an underscore attribute that taskq does not
define itself (``obj._x``, ``getattr(obj, "_x")``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ROOT / "src"
COMPAT = SOURCES / "taskq" / "_compat"

STDLIB_PUBLIC = {"os._exit", "sys._getframe"}
"""Underscore names the standard library documents as public API."""


def _modules() -> Iterator[Path]:
    for path in sorted(SOURCES.rglob("*.py")):
        if not path.is_relative_to(COMPAT):
            yield path


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _own_names(trees: list[ast.Module]) -> set[str]:
    """Every underscore name taskq defines: functions, classes, module-level and class
    attributes, attributes set on ``self``/``cls``, ``__slots__`` entries, modules."""
    names = {p.stem for p in SOURCES.rglob("_*.py")}
    for tree in trees:
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
                names.add(node.id)
            elif isinstance(node, ast.arg):
                names.add(node.arg)
            elif (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and isinstance(node.value, ast.Name)
                and node.value.id in {"self", "cls"}
            ):
                names.add(node.attr)
            elif isinstance(node, ast.alias):
                names.add(node.asname or node.name.split(".")[0])
            elif (
                isinstance(node, ast.Constant)
                and isinstance(node.value, str)
                and node.value.isidentifier()  # __slots__ entries, _HELD_ATTRIBUTE-like names
            ):
                names.add(node.value)
    return names


def _violations(path: Path, tree: ast.Module, own: set[str]) -> Iterator[str]:
    where = path.relative_to(ROOT)
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            package = node.module.split(".")[0]
            if package in {"taskq", "taskq_sync"}:
                continue
            if any(_private(part) for part in node.module.split(".")):
                yield f"{where}:{node.lineno}: from {node.module} import"
            for alias in node.names:
                if _private(alias.name):
                    yield f"{where}:{node.lineno}: from {node.module} import {alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] not in {"taskq", "taskq_sync"} and any(map(_private, parts)):
                    yield f"{where}:{node.lineno}: import {alias.name}"
        elif isinstance(node, ast.Attribute) and _private(node.attr):
            if isinstance(node.value, ast.Name):
                dotted = f"{node.value.id}.{node.attr}"
                if node.value.id in {"self", "cls"} or dotted in STDLIB_PUBLIC:
                    continue
            if node.attr not in own:
                yield f"{where}:{node.lineno}: .{node.attr}"
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in {"getattr", "setattr", "hasattr", "delattr"}
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
            and _private(node.args[1].value)
            and node.args[1].value not in own
        ):
            yield f"{where}:{node.lineno}: {node.func.id}(..., {node.args[1].value!r})"


def test_no_module_outside_compat_reaches_into_another_librarys_private_names() -> None:
    trees = {path: ast.parse(path.read_text()) for path in _modules()}
    own = _own_names(list(trees.values()))
    found = [v for path, tree in trees.items() for v in _violations(path, tree, own)]
    assert found == []


def test_the_check_finds_what_it_is_for() -> None:
    sample = ast.parse(
        "from redis._parsers import resp2\n"
        "import redis._parsers.resp3\n"
        "from aiosqlite.core import _connection_worker_thread\n"
        "conn._writer.write(b'x')\n"
        "getattr(conn, '_sock', None)\n"
        "self._mine = 1\n"
        "os._exit(0)\n"
    )
    found = list(_violations(ROOT / "src" / "x.py", sample, own={"_mine"}))
    assert len(found) == 5, found
    assert any("._writer" in v for v in found)
    assert any("'_sock'" in v for v in found)
