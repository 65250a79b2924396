"""What the operations commands (``jobs``, ``workers``, ``ratelimit``, queue pause) share:
strict durations, the filter options, confirmation of destructive actions, tables sized
to the terminal, progress bars, and the exit codes.

Exit codes: 0 done; 1 refused (the exception's fields are printed); 2 usage (Click's
own); 3 the database is unreachable or its schema is not migrated (the message names
the command that fixes it).
"""

from __future__ import annotations

import re
import shutil
import sys
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from uuid import UUID

import click
from sqlalchemy.ext.asyncio import AsyncEngine

from taskq.cli.options import DatabaseUnavailable, run_db
from taskq.exceptions import TaskQError
from taskq.job_filter import JobFilter
from taskq.settings import TaskQSettings

__all__ = [
    "DatabaseUnavailable",
    "Refused",
    "confirm",
    "filter_from_options",
    "filter_options",
    "parse_duration",
    "progress",
    "run_ops",
    "table",
]

F = TypeVar("F", bound=Callable[..., Any])
T = TypeVar("T")

_DURATION = re.compile(r"(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?")
_UNITS = ("weeks", "days", "hours", "minutes", "seconds")


class Refused(click.ClickException):
    """The library refused the action (exit 1); the message carries its fields."""

    exit_code = 1

    @classmethod
    def of(cls, exc: BaseException) -> Refused:
        """A refusal from ``exc`` with its machine-readable fields appended."""
        fields = {k: v for k, v in vars(exc).items() if not k.startswith("_") and k != "args"}
        detail = " ".join(f"{k}={v}" for k, v in sorted(fields.items()))
        name = type(exc).__name__
        return cls(f"{name}: {exc}" + (f" [{detail}]" if detail else ""))


def parse_duration(text: str, *, param_hint: str = "--older-than") -> timedelta:
    """``7d``, ``90m``, ``1h30m``, ``2w``: units w, d, h, m, s, each at most once, in that
    order, integers only. Anything else is a usage error (no guessing at ``7`` or ``1.5h``)."""
    match = _DURATION.fullmatch(text.strip()) if text else None
    if match is None or not any(match.groups()):
        raise click.BadParameter(
            f"{text!r} is not a duration: use integers with units w, d, h, m, s "
            "(for example 7d, 90m, 1h30m)",
            param_hint=param_hint,
        )
    return timedelta(**{u: int(v) for u, v in zip(_UNITS, match.groups(), strict=True) if v})


def _time(value: str | None, hint: str) -> datetime | None:
    """An ISO 8601 time (naive means UTC) or a duration ago (``2h`` = two hours ago)."""
    if value is None:
        return None
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        return datetime.now(UTC) - parse_duration(value, param_hint=hint)
    return parsed if parsed.tzinfo is not None else parsed.replace(tzinfo=UTC)


def filter_options(fn: F) -> F:
    """The :class:`~taskq.job_filter.JobFilter` fields as options (repeatable where the
    filter takes several values)."""
    opts = [
        click.option("--status", multiple=True, help="Job status (repeatable: any of them)."),
        click.option("--actor", multiple=True, help="Actor name (repeatable)."),
        click.option("--queue", multiple=True, help="Queue name (repeatable)."),
        click.option(
            "--tag", "tags", multiple=True, help="Tag the job carries (repeatable: all of them)."
        ),
        click.option("--identity-key", default=None, help="The job's identity_key."),
        click.option(
            "--parent", "parent_job_id", default=None, help="Parent job id (sub-jobs of it)."
        ),
        click.option(
            "--error-class", default=None, help="The job's error_class (e.g. CancelledForced)."
        ),
        click.option(
            "--waiting-on", default=None, help="What a parked job waits on (a bucket name)."
        ),
        click.option(
            "--waiting/--not-waiting",
            "waiting",
            default=None,
            help="Only jobs parked on a limit (state waiting) / only the others.",
        ),
        click.option("--created-after", default=None, help="ISO time or duration ago (2h)."),
        click.option("--created-before", default=None, help="ISO time or duration ago."),
        click.option("--finished-after", default=None, help="ISO time or duration ago."),
        click.option("--finished-before", default=None, help="ISO time or duration ago."),
    ]
    for opt in reversed(opts):
        fn = opt(fn)
    return fn


