"""Statement builders for the worker's hot path: claim a batch, finish a batch, wake workers.

Every builder returns a Core statement; the worker executes it. The claim is one
``UPDATE ... WHERE id IN (SELECT ... FOR UPDATE SKIP LOCKED LIMIT n) RETURNING`` on
Postgres; SQLite runs the same statement without the lock clause (its writers are already
serialised by ``BEGIN IMMEDIATE``). Finishing is fenced: a row changes only while it is
still ``running`` under the worker id and attempt number that claimed it.
"""

from __future__ import annotations

from typing import Any, Final

from sqlalchemy import (
    BigInteger,
    Float,
    Integer,
    Select,
    Text,
    Update,
    and_,
    any_,
    bindparam,
    case,
    cast,
    exists,
    func,
    literal,
    literal_column,
    null,
    or_,
    select,
    update,
)
from sqlalchemy.sql.elements import ColumnClause, ColumnElement
from sqlalchemy.types import TypeEngine

from taskq.db.dialect import now, now_plus
from taskq.db.tables import actor_config, job_attempts, jobs, queues, reservation_slots

__all__ = [
    "ATTEMPT_MAX",
    "CLAIM_COLUMNS",
    "NOTIFY_CHANNEL_PREFIX",
    "attach_slots",
    "capped_actor_config",
    "claim_jobs",
    "finish_jobs",
    "free_slots",
    "has_ready",
    "notify_channel",
    "notify_enqueued",
    "park_jobs",
    "queue_modes",
    "record_attempts",
    "running_counts",
    "wake_parked",
]

NOTIFY_CHANNEL_PREFIX: Final = "taskq_jobs_"

CLAIM_COLUMNS: Final = (
    jobs.c.id,
    jobs.c.actor,
    jobs.c.queue,
    jobs.c.payload,
    jobs.c.attempt,
    jobs.c.budget_used,
    jobs.c.max_attempts,
    jobs.c.priority,
    jobs.c.identity_key,
    jobs.c.start_to_close_s,
    jobs.c.schedule_to_close_s,
    jobs.c.deadline_at,
    jobs.c.created_at,
    jobs.c.scheduled_at,
    jobs.c.started_at,
    jobs.c.cancel_phase,
    jobs.c.progress_seq,
    jobs.c.trace_context,
    jobs.c.waiting_on,
)
"""What a claim returns: everything one attempt needs, so execution reads nothing else."""

ATTEMPT_MAX: Final = 2**31 - 1
"""The largest ``attempt`` the column holds: a row there cannot be claimed again."""
_SEQ_MAX: Final = 2**63 - 1

_AS_TEXT: Final = frozenset({"payload", "trace_context"})
"""JSON columns the claim returns as text: the worker decodes each row on its own, so one
undecodable document (nested past the decoder's depth) fails that row, not the batch."""


def _claim_returning() -> list[ColumnElement[Any]]:
    return [
        cast(col, Text()).label(col.name) if col.name in _AS_TEXT else col for col in CLAIM_COLUMNS
    ]


def _bounded_increment(col: Any, top: int) -> ColumnElement[Any]:
    """``col + 1`` that never overflows: a row at the top keeps its value (the worker then
    fails it as unclaimable rather than every claim statement failing on it)."""
    return case((col < literal(top, type_=BigInteger()), col + 1), else_=col)


_READY: Final[tuple[ColumnClause[Any], ...]] = (
    literal_column("'pending'"),
    literal_column("'scheduled'"),
)
# Literals, not bound parameters: Postgres only uses the partial dispatch index when the
# predicate visibly implies ``status IN ('pending', 'scheduled')``.
_RUNNING: Final[ColumnClause[Any]] = literal_column("'running'")


def _seconds(name: str) -> ColumnElement[Any]:
    return cast(bindparam(name, type_=Float()), Float())


def _ready(
    dialect_name: str, queues_: tuple[str, ...], actors: tuple[str, ...]
) -> list[ColumnElement[bool]]:
    return [
        jobs.c.status.in_(_READY),
        jobs.c.queue.in_(queues_),
        jobs.c.actor.in_(actors),
        jobs.c.scheduled_at <= now(dialect_name),
        ~exists().where(queues.c.name == jobs.c.queue, queues.c.paused == literal(True)),
        exists().where(
            actor_config.c.actor == jobs.c.actor,
            or_(actor_config.c.max_concurrent.is_(None), actor_config.c.max_concurrent > 0),
        ),
    ]


