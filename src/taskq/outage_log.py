"""Log an outage once per state change, then as a periodic summary, never once per call.

A Redis outage used to produce one warning per rate-limit acquire and per progress
publish: thousands of lines a second across a fleet, burying the one that mattered.
:class:`OutageLog` logs the change of state (``down``, then ``back``) once, and while the
outage lasts, at most one summary per ``interval_s`` with the counts since the last line.

Pure (no I/O of its own): the async and the generated sync code share it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["OutageLog"]

Emit = Callable[..., Any]
"""``emit(event, **fields)``: a structlog method, or an adapter to a stdlib logger."""


class OutageLog:
    """The log lines of one dependency's outages (``event`` prefixes them).

    ``failed()`` per failed call, ``succeeded()`` per successful one (a no-op while up),
    ``counted(what)`` for anything else worth a count in the summary (a fallback, a
    dropped message). Lines (``sep`` between the name and the state): ``<event>-down``
    (the first failure), ``<event>-summary`` (at most every ``interval_s`` while down:
    the counts since the previous line), and ``<event>-back`` (the first success after a
    failure: the outage's length and its totals).
    """

    def __init__(
        self,
        event: str,
        emit: Emit,
        *,
        interval_s: float,
        sep: str = "-",
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.event = event
        self._sep = sep
        self._emit = emit
        self._interval = interval_s
        self._clock = clock
        self.down_since: float | None = None
        self._last_line = 0.0
        self._counts: dict[str, int] = {}
        self._totals: dict[str, int] = {}

    @property
    def totals(self) -> dict[str, int]:
        """The counts of the current outage (empty when up)."""
        return dict(self._totals)

    @property
    def is_down(self) -> bool:
        """Whether the last call failed (no success since)."""
        return self.down_since is not None

    def failed(self, error: BaseException | str, **fields: Any) -> None:
        """One call failed with ``error``."""
        now = self._clock()
        if self.down_since is None:
            self.down_since = now
            self._last_line = now
            self._counts, self._totals = {}, {"failures": 1}
            self._emit(self._name("down"), error=str(error), **fields)
            return
        self._bump("failures")
        self._maybe_summary(now, error)

    def counted(self, what: str) -> None:
        """Count ``what`` (a fallback taken, a message dropped) towards the summary."""
        self._bump(what)
        if self.down_since is not None:
            self._maybe_summary(self._clock(), None)

    def succeeded(self) -> None:
        """One call succeeded: log ``<event>-back`` if it was down."""
        if self.down_since is None:
            return
        now = self._clock()
        lasted = now - self.down_since
        totals = dict(self._totals)
        self.down_since = None
        self._counts, self._totals = {}, {}
        self._emit(self._name("back"), down_s=round(lasted, 3), **totals)

    def _name(self, state: str) -> str:
        return f"{self.event}{self._sep}{state}"

    def _bump(self, what: str) -> None:
        self._counts[what] = self._counts.get(what, 0) + 1
        self._totals[what] = self._totals.get(what, 0) + 1

    def _maybe_summary(self, now: float, error: BaseException | str | None) -> None:
        if now - self._last_line < self._interval:
            return
        assert self.down_since is not None
        counts = dict(self._counts)
        self._counts = {}
        self._last_line = now
        extra = {} if error is None else {"error": str(error)}
        self._emit(
            self._name("summary"),
            down_s=round(now - self.down_since, 3),
            interval_s=self._interval,
            **counts,
            **extra,
        )
