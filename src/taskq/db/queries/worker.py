"""Statement builders for the worker's background loops.

Worker rows and heartbeats, lease renewal, cancellation requests and phases, leader
leases, the expired-lease and result-retention sweeps, and the shutdown release. As in
``dispatch``, every write that touches a claimed job is fenced on the claiming worker id
and attempt.
"""

from __future__ import annotations

from typing import Any, Final
from uuid import UUID

from sqlalchemy import (
    Delete,
    Float,
    Select,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnClause, ColumnElement

from taskq.db.dialect import insert, now, now_plus
from taskq.db.tables import jobs, leader_leases, queues, reservation_slots, workers

__all__ = [
    "acquire_leader",
    "cancel_requests",
    "expire_results",
    "expired_leases",
    "finish_worker",
    "flush_progress",
    "heartbeat_worker",
    "held_jobs",
    "queue_caps",
    "register_worker",
    "release_jobs",
    "release_leader",
    "renew_job_leases",
    "renew_slot_leases",
    "request_cancel_pending",
    "request_cancel_running",
    "set_cancel_phase",
    "sweep_reclaim",
    "unhold_job",
]

_RUNNING: Final[ColumnClause[Any]] = literal_column("'running'")


def _secs(value: float) -> ColumnElement[Any]:
    return literal(float(value))


def register_worker(
    dialect_name: str,
    *,
    worker_id: UUID,
    hostname: str,
    pid: int,
    queues_: list[str],
    concurrency: int,
    version: str,
) -> Any:
    """INSERT this worker's row (status ``running``, heartbeat now)."""
    ts = now(dialect_name)
    return insert(dialect_name, workers).values(
        id=worker_id,
        hostname=hostname,
        pid=pid,
        queues=queues_,
        concurrency=concurrency,
        status="running",
        version=version,
        started_at=ts,
        last_heartbeat_at=ts,
    )


def heartbeat_worker(dialect_name: str, worker_id: UUID, status: str) -> Update:
    """Stamp the worker row's heartbeat and status."""
    return (
        update(workers)
        .where(workers.c.id == worker_id)
        .values(last_heartbeat_at=now(dialect_name), status=status)
    )


def finish_worker(dialect_name: str, worker_id: UUID, status: str = "stopped") -> Update:
    """Mark the worker row stopped (or isolated) on the way out."""
    ts = now(dialect_name)
    return (
        update(workers)
        .where(workers.c.id == worker_id)
        .values(status=status, stopped_at=ts, last_heartbeat_at=ts)
    )


def renew_job_leases(dialect_name: str, worker_id: UUID, lease_s: float) -> Update:
    """Extend the lease of this worker's running rows listed in ``ids`` (expanding param),
    RETURNING ``(id, attempt)`` of each row renewed.

    A row another transaction has locked is skipped (``FOR UPDATE SKIP LOCKED`` on
    Postgres), never waited for: the rows being locked are the worker's own outcome write
    (finishing them, so they need no lease), and a renewal that waited on it while the
    write waited on a row the renewal had locked was a deadlock. :func:`held_jobs` tells a
    skipped row still ours from one lost.
    """
    mine: Select[Any] = select(jobs.c.id).where(
        jobs.c.locked_by == worker_id,
        jobs.c.status == _RUNNING,
        jobs.c.id.in_(bindparam("ids", expanding=True)),
    )
    mine = mine.with_for_update(skip_locked=True)
    return (
        update(jobs)
        .where(jobs.c.id.in_(mine.scalar_subquery()))
        .values(lease_expires_at=now_plus(dialect_name, _secs(lease_s)))
        .returning(jobs.c.id, jobs.c.attempt)
    )


def held_jobs(worker_id: UUID) -> Select[Any]:
    """``(id, attempt)`` of the rows in ``ids`` (expanding) still running under this
    worker: a plain read, which no row lock blocks (the renewal's skipped rows)."""
    return select(jobs.c.id, jobs.c.attempt).where(
        jobs.c.locked_by == worker_id,
        jobs.c.status == _RUNNING,
        jobs.c.id.in_(bindparam("ids", expanding=True)),
    )


def renew_slot_leases(dialect_name: str, worker_id: UUID) -> Update:
    """Extend one reservation slot this worker holds for a job to now + its lease (executemany).

    Parameters per slot: ``b_name``, ``b_slot``, ``b_job`` and ``b_lease`` (seconds: the
    ``lease`` of the ``ConcurrencyReservation`` that claimed it). The new end is the
    store's clock plus one lease, never the old end plus anything, so a held slot's lease
    stays at one lease duration from the last heartbeat however long the job runs, and a
    crashed holder's slot frees one lease after its last heartbeat.

    The duration is passed in rather than read from the row: the row has no lease
    column, and ``lease_expires_at - acquired_at`` stops being the lease after the first
    renewal (``acquired_at`` never moves, so each beat used to add the job's elapsed time).
    Only the process that claimed a slot renews it, and it claimed it with this very
    reservation object, so the duration is the one the claim used; the time arithmetic
    stays on the store's clock (``clock_timestamp()`` / SQLite ``now``) on both engines,
    so worker clocks never enter it. Fenced on ``worker_id`` and ``job_id``: a slot
    released, lapsed and re-taken by anyone else (or by this worker for another job) is
    left alone.
    """
    return (
        update(reservation_slots)
        .where(
            reservation_slots.c.name == bindparam("b_name", type_=reservation_slots.c.name.type),
            reservation_slots.c.slot_index
            == bindparam("b_slot", type_=reservation_slots.c.slot_index.type),
            reservation_slots.c.worker_id == worker_id,
            reservation_slots.c.job_id == bindparam("b_job", type_=reservation_slots.c.job_id.type),
        )
        .values(lease_expires_at=now_plus(dialect_name, bindparam("b_lease", type_=Float())))
    )


def cancel_requests(worker_id: UUID) -> Select[Any]:
    """This worker's running rows with a cancellation request: ``(id, attempt, cancel_phase,
    seconds since the request)``; ``ids`` (expanding) limits it to jobs still in flight."""
    return select(jobs.c.id, jobs.c.attempt, jobs.c.cancel_phase, jobs.c.cancel_requested_at).where(
        jobs.c.locked_by == worker_id,
        jobs.c.status == _RUNNING,
        jobs.c.cancel_phase > 0,
        jobs.c.id.in_(bindparam("ids", expanding=True)),
    )


def set_cancel_phase(worker_id: UUID) -> Update:
    """Record the escalation phase (``phase``) of a running job this worker holds (fenced)."""
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
            jobs.c.attempt == bindparam("b_attempt", type_=jobs.c.attempt.type),
            jobs.c.locked_by == worker_id,
            jobs.c.status == _RUNNING,
            jobs.c.cancel_phase < bindparam("phase", type_=jobs.c.cancel_phase.type),
        )
        .values(cancel_phase=bindparam("phase", type_=jobs.c.cancel_phase.type))
    )