def has_ready(dialect_name: str, queues_: tuple[str, ...], actor: str) -> Select[Any]:
    """One id of a job of ``actor`` that :func:`claim_jobs` would claim now, if any: the
    dispatcher asks before paying rate-limit tokens for an actor whose backlog ran dry."""
    return select(jobs.c.id).where(*_ready(dialect_name, queues_, (actor,))).limit(1)


def claim_jobs(
    dialect_name: str,
    *,
    queues_: tuple[str, ...],
    actors: tuple[str, ...],
    limit: int,
    skip_running_identities: bool = False,
) -> Update:
    """Claim up to ``limit`` ready jobs of ``actors`` on ``queues_`` in one statement.

    Ready: ``pending``/``scheduled`` with ``scheduled_at`` reached, its queue not paused,
    its actor present in ``actor_config`` and not in drain mode (``max_concurrent = 0``).
    Order: priority (high first), then ``scheduled_at``. Claimed rows become
    ``running`` with ``attempt + 1`` (a row already at :data:`ATTEMPT_MAX` keeps it, and
    the worker fails it unrun), ``payload`` and ``trace_context`` come back as JSON text
    (decoded per row by the worker), ``locked_by = :worker_id`` and a lease of
    ``:lease_s`` seconds. ``skip_running_identities`` leaves out jobs whose
    ``(actor, identity_key)`` already has a running job (the ``running_identities``
    snapshot, read in the same statement before the row locks: best-effort fairness).
    Parameters: ``worker_id``, ``lease_s``.
    """
    running = jobs.alias("running_identities")
    conditions = _ready(dialect_name, queues_, actors)
    if skip_running_identities:
        conditions.append(
            or_(
                jobs.c.identity_key.is_(None),
                ~exists().where(
                    running.c.status == _RUNNING,
                    running.c.actor == jobs.c.actor,
                    running.c.identity_key == jobs.c.identity_key,
                ),
            )
        )
    ready: Select[Any] = (
        select(jobs.c.id)
        .where(*conditions)
        # Exactly the dispatch index's order: the scan stops after ``limit`` rows. A
        # tie-breaker not in the index would make Postgres sort every ready row.
        .order_by(jobs.c.priority.desc(), jobs.c.scheduled_at)
        .limit(limit)
    )
    # Row locks on Postgres; SQLite renders no FOR UPDATE (BEGIN IMMEDIATE serialises).
    ready = ready.with_for_update(skip_locked=True, of=jobs)
    ts = now(dialect_name)
    return (
        update(jobs)
        .where(jobs.c.id.in_(ready.scalar_subquery()))
        .values(
            status=_RUNNING,
            attempt=_bounded_increment(jobs.c.attempt, ATTEMPT_MAX),
            locked_by=bindparam("worker_id", type_=jobs.c.locked_by.type),
            lease_expires_at=now_plus(dialect_name, _seconds("lease_s")),
            started_at=ts,
            updated_at=ts,
            progress_seq=_bounded_increment(jobs.c.progress_seq, _SEQ_MAX),
        )
        .returning(*_claim_returning())
    )


def _fence() -> ColumnElement[bool]:
    return and_(
        jobs.c.id == bindparam("b_id", type_=jobs.c.id.type),
        jobs.c.locked_by == bindparam("b_worker", type_=jobs.c.locked_by.type),
        jobs.c.attempt == bindparam("b_attempt", type_=jobs.c.attempt.type),
        jobs.c.status == _RUNNING,
    )