_FILTER_KEYS = (
    "status",
    "actor",
    "queue",
    "tags",
    "identity_key",
    "parent_job_id",
    "error_class",
    "waiting_on",
    "waiting",
    "created_after",
    "created_before",
    "finished_after",
    "finished_before",
)


def filter_from_options(options: dict[str, Any]) -> JobFilter:
    """Pop the filter options out of a command's ``options`` and build the filter; a bad
    value is a usage error naming the option."""
    raw = {k: options.pop(k) for k in _FILTER_KEYS}
    values: dict[str, Any] = {}
    for key in ("status", "actor", "queue", "tags"):
        if raw[key]:
            values[key] = list(raw[key])
    for key in ("identity_key", "parent_job_id", "error_class", "waiting_on", "waiting"):
        if raw[key] is not None:
            values[key] = raw[key]
    for key in ("created_after", "created_before", "finished_after", "finished_before"):
        values[key] = _time(raw[key], "--" + key.replace("_", "-"))
    try:
        return JobFilter(**values)
    except (ValueError, TypeError) as exc:
        raise click.BadParameter(str(exc)) from None


def job_id_argument(value: str) -> UUID:
    """A job id argument, or a usage error."""
    try:
        return UUID(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not a job id (a UUID)", param_hint="JOB_ID"
        ) from None


def confirm(question: str, *, yes: bool) -> None:
    """Ask before a destructive action: ``--yes`` skips the question; without a TTY and
    without ``--yes`` the command refuses (exit 1) instead of acting unasked."""
    if yes:
        return
    if not sys.stdin.isatty():
        raise Refused(f"{question} refused: not a terminal; pass --yes to confirm")
    if not click.confirm(question, default=False):
        raise Refused("aborted: nothing was changed")


@contextmanager
def progress(label: str, total: int) -> Iterator[Callable[[int], None] | None]:
    """An ``on_batch`` callback drawing a progress bar on a TTY (``None`` elsewhere)."""
    if not sys.stdout.isatty() or total <= 0:
        yield None
        return
    with click.progressbar(length=total, label=label, file=sys.stderr) as bar:
        done = 0

        def update(n: int) -> None:
            nonlocal done
            bar.update(max(n - done, 0))
            done = n

        yield update


def table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns; on a terminal the widest columns are cut (``…``) until a line
    fits. Output to a pipe or file is never cut, so ids piped to another command stay whole."""
    widths = [
        max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(header)
    ]
    width = (
        shutil.get_terminal_size((120, 24)).columns
        if sys.stdout.isatty()
        else sum(widths) * 2 + 2 * len(widths)
    )
    while sum(widths) + 2 * (len(widths) - 1) > width:
        widest = max(range(len(widths)), key=lambda i: widths[i])
        if widths[widest] <= 8:
            break
        widths[widest] -= 1

    def cell(text: str, w: int) -> str:
        return (text if len(text) <= w else text[: w - 1] + "…").ljust(w)

    return "\n".join(
        "  ".join(cell(c, w) for c, w in zip(line, widths, strict=True)).rstrip()
        for line in [header, *rows]
    )


def run_ops(settings: TaskQSettings, action: Callable[[AsyncEngine], Awaitable[T]]) -> T:
    """:func:`~taskq.cli.options.run_db` (exit 3 when the database is unreachable or not
    migrated), with the library's refusals turned into exit 1 and their fields."""
    try:
        return run_db(settings, action)
    except TaskQError as exc:
        raise Refused.of(exc) from None