def request_cancel_pending(dialect_name: str, job_id: UUID) -> Update:
    """Cancel a job that has not started: terminal at once, ``CancelledBeforeStart``."""
    ts = now(dialect_name)
    return (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status.in_(("pending", "scheduled")))
        .values(
            status="cancelled",
            error_class="CancelledBeforeStart",
            error="cancelled before it started",
            cancel_requested_at=ts,
            finished_at=ts,
            updated_at=ts,
        )
        .returning(jobs.c.id)
    )


def request_cancel_running(dialect_name: str, job_id: UUID) -> Update:
    """Ask the worker running a job to cancel it: ``cancel_phase`` 1 (cooperative)."""
    ts = now(dialect_name)
    return (
        update(jobs)
        .where(jobs.c.id == job_id, jobs.c.status == _RUNNING, jobs.c.cancel_phase == 0)
        .values(cancel_phase=1, cancel_requested_at=ts, updated_at=ts)
        .returning(jobs.c.id)
    )


def acquire_leader(dialect_name: str, *, name: str, holder: UUID, lease_s: float) -> Any:
    """Take or renew the leader lease ``name``; RETURNING a row only when ``holder`` holds it.

    The upsert overwrites the row only when it is ours already or it has expired, so two
    candidates can never both succeed: the row is the election.
    """
    ts = now(dialect_name)
    expires = now_plus(dialect_name, _secs(lease_s))
    stmt = insert(dialect_name, leader_leases).values(
        name=name, holder=holder, acquired_at=ts, expires_at=expires
    )
    excluded = stmt.excluded
    same = leader_leases.c.holder == excluded.holder
    return stmt.on_conflict_do_update(
        index_elements=[leader_leases.c.name],
        set_={
            "holder": excluded.holder,
            "acquired_at": func.coalesce(
                select(leader_leases.c.acquired_at)
                .where(leader_leases.c.name == name, same)
                .scalar_subquery(),
                excluded.acquired_at,
            )
            if dialect_name != "postgresql"
            else _keep_acquired(same, excluded),
            "expires_at": excluded.expires_at,
        },
        where=(same | (leader_leases.c.expires_at < ts)),
    ).returning(leader_leases.c.holder)