def record_attempts(dialect_name: str) -> Any:
    """INSERT one ``job_attempts`` row per finished attempt, only while the claim still holds.

    Run with executemany before :func:`finish_jobs` in the same transaction. The source row
    is read ``FOR UPDATE`` on Postgres, so the fenced update that follows cannot miss.
    Parameters per row: ``b_id``, ``b_worker``, ``b_attempt``, ``b_outcome``,
    ``b_error_class``, ``b_error``, ``b_traceback``.
    """
    source: Select[Any] = select(
        jobs.c.id,
        jobs.c.attempt,
        jobs.c.locked_by,
        bindparam("b_outcome", type_=job_attempts.c.outcome.type),
        bindparam("b_error_class", type_=job_attempts.c.error_class.type),
        bindparam("b_error", type_=job_attempts.c.error.type),
        bindparam("b_traceback", type_=job_attempts.c.traceback.type),
        func.coalesce(jobs.c.started_at, now(dialect_name)),
        now(dialect_name),
    ).where(_fence())
    source = source.with_for_update()
    return job_attempts.insert().from_select(
        [
            job_attempts.c.job_id,
            job_attempts.c.attempt,
            job_attempts.c.worker_id,
            job_attempts.c.outcome,
            job_attempts.c.error_class,
            job_attempts.c.error,
            job_attempts.c.traceback,
            job_attempts.c.started_at,
            job_attempts.c.finished_at,
        ],
        source,
    )


def finish_jobs(dialect_name: str) -> Update:
    """The fenced write that ends an attempt (executemany: one parameter set per job).

    ``b_status`` is the row's next status: a terminal one (``succeeded``, ``failed``,
    ``cancelled``) or ``scheduled``/``pending`` to run again after ``b_delay_s`` seconds
    (NULL keeps ``scheduled_at``). ``b_budget`` (0/1) is added to ``budget_used``.
    ``b_ttl_s`` (NULL = keep forever) sets ``result_expires_at``. The claim's lease and
    lock are cleared either way. Also takes the :func:`record_attempts` fence parameters.
    """
    ts = now(dialect_name)
    status = bindparam("b_status", type_=jobs.c.status.type)
    delay = _seconds("b_delay_s")
    ttl = _seconds("b_ttl_s")
    terminal = or_(
        *(status == literal_column(f"'{s}'") for s in ("succeeded", "failed", "cancelled"))
    )
    return (
        update(jobs)
        .where(_fence())
        .values(
            status=status,
            result=bindparam("b_result", type_=jobs.c.result.type),
            error_class=bindparam("b_error_class", type_=jobs.c.error_class.type),
            error=bindparam("b_error", type_=jobs.c.error.type),
            budget_used=jobs.c.budget_used + bindparam("b_budget", type_=jobs.c.budget_used.type),
            scheduled_at=case(
                (delay.is_(None), jobs.c.scheduled_at), else_=now_plus(dialect_name, delay)
            ),
            finished_at=case((terminal, ts), else_=null()),
            result_expires_at=case((ttl.is_(None), null()), else_=now_plus(dialect_name, ttl)),
            locked_by=null(),
            lease_expires_at=null(),
            cancel_phase=case((terminal, jobs.c.cancel_phase), else_=literal(0)),
            progress=case(
                (
                    bindparam("b_has_progress", type_=Integer()) == 1,
                    bindparam("b_progress", type_=jobs.c.progress.type),
                ),
                else_=jobs.c.progress,
            ),
            # The worker numbers its attempt's events (claim, progress, this end): the
            # row keeps the last number it published, so the next claim's +1 follows it.
            progress_seq=_given_seq(),
            waiting_on=null(),
            updated_at=ts,
        )
    )


def park_jobs(dialect_name: str) -> Update:
    """Park claimed jobs a limit denied: ``scheduled`` again in ``b_delay_s`` seconds,
    fenced like :func:`finish_jobs` (executemany: one parameter set per job).

    One row write, and no attempt: the claim's ``attempt + 1`` and event number are taken
    back (the attempt never started), so ``attempt`` keeps counting attempts that ran and
    the retry budget is untouched. ``waiting_on`` records ``b_waiting_on`` (what denied)
    and ``denials`` counts the parks. No ``job_attempts`` row is written. Parameters:
    ``b_id``, ``b_worker``, ``b_attempt``, ``b_delay_s``, ``b_waiting_on``.
    """
    ts = now(dialect_name)
    return (
        update(jobs)
        .where(_fence())
        .values(
            status=literal_column("'scheduled'"),
            attempt=jobs.c.attempt - 1,
            progress_seq=jobs.c.progress_seq - 1,
            scheduled_at=now_plus(dialect_name, _seconds("b_delay_s")),
            started_at=case((jobs.c.attempt == 1, null()), else_=jobs.c.started_at),
            locked_by=null(),
            lease_expires_at=null(),
            waiting_on=bindparam("b_waiting_on", type_=jobs.c.waiting_on.type),
            denials=jobs.c.denials + 1,
            updated_at=ts,
        )
    )


