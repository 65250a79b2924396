"""The operations commands' conventions, without a database: strict durations, tables cut to
the terminal, confirmation on and off a TTY, and the progress callback."""

from __future__ import annotations

import io
import os
from datetime import timedelta

import click
import pytest

from taskq.cli import ops_support as support


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("7d", timedelta(days=7)),
        ("90m", timedelta(minutes=90)),
        ("1h30m", timedelta(hours=1, minutes=30)),
        ("2w", timedelta(weeks=2)),
        ("0s", timedelta(0)),
        ("1w2d3h4m5s", timedelta(weeks=1, days=2, hours=3, minutes=4, seconds=5)),
    ],
)
def test_durations(text: str, expected: timedelta) -> None:
    assert support.parse_duration(text) == expected


@pytest.mark.parametrize("text", ["", "7", "1.5h", "7x", "m", "30m1h", "1d1d", "-1d", "1 d", "d7"])
def test_anything_else_is_a_usage_error(text: str) -> None:
    with pytest.raises(click.BadParameter, match="is not a duration"):
        support.parse_duration(text)


class _Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_tables_are_cut_to_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback: os.terminal_size((30, 24)))
    monkeypatch.setattr("sys.stdout", _Tty())
    out = support.table(("A", "LONG"), [("x", "y" * 40), ("zz", "w")]).splitlines()
    assert all(len(line) <= 30 for line in out)
    assert out[1].endswith("…")
    assert out[2].split() == ["zz", "w"]


def test_tables_piped_are_never_cut(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("shutil.get_terminal_size", lambda fallback: os.terminal_size((30, 24)))
    monkeypatch.setattr("sys.stdout", io.StringIO())
    out = support.table(("A", "LONG"), [("x", "y" * 40), ("zz", "w")]).splitlines()
    assert out[1].split() == ["x", "y" * 40]


def test_confirm_refuses_without_a_tty_unless_yes(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("y\n"))
    support.confirm("go?", yes=True)  # --yes: no question asked
    with pytest.raises(support.Refused, match="not a terminal; pass --yes"):
        support.confirm("go?", yes=False)


def test_confirm_asks_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr("sys.stdin", Tty("n\n"))
    with pytest.raises(support.Refused, match="aborted: nothing was changed"):
        support.confirm("go?", yes=False)
    monkeypatch.setattr("sys.stdin", Tty("y\n"))
    support.confirm("go?", yes=False)


def test_progress_draws_only_on_a_tty(monkeypatch: pytest.MonkeyPatch) -> None:
    with support.progress("x", 10) as on_batch:
        assert on_batch is None

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    err = Tty()
    monkeypatch.setattr("sys.stdout", Tty())
    monkeypatch.setattr("sys.stderr", err)
    with support.progress("purging", 10) as on_batch:
        assert on_batch is not None
        on_batch(4)
        on_batch(10)
    assert "purging" in err.getvalue()
    assert "100%" in err.getvalue()