def _keep_acquired(same: ColumnElement[bool], excluded: Any) -> ColumnElement[Any]:
    from sqlalchemy import case

    return case((same, leader_leases.c.acquired_at), else_=excluded.acquired_at)


def release_leader(name: str, holder: UUID) -> Delete:
    """Give the lease up at shutdown so a successor need not wait for it to expire."""
    return delete(leader_leases).where(
        leader_leases.c.name == name, leader_leases.c.holder == holder
    )


def expired_leases(dialect_name: str, limit: int) -> Select[Any]:
    """Running rows whose lease expired (locked ``SKIP LOCKED`` on Postgres), oldest first."""
    stmt = (
        select(
            jobs.c.id,
            jobs.c.actor,
            jobs.c.attempt,
            jobs.c.locked_by,
            jobs.c.budget_used,
            jobs.c.max_attempts,
            jobs.c.cancel_phase,
        )
        .where(jobs.c.status == _RUNNING, jobs.c.lease_expires_at < now(dialect_name))
        .order_by(jobs.c.lease_expires_at)
        .limit(limit)
    )
    stmt = stmt.with_for_update(skip_locked=True)
    return stmt


def sweep_reclaim(dialect_name: str) -> Update:
    """The sweep's fenced write for one expired row (executemany).

    ``b_status``: ``pending`` (reclaimed, keeping its place in the queue: ``scheduled_at``
    unchanged; the crashed attempt spends budget), or terminal
    ``abandoned``/``cancelled``. Fence: ``b_id``, ``b_worker``, ``b_attempt``, still running
    with an expired lease.
    """
    ts = now(dialect_name)
    status = bindparam("b_status", type_=jobs.c.status.type)
    from sqlalchemy import case

    terminal = or_(status == literal_column("'abandoned'"), status == literal_column("'cancelled'"))
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
            jobs.c.locked_by == bindparam("b_worker", type_=jobs.c.locked_by.type),
            jobs.c.attempt == bindparam("b_attempt", type_=jobs.c.attempt.type),
            jobs.c.status == _RUNNING,
            jobs.c.lease_expires_at < ts,
        )
        .values(
            status=status,
            error_class=bindparam("b_error_class", type_=jobs.c.error_class.type),
            error=bindparam("b_error", type_=jobs.c.error.type),
            budget_used=jobs.c.budget_used + 1,
            # A reclaimed job keeps its place in the queue (``scheduled_at`` unchanged):
            # it was next once already, and the crash was not its turn's fault.
            finished_at=case((terminal, ts), else_=null()),
            locked_by=null(),
            lease_expires_at=null(),
            progress_seq=jobs.c.progress_seq + 1,
            updated_at=ts,
        )
    )


