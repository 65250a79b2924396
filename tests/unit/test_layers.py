"""Imports point down the layers: production code never imports test helpers, and the
worker and the examples never import the CLI (which sits above them)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from taskq.worker.__main__ import main as worker_module_main

SRC = Path(__file__).resolve().parents[2] / "src" / "taskq"


def _imports(path: Path) -> set[str]:
    """Every module ``path`` imports, at module level or inside a function."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _offenders(folder: Path, forbidden: str, *, skip: Path | None = None) -> list[str]:
    return [
        f"{path.relative_to(SRC)} imports {name}"
        for path in sorted(folder.rglob("*.py"))
        if skip is None or not path.is_relative_to(skip)
        for name in sorted(_imports(path))
        if name == forbidden or name.startswith(forbidden + ".")
    ]


def test_production_code_never_imports_the_test_helpers() -> None:
    assert _offenders(SRC, "taskq.testing", skip=SRC / "testing") == []


def test_the_worker_and_the_examples_never_import_the_cli() -> None:
    assert _offenders(SRC / "worker", "taskq.cli") == []
    assert _offenders(SRC / "examples", "taskq.cli") == []


def test_the_clock_protocol_is_still_where_the_testing_page_names_it() -> None:
    from taskq.clock import Clock, SystemClock
    from taskq.testing import clock as testing_clock

    assert testing_clock.Clock is Clock
    assert testing_clock.SystemClock is SystemClock
    assert isinstance(testing_clock.FakeClock(), Clock)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["no-colon"], "expected MODULE:ATTR"),
        (["taskq_no_such_module_anywhere:registry"], "cannot import"),
        (["taskq.settings:no_such_attribute"], "has no attribute"),
    ],
)
def test_python_m_taskq_worker_reports_a_bad_target_as_a_usage_error(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        worker_module_main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
