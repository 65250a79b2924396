"""The soak's own checks (``benchmarks/soak.py``) find what they are there to find.

The soak scenario passes when nothing goes wrong; these cases make sure a wrong run would
fail it: a job that never ran, an attempt run twice, two runs of one job at once, a run
the store never counted, and a connection count that keeps growing.
"""

from __future__ import annotations

from pathlib import Path

from benchmarks.soak import Figures, _check_audit


def _planned(n: int) -> int:
    return 2 if n == 1 else 1  # job n=1 is the one that fails its first attempt


def _audit(tmp_path: Path, lines: list[str]) -> Path:
    path = tmp_path / "audit.txt"
    path.write_text("".join(f"{line}\n" for line in lines))
    return path


def _figures() -> Figures:
    return Figures(jobs=2, workers=1, duration_s=1.0)


def test_a_clean_run_passes_the_audit(tmp_path: Path) -> None:
    audit = _audit(
        tmp_path,
        [
            "a 1 10 start 1.0",
            "a 1 10 end 1.5",
            "b 1 10 start 1.0",
            "b 1 10 fail 1.1",
            "b 2 11 start 2.0",
            "b 2 11 end 2.2",
        ],
    )
    figures = _figures()
    _check_audit(figures, audit, [("a", 1, "succeeded", 0), ("b", 2, "succeeded", 1)], _planned)
    assert (figures.runs, figures.planned_runs, figures.re_runs) == (3, 3, 0)
    assert figures.audit_ok


def test_a_counted_attempt_that_never_ran_fails_the_audit(tmp_path: Path) -> None:
    audit = _audit(tmp_path, ["a 2 10 start 1.0", "a 2 10 end 1.5"])
    figures = _figures()
    _check_audit(figures, audit, [("a", 2, "succeeded", 0)], _planned)
    assert figures.attempts_without_run == 1
    assert not figures.audit_ok


def test_an_attempt_run_twice_and_overlapping_runs_fail_the_audit(tmp_path: Path) -> None:
    audit = _audit(
        tmp_path,
        [
            "a 1 10 start 1.0",
            "a 1 11 start 1.2",  # the same attempt, another process, while the first runs
            "a 1 10 end 1.5",
            "a 1 11 end 1.7",
        ],
    )
    figures = _figures()
    _check_audit(figures, audit, [("a", 1, "succeeded", 0)], _planned)
    assert (figures.duplicate_runs, figures.overlaps, figures.re_runs) == (1, 1, 1)
    assert not figures.audit_ok


def test_a_run_the_store_never_counted_fails_the_audit(tmp_path: Path) -> None:
    audit = _audit(
        tmp_path,
        ["a 1 10 start 1.0", "a 1 10 end 1.1", "a 2 10 start 2.0", "a 2 10 end 2.1"],
    )
    figures = _figures()
    _check_audit(figures, audit, [("a", 1, "succeeded", 0)], _planned)
    assert figures.runs_without_attempt == 1
    assert not figures.audit_ok


def test_connections_may_grow_by_one_per_worker_a_leak_fails() -> None:
    late = _figures()
    late.workers = 2
    late.connections_first_half_max = 20
    late.connections_second_half_max = 22  # each engine's loops met once more, late
    assert late.connections_flat
    leak = _figures()
    leak.workers = 2
    leak.connections_first_half_max = 20
    leak.connections_second_half_max = 23
    assert not leak.connections_flat
    assert "connections grew" in leak.failures()