def expire_results(dialect_name: str) -> Update:
    """Drop results whose ``result_ttl`` ran out (the row itself stays as history)."""
    return (
        update(jobs)
        .where(jobs.c.result_expires_at < now(dialect_name))
        .values(result=null(), result_expires_at=null())
    )


def queue_depth() -> Select[Any]:
    """``(queue, status, count)`` of the jobs waiting to run: ``pending`` (ready),
    ``scheduled`` (a delay, a retry backoff, a snooze) and ``waiting`` (parked on a limit:
    ``waiting_on`` set), per queue (the rows the dispatch index covers)."""
    state = case((jobs.c.waiting_on.is_not(None), literal("waiting")), else_=jobs.c.status)
    return (
        select(jobs.c.queue, state, func.count())
        .where(jobs.c.status.in_(("pending", "scheduled")))
        .group_by(jobs.c.queue, state)
    )


def release_jobs(dialect_name: str) -> Update:
    """Hand an unfinished claimed row back (executemany), fenced like a finish.

    ``b_hold_s`` NULL releases it ``pending`` now, in its old place in the queue
    (``scheduled_at`` unchanged); a number holds it ``scheduled`` that many seconds ahead (a sync actor's thread may still be running in this process).
    Budget is not spent: the attempt was interrupted by this worker, not by the job.
    ``b_seq`` is the event number the worker gave the release (stored in ``progress_seq``).
    """
    ts = now(dialect_name)
    from sqlalchemy import Float, case, cast

    hold = cast(bindparam("b_hold_s", type_=Float()), Float())
    return (
        update(jobs)
        .where(
            and_(
                jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
                jobs.c.locked_by == bindparam("b_worker", type_=jobs.c.locked_by.type),
                jobs.c.attempt == bindparam("b_attempt", type_=jobs.c.attempt.type),
                jobs.c.status == _RUNNING,
            )
        )
        .values(
            status=case((hold.is_(None), literal("pending")), else_=literal("scheduled")),
            # Released now: it keeps its place in the queue; held: it waits that long.
            scheduled_at=case(
                (hold.is_(None), jobs.c.scheduled_at), else_=now_plus(dialect_name, hold)
            ),
            locked_by=null(),
            lease_expires_at=null(),
            progress_seq=func.coalesce(
                bindparam("b_seq", type_=jobs.c.progress_seq.type, required=False, value=None),
                jobs.c.progress_seq + 1,
            ),
            updated_at=ts,
        )
    )


def unhold_job(dialect_name: str) -> Update:
    """Bring a held (``scheduled``) release forward once its thread provably exited."""
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
            jobs.c.attempt == bindparam("b_attempt", type_=jobs.c.attempt.type),
            jobs.c.status == "scheduled",
            jobs.c.locked_by.is_(None),
        )
        .values(status="pending", scheduled_at=now(dialect_name))
    )


def flush_progress(worker_id: UUID) -> Update:
    """Write a running job's coalesced progress (executemany: ``b_id``, ``b_attempt``,
    ``b_progress``, ``b_seq``: the seq of the newest update it carries), fenced on this
    worker's claim."""
    return (
        update(jobs)
        .where(
            jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
            jobs.c.attempt == bindparam("b_attempt", type_=jobs.c.attempt.type),
            jobs.c.locked_by == worker_id,
            jobs.c.status == _RUNNING,
        )
        .values(
            progress=bindparam("b_progress", type_=jobs.c.progress.type),
            progress_seq=func.coalesce(
                bindparam("b_seq", type_=jobs.c.progress_seq.type, required=False, value=None),
                jobs.c.progress_seq + 1,
            ),
        )
    )


def queue_caps(names: tuple[str, ...]) -> Select[Any]:
    """``(name, max_concurrent)`` of the listed queues that have a fleet-wide cap."""
    return select(queues.c.name, queues.c.max_concurrent).where(
        queues.c.name.in_(names), queues.c.max_concurrent.is_not(None)
    )