def wake_parked(dialect_name: str, name: str, count: int) -> Update:
    """Make up to ``count`` jobs parked on reservation/queue cap ``name`` claimable now.

    Run after a release of ``count`` slots of ``name``: the longest-waiting parked jobs
    (priority, then the time they were parked to) are due at once, ahead of work enqueued
    after them (``scheduled_at`` back to ``created_at``). Returns their queues (for the
    NOTIFY). ``SKIP LOCKED`` on Postgres: a row another release is waking is passed over.
    """
    pick = (
        select(jobs.c.id)
        .where(
            jobs.c.status == literal_column("'scheduled'"),
            jobs.c.waiting_on == name,
        )
        .order_by(jobs.c.waiting_on, jobs.c.priority.desc(), jobs.c.scheduled_at)
        .limit(count)
        .with_for_update(skip_locked=True, of=jobs)
    )
    return (
        update(jobs)
        .where(jobs.c.id.in_(pick.scalar_subquery()))
        .values(scheduled_at=jobs.c.created_at, updated_at=now(dialect_name))
        .returning(jobs.c.queue)
    )


def free_slots(dialect_name: str, names: tuple[str, ...]) -> Select[Any]:
    """``(name, free slots)`` of the listed reservations (rows nobody holds, or lapsed)."""
    s = reservation_slots.c
    free = or_(s.worker_id.is_(None), s.lease_expires_at <= now(dialect_name))
    return (
        select(s.name, func.sum(case((free, 1), else_=0))).where(s.name.in_(names)).group_by(s.name)
    )


def attach_slots(worker_id_param: str = "b_worker") -> Update:
    """Tie slots the worker took before a claim to the jobs it claimed (executemany:
    ``b_name``, ``b_slot``, ``b_job``; fenced on the holder ``b_worker``)."""
    s = reservation_slots.c
    return (
        update(reservation_slots)
        .where(
            s.name == bindparam("b_name", type_=s.name.type),
            s.slot_index == bindparam("b_slot", type_=s.slot_index.type),
            s.worker_id == bindparam(worker_id_param, type_=s.worker_id.type),
        )
        .values(job_id=bindparam("b_job", type_=s.job_id.type))
    )


def _given_seq() -> ColumnElement[Any]:
    """``progress_seq`` set to the worker's event number ``b_seq``. A caller that passes
    none (or NULL) gets the old behaviour: one more than the row's current value."""
    given = bindparam("b_seq", type_=jobs.c.progress_seq.type, required=False, value=None)
    return func.coalesce(given, jobs.c.progress_seq + 1)


def running_counts(actors: tuple[str, ...]) -> Select[Any]:
    """Running jobs per actor, for the per-round ``max_concurrent`` damper."""
    return (
        select(jobs.c.actor, func.count())
        .where(jobs.c.status == _RUNNING, jobs.c.actor.in_(actors))
        .group_by(jobs.c.actor)
    )


def capped_actor_config(actors: tuple[str, ...]) -> Select[Any]:
    """Stored ``max_concurrent`` of ``actors`` that have one (NULL = uncapped, not listed)."""
    return select(actor_config.c.actor, actor_config.c.max_concurrent).where(
        actor_config.c.actor.in_(actors), actor_config.c.max_concurrent.is_not(None)
    )


def queue_modes(names: tuple[str, ...]) -> Select[Any]:
    """``(name, mode)`` of the listed queues that have a ``queues`` row."""
    return select(queues.c.name, queues.c.mode).where(queues.c.name.in_(names))


def notify_channel(schema: str) -> str:
    """The LISTEN/NOTIFY channel for a schema (one per schema so deployments do not cross)."""
    return f"{NOTIFY_CHANNEL_PREFIX}{schema}"


def notify_enqueued(schema: str, queue: str) -> Select[Any]:
    """``SELECT pg_notify(channel, queue)``: run it in the enqueue transaction (Postgres only).

    Delivered at commit, so a worker never wakes for a job it cannot see yet.
    """
    return select(func.pg_notify(notify_channel(schema), queue))


def finish_jobs_batch_pg() -> Any:
    """Postgres: end a whole batch of attempts in ONE statement with ONE parameter.

    ``WITH upd AS (UPDATE jobs ... FROM jsonb_to_recordset(:batch) AS v(...) ...
    RETURNING ...) INSERT INTO job_attempts SELECT ... FROM upd``: the fenced update and
    the attempt records of exactly the rows it changed. ``batch`` is a JSON array of
    objects with keys ``id``, ``attempt``, ``status``, ``outcome``, ``result``,
    ``error_class``, ``error``, ``traceback``, ``budget``, ``delay_s``, ``ttl_s``,
    ``has_progress``, ``progress``, ``seq`` (one JSON document: far cheaper to send than one array
    per column); ``worker_id`` is the fence.
    """
    from sqlalchemy import Text, Uuid, column, insert
    from sqlalchemy.dialects.postgresql import ARRAY, JSONB

    spec: list[tuple[str, TypeEngine[Any]]] = [
        ("id", Uuid()),
        ("attempt", Integer()),
        ("status", Text()),
        ("outcome", Text()),
        ("result", JSONB()),
        ("error_class", Text()),
        ("error", Text()),
        ("traceback", Text()),
        ("budget", Integer()),
        ("delay_s", Float()),
        ("ttl_s", Float()),
        ("has_progress", Integer()),
        ("progress", JSONB()),
        ("seq", BigInteger()),
    ]
    v = (
        func.jsonb_to_recordset(bindparam("batch", type_=JSONB()))
        .table_valued(*(column(name, type_) for name, type_ in spec))
        .render_derived(name="v", with_types=True)
    )
    ts = func.clock_timestamp()
    terminal = v.c.status.in_(
        [literal_column("'succeeded'"), literal_column("'failed'"), literal_column("'cancelled'")]
    )
    upd = (
        update(jobs)
        .where(
            # The explicit ANY lets a cached generic plan still probe the primary key.
            jobs.c.id == any_(bindparam("ids", type_=ARRAY(Uuid()))),
            jobs.c.id == v.c.id,
            jobs.c.attempt == v.c.attempt,
            jobs.c.locked_by == bindparam("worker_id", type_=jobs.c.locked_by.type),
            jobs.c.status == _RUNNING,
        )
        .values(
            status=v.c.status,
            result=v.c.result,
            error_class=v.c.error_class,
            error=v.c.error,
            budget_used=jobs.c.budget_used + v.c.budget,
            scheduled_at=case(
                (v.c.delay_s.is_(None), jobs.c.scheduled_at),
                else_=now_plus("postgresql", v.c.delay_s),
            ),
            finished_at=case((terminal, ts), else_=null()),
            result_expires_at=case(
                (v.c.ttl_s.is_(None), null()), else_=now_plus("postgresql", v.c.ttl_s)
            ),
            locked_by=null(),
            lease_expires_at=null(),
            cancel_phase=case((terminal, jobs.c.cancel_phase), else_=literal(0)),
            progress=case((v.c.has_progress == 1, v.c.progress), else_=jobs.c.progress),
            progress_seq=func.coalesce(v.c.seq, jobs.c.progress_seq + 1),
            waiting_on=null(),
            updated_at=ts,
        )
        .returning(
            jobs.c.id.label("job_id"),
            jobs.c.attempt.label("attempt"),
            bindparam("worker_id", type_=jobs.c.locked_by.type).label("worker_id"),
            v.c.outcome,
            v.c.error_class.label("a_error_class"),
            v.c.error.label("a_error"),
            v.c.traceback,
            jobs.c.started_at,
        )
        .cte("upd")
    )
    source = select(
        upd.c.job_id,
        upd.c.attempt,
        upd.c.worker_id,
        upd.c.outcome,
        upd.c.a_error_class,
        upd.c.a_error,
        upd.c.traceback,
        func.coalesce(upd.c.started_at, ts),
        ts,
    )
    return (
        insert(job_attempts)
        .from_select(
            [
                job_attempts.c.job_id,
                job_attempts.c.attempt,
                job_attempts.c.worker_id,
                job_attempts.c.outcome,
                job_attempts.c.error_class,
                job_attempts.c.error,
                job_attempts.c.traceback,
                job_attempts.c.started_at,
                job_attempts.c.finished_at,
            ],
            source,
        )
        .add_cte(upd)
    )
