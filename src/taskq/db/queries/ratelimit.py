"""Statements of the SQL rate-limit backend and of reservation slots.

Built here, executed by :mod:`taskq.ratelimit._sql` and :mod:`taskq.ratelimit.reservation`
on Postgres and SQLite alike. Every name arrives as a bound parameter. The store's clock
(``clock_timestamp()`` on Postgres) is read in the same statement that locks the row, so
the decision and the time it is made at cannot disagree.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta
from typing import Any, Final
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    Delete,
    Float,
    Integer,
    Interval,
    Numeric,
    Select,
    Update,
    and_,
    bindparam,
    case,
    cast,
    delete,
    extract,
    func,
    literal,
    null,
    or_,
    select,
    true,
    type_coerce,
    update,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.sql.elements import ColumnElement

from taskq.db import dialect as db_dialect
from taskq.db.queries.compiled import compile_once
from taskq.db.tables import rate_limit_buckets, rate_limit_window_entries, reservation_slots
from taskq.db.types import UTCDateTime

__all__ = [
    "EPS_TOKENS",
    "bucket_delete",
    "bucket_lock_params",
    "bucket_lock_upsert",
    "bucket_publish",
    "bucket_read",
    "bucket_store",
    "bucket_store_params",
    "db_now",
    "gcra_first_pg",
    "gcra_take_pg",
    "pg_sql",
    "slot_claim",
    "slot_release",
    "slot_renew",
    "slots_delete_excess",
    "slots_ensure",
    "slots_held",
    "slots_held_excess",
    "slots_soonest_expiry",
    "tb_first_pg",
    "tb_take_pg",
    "window_delete_all",
    "window_evict",
    "window_insert",
    "window_stats",
]

_b = rate_limit_buckets.c
_w = rate_limit_window_entries.c
_s = reservation_slots.c


def db_now(dialect_name: str) -> ColumnElement[datetime]:
    """The store's clock, typed so that it comes back as an aware UTC datetime."""
    return type_coerce(db_dialect.now(dialect_name), UTCDateTime()).label("db_now")


@functools.cache
def bucket_lock_upsert(dialect_name: str) -> Any:
    """Create the bucket row on first use, or lock the existing one; return its state.

    ``ON CONFLICT DO UPDATE`` takes the row lock on Postgres (the statement is the
    ``FOR UPDATE``); the config columns are refreshed so the admin page shows the live
    config. ``tokens``/``tat`` stay ``NULL`` on a fresh row, which the maths reads as full.
    Built once per dialect (it is on the hot path); parameters come from
    :func:`bucket_lock_params`.
    """
    stmt = db_dialect.insert(dialect_name, rate_limit_buckets).values(
        bucket_name=bindparam("p_name"),
        kind=bindparam("p_kind"),
        capacity=bindparam("p_capacity"),
        refill_per_second=bindparam("p_refill"),
        window_s=bindparam("p_window_s"),
        updated_at=db_dialect.now(dialect_name),
    )
    stmt = stmt.on_conflict_do_update(
        index_elements=[_b.bucket_name],
        set_={
            "kind": stmt.excluded.kind,
            "capacity": stmt.excluded.capacity,
            "refill_per_second": stmt.excluded.refill_per_second,
            "window_s": stmt.excluded.window_s,
        },
    )
    return stmt.returning(_b.kind, _b.tokens, _b.tat, _b.updated_at, db_now(dialect_name))


def bucket_lock_params(
    name: str, *, kind: str, capacity: float, refill_per_second: float, window_s: float | None
) -> dict[str, Any]:
    """Parameters of :func:`bucket_lock_upsert`."""
    return {
        "p_name": name,
        "p_kind": kind,
        "p_capacity": capacity,
        "p_refill": refill_per_second,
        "p_window_s": window_s,
    }


def bucket_publish(
    dialect_name: str,
    name: str,
    *,
    kind: str,
    capacity: float,
    refill_per_second: float,
    window_s: float | None,
    config: dict[str, Any],
) -> Any:
    """Insert a bucket row for the admin page if there is none; never touches state."""
    stmt = db_dialect.insert(dialect_name, rate_limit_buckets).values(
        bucket_name=name,
        kind=kind,
        capacity=capacity,
        refill_per_second=refill_per_second,
        window_s=window_s,
        config=config,
        updated_at=db_dialect.now(dialect_name),
    )
    return stmt.on_conflict_do_nothing(index_elements=[_b.bucket_name])


@functools.cache
def bucket_store() -> Update:
    """Write a bucket's new state (the row is locked by :func:`bucket_lock_upsert`).

    Parameters: :func:`bucket_store_params`.
    """
    return (
        update(rate_limit_buckets)
        .where(_b.bucket_name == bindparam("p_name"))
        .values(
            tokens=bindparam("p_tokens"),
            updated_at=bindparam("p_updated_at", type_=UTCDateTime()),
            tat=bindparam("p_tat", type_=UTCDateTime()),
        )
    )


def bucket_store_params(
    name: str, *, tokens: float, updated_at: datetime, tat: datetime | None
) -> dict[str, Any]:
    """Parameters of :func:`bucket_store`."""
    return {"p_name": name, "p_tokens": tokens, "p_updated_at": updated_at, "p_tat": tat}


def bucket_read(dialect_name: str, name: str) -> Select[*tuple[Any, ...]]:
    """A bucket's state and the store's clock, without locking (for peek)."""
    return select(_b.kind, _b.tokens, _b.tat, _b.updated_at, db_now(dialect_name)).where(
        _b.bucket_name == name
    )


def now_only(dialect_name: str) -> Select[*tuple[Any, ...]]:
    """Just the store's clock."""
    return select(db_now(dialect_name))


def bucket_delete(name: str) -> Delete:
    """Forget a bucket's state (reset)."""
    return delete(rate_limit_buckets).where(_b.bucket_name == name)


def window_delete_all(name: str) -> Delete:
    """Drop every log entry of a bucket (reset)."""
    return delete(rate_limit_window_entries).where(_w.bucket_name == name)


def window_evict(name: str, cutoff: datetime) -> Delete:
    """Drop entries at or before ``cutoff``: they have left the window."""
    return delete(rate_limit_window_entries).where(_w.bucket_name == name, _w.created_at <= cutoff)


def window_stats(name: str, cutoff: datetime) -> Select[*tuple[Any, ...]]:
    """How many entries are inside the window, and the oldest one's time."""
    return select(func.count(), func.min(_w.created_at)).where(
        _w.bucket_name == name, _w.created_at > cutoff
    )


def window_refund(name: str, request_id: str) -> Delete:
    """Drop the entry of one accepted request (its refund)."""
    return delete(rate_limit_window_entries).where(
        _w.bucket_name == name, _w.request_id == request_id
    )


def window_insert(name: str, request_id: str, created_at: datetime) -> Any:
    """Record an accepted request."""
    return rate_limit_window_entries.insert().values(
        bucket_name=name, request_id=request_id, created_at=created_at
    )


def slots_ensure(dialect_name: str, name: str, slots: int) -> Any:
    """Create slot rows ``0 .. slots-1`` that are missing."""
    stmt = db_dialect.insert(dialect_name, reservation_slots).values(
        [{"name": name, "slot_index": i} for i in range(slots)]
    )
    return stmt.on_conflict_do_nothing(index_elements=[_s.name, _s.slot_index])


def _free(dialect_name: str) -> ColumnElement[bool]:
    return or_(_s.worker_id.is_(None), _s.lease_expires_at <= db_dialect.now(dialect_name))


def slot_claim(
    dialect_name: str,
    name: str,
    slots: int,
    *,
    job_id: UUID | None,
    worker_id: UUID,
    lease_s: float,
) -> Update:
    """Take the lowest free (or lapsed) slot in one statement; returns its ``slot_index``.

    The inner ``SELECT ... FOR UPDATE SKIP LOCKED`` lets concurrent claimers pass over each
    other's rows on Postgres; SQLite's write lock serialises them instead.
    """
    pick = (
        select(_s.slot_index)
        .where(_s.name == name, _s.slot_index < slots, _free(dialect_name))
        .order_by(_s.slot_index)
        .limit(1)
        .with_for_update(skip_locked=True)
        .scalar_subquery()
    )
    return (
        update(reservation_slots)
        .where(_s.name == name, _s.slot_index == pick)
        .values(
            job_id=job_id,
            worker_id=worker_id,
            acquired_at=db_dialect.now(dialect_name),
            lease_expires_at=db_dialect.now_plus(dialect_name, lease_s),
        )
        .returning(_s.slot_index)
    )


def slots_soonest_expiry(dialect_name: str, name: str, slots: int) -> Select[*tuple[Any, ...]]:
    """Slot rows: how many exist, how many are free, the soonest live lease end, and now."""
    free = _free(dialect_name)
    soonest = type_coerce(func.min(case((free, None), else_=_s.lease_expires_at)), UTCDateTime())
    return select(
        func.count(),
        func.coalesce(func.sum(case((free, 1), else_=0)), 0),
        soonest,
        db_now(dialect_name),
    ).where(_s.name == name, _s.slot_index < slots)


def slot_release(name: str, slot_index: int, worker_id: UUID) -> Update:
    """Free a slot, only if ``worker_id`` holds it."""
    return (
        update(reservation_slots)
        .where(_s.name == name, _s.slot_index == slot_index, _s.worker_id == worker_id)
        .values(job_id=None, worker_id=None, acquired_at=None, lease_expires_at=None)
    )


def slot_renew(
    dialect_name: str, name: str, slot_index: int, worker_id: UUID, lease_s: float
) -> Update:
    """Extend the lease of a slot ``worker_id`` holds (the heartbeat calls this)."""
    return (
        update(reservation_slots)
        .where(_s.name == name, _s.slot_index == slot_index, _s.worker_id == worker_id)
        .values(lease_expires_at=db_dialect.now_plus(dialect_name, lease_s))
    )


def slots_held(dialect_name: str, name: str) -> Select[*tuple[Any, ...]]:
    """Slots of ``name`` with an unexpired holder."""
    return (
        select(_s.slot_index, _s.job_id, _s.worker_id, _s.acquired_at, _s.lease_expires_at)
        .where(
            _s.name == name,
            _s.worker_id.is_not(None),
            _s.lease_expires_at > db_dialect.now(dialect_name),
        )
        .order_by(_s.slot_index)
    )


def slots_delete_excess(dialect_name: str, name: str, slots: int) -> Delete:
    """Delete slot rows at or past ``slots`` that nobody holds."""
    return delete(reservation_slots).where(
        _s.name == name, _s.slot_index >= slots, _free(dialect_name)
    )


def slots_held_excess(dialect_name: str, name: str, slots: int) -> Select[*tuple[Any, ...]]:
    """Count slot rows at or past ``slots`` still held (kept until released)."""
    return select(func.count()).where(
        and_(_s.name == name, _s.slot_index >= slots, ~_free(dialect_name))
    )


# --- Postgres: a whole acquire in ONE statement -------------------------------------------
#
# On Postgres a token-bucket or GCRA acquire is one autocommit statement, one round trip:
#
#   UPDATE rate_limit_buckets AS b SET <new state>
#   FROM (SELECT <state>, clock_timestamp() AS now FROM rate_limit_buckets
#         WHERE bucket_name = :name FOR UPDATE) AS o      -- the row lock serialises acquirers
#   WHERE b.bucket_name = o.bucket_name
#   RETURNING <decision>
#
# The decision is computed from ``o``, the row as locked: when a concurrent acquirer holds
# the lock, ``FOR UPDATE`` waits, then re-reads the row it committed (READ COMMITTED
# re-check), and the clock is read after the lock is granted; the UPDATE re-checks the
# same row. RETURNING may name ``o``, so the statement returns the state it decided from
# along with the decision (an upsert could not: its RETURNING sees only the new row). A
# bucket with no row yet updates nothing; the caller then runs the ``*_first_pg`` INSERT
# (``ON CONFLICT DO NOTHING``: a racing creator wins, and the caller retries the UPDATE).
# Time is exact: differences of ``timestamptz`` values are taken as microseconds through
# ``numeric`` (no float rounding), and the float maths is done in the same order as
# :func:`taskq.ratelimit._algorithms.tb_step`, so Postgres and Python agree bit for bit.
#
# Each statement also commits ASYNCHRONOUSLY (``set_config('synchronous_commit', 'off',
# true)`` in its RETURNING: local to the statement's own implicit transaction, so the
# pooled connection's setting is untouched). A durable commit waits for a WAL flush, which
# caps a logged single-row update at the disk's fsync rate (about 4,000/s here, far less
# under I/O load), and rate-limit state does not need it: visibility and row locking are
# unchanged (concurrent acquirers still serialise exactly), and a Postgres crash can lose
# at most the last few hundred milliseconds of acquires (``wal_writer_delay`` x 3), which
# then count as not taken, the same durability Redis gives with ``appendfsync everysec``.

EPS_TOKENS: Final = 1e-9
"""Token comparisons forgive this much float error (as in ``_algorithms``)."""

_US_PER_S: Final = 1_000_000

_PG_CONSTANTS: dict[int, tuple[str, dict[str, Any]]] = {}
"""Text and constants per compiled statement, by its id (``compile_once`` keeps every one)."""


def pg_sql(
    builder: Callable[[], Any],
    dialect: Dialect,
    schema_translate_map: Mapping[str | None, str | None] | None,
) -> tuple[str, dict[str, Any]]:
    """``builder()``'s statement as SQL text, compiled once per driver and schema map.

    Returns the text and the values of its constant parameters (the literals Core binds,
    such as ``'token_bucket'``); the caller adds its ``p_*`` parameters and runs it with
    ``exec_driver_sql``, so the hot path pays no compile, cache-key or bind-processing
    work. Results come back as the driver's values (``float``, ``bool``).
    """
    compiled = compile_once(builder.__name__, builder, dialect, schema_translate_map)
    cached = _PG_CONSTANTS.get(id(compiled))
    if cached is None:
        constants = {k: v for k, v in compiled.params.items() if not k.startswith("p_")}
        cached = _PG_CONSTANTS[id(compiled)] = (compiled.string, constants)
    return cached


def _us(later: ColumnElement[Any], earlier: ColumnElement[Any]) -> ColumnElement[Any]:
    """Microseconds from ``earlier`` to ``later`` (timestamps), exact, as ``numeric``."""
    return extract("epoch", later - earlier) * _US_PER_S


def _plus_us(ts: ColumnElement[Any], us: ColumnElement[Any]) -> ColumnElement[Any]:
    """``ts`` moved by ``us`` whole microseconds (exact below 2**53 us, about 285 years)."""
    one_us = literal(timedelta(microseconds=1), Interval())
    return ts + type_coerce(cast(us, Float()) * one_us, Interval())


def _async_commit() -> ColumnElement[Any]:
    """Make the statement's implicit transaction commit asynchronously (see above)."""
    return func.set_config("synchronous_commit", "off", true())


def _locked() -> Any:
    """The bucket row, locked, with the store's clock read once the lock is held."""
    return (
        select(
            _b.bucket_name.label("name"),
            _b.kind.label("kind"),
            _b.tokens.label("tokens"),
            _b.tat.label("tat"),
            _b.updated_at.label("ts"),
            func.clock_timestamp().label("now"),
        )
        .where(_b.bucket_name == bindparam("p_name"))
        .with_for_update()
        .subquery("o")
    )


def tb_take_pg() -> Update:
    """Token bucket: refill, try to take ``p_count``, write back; one statement.

    Parameters ``p_name``, ``p_capacity``, ``p_refill``, ``p_count``. Returns
    ``(allowed, current, tokens, _)``: the decision, the tokens before taking, the tokens
    stored after (the last column is the asynchronous-commit switch). A row of another
    kind, or with no tokens yet (published but unused), reads as full. A denied acquire
    leaves the state as it was. Zero rows: no row yet (see :func:`tb_first_pg`).
    """
    o = _locked()
    cap = bindparam("p_capacity", type_=Float())
    rate = bindparam("p_refill", type_=Float())
    count = bindparam("p_count", type_=Float())
    fresh = or_(o.c.kind != "token_bucket", o.c.tokens.is_(None), o.c.ts.is_(None))
    elapsed = func.greatest(0, cast(_us(o.c.now, o.c.ts), Float()))
    # The refill, computed once: OFFSET 0 keeps the planner from inlining this layer
    # (which would evaluate the expression once per use below).
    refill = (
        select(
            o.c.name,
            case((fresh, cap), else_=func.least(cap, o.c.tokens + elapsed * rate / 1e6)).label(
                "cur"
            ),
            case((fresh, o.c.now), else_=func.greatest(o.c.ts, o.c.now)).label("stamp"),
        )
        .offset(0)
        .subquery("r")
    )
    ok = refill.c.cur + EPS_TOKENS >= count
    decided = (
        select(
            refill.c.name,
            refill.c.cur,
            refill.c.stamp,
            ok.label("ok"),
            func.greatest(0.0, refill.c.cur - count).label("left"),
        )
        .offset(0)
        .subquery("d")
    )
    return (
        update(rate_limit_buckets)
        .where(_b.bucket_name == decided.c.name)
        .values(
            kind="token_bucket",
            capacity=cap,
            refill_per_second=rate,
            window_s=null(),
            tat=null(),
            tokens=case((decided.c.ok, decided.c.left), else_=_b.tokens),
            updated_at=case((decided.c.ok, decided.c.stamp), else_=_b.updated_at),
        )
        .returning(decided.c.ok, decided.c.cur, _b.tokens, _async_commit())
    )


def tb_first_pg() -> Any:
    """Token bucket, first use: create the row full minus ``p_count`` (always allowed).

    Same parameters and result shape as :func:`tb_take_pg`; no row when a concurrent
    acquirer created it first (run :func:`tb_take_pg` again).
    """
    cap = bindparam("p_capacity", type_=Float())
    count = bindparam("p_count", type_=Float())
    stmt = db_dialect.insert("postgresql", rate_limit_buckets).values(
        bucket_name=bindparam("p_name"),
        kind="token_bucket",
        capacity=cap,
        refill_per_second=bindparam("p_refill", type_=Float()),
        tokens=func.greatest(0.0, cap - count),
        updated_at=func.clock_timestamp(),
    )
    return stmt.on_conflict_do_nothing(index_elements=[_b.bucket_name]).returning(
        true(), type_coerce(cap, Float()), _b.tokens, _async_commit()
    )


def gcra_take_pg() -> Update:
    """GCRA: admit one request if the TAT allows it, advancing the TAT; one statement.

    Parameters ``p_name``, ``p_limit``, ``p_window_us``, ``p_step_us``, ``p_step_rem``
    (``divmod(window_us, limit)``), ``p_window_s``. Returns ``(allowed, value, _)``: the
    requests that would still pass now when allowed, else the wait in microseconds. A
    denied request leaves the state as it was. Zero rows: no row yet (see
    :func:`gcra_first_pg`).

    The maths is :func:`taskq.ratelimit._algorithms.gcra_step` on whole microseconds
    counted from the locked ``now`` (``bigint``; products with ``limit`` in ``numeric``,
    so nothing overflows or rounds). The TAT is ``tat + tokens / limit`` microseconds, the
    remainder kept in ``tokens``. Each layer is computed once (``OFFSET 0`` keeps the
    planner from inlining it into every use).
    """
    o = _locked()
    limit = bindparam("p_limit", type_=BigInteger())
    window_us = bindparam("p_window_us", type_=BigInteger())
    step_us = bindparam("p_step_us", type_=BigInteger())
    step_rem = bindparam("p_step_rem", type_=BigInteger())
    rem = cast(o.c.tokens, BigInteger())
    fresh = or_(
        o.c.kind != "gcra",
        o.c.tat.is_(None),
        o.c.tokens.is_(None),
        o.c.tat < o.c.now,
        and_(o.c.tat == o.c.now, rem == 0),
    )
    zero = literal(0, BigInteger())
    base = (
        select(
            o.c.name,
            o.c.now,
            case((fresh, zero), else_=cast(_us(o.c.tat, o.c.now), BigInteger())).label("off"),
            case((fresh, zero), else_=rem).label("rem"),
        )
        .offset(0)
        .subquery("g0")
    )
    carry = cast(base.c.rem + step_rem >= limit, Integer())
    step = (
        select(
            base.c.name,
            base.c.now,
            (base.c.rem + step_rem - carry * limit).label("new_rem"),
            (base.c.off + step_us + carry).label("new_off"),  # new TAT - now
        )
        .offset(0)
        .subquery("g1")
    )
    since_allow = cast(window_us - step.c.new_off, Numeric())  # now - (new TAT - window)
    ok = since_allow * cast(limit, Numeric()) >= step.c.new_rem
    remaining = func.greatest(
        0, func.div(since_allow * cast(limit, Numeric()) - step.c.new_rem, window_us)
    )
    wait = -since_allow + cast(step.c.new_rem > 0, Integer())
    decided = (
        select(
            step.c.name,
            step.c.now,
            step.c.new_off,
            step.c.new_rem,
            ok.label("ok"),
            cast(case((ok, remaining), else_=wait), Float()).label("value"),
        )
        .offset(0)
        .subquery("g2")
    )
    return (
        update(rate_limit_buckets)
        .where(_b.bucket_name == decided.c.name)
        .values(
            kind="gcra",
            capacity=cast(limit, Float()),
            refill_per_second=cast(limit, Float()) * 1e6 / cast(window_us, Float()),
            window_s=bindparam("p_window_s", type_=Float()),
            tat=case((decided.c.ok, _plus_us(decided.c.now, decided.c.new_off)), else_=_b.tat),
            tokens=case((decided.c.ok, cast(decided.c.new_rem, Float())), else_=_b.tokens),
            updated_at=case((decided.c.ok, decided.c.now), else_=_b.updated_at),
        )
        .returning(decided.c.ok, decided.c.value, _async_commit())
    )


def gcra_first_pg() -> Any:
    """GCRA, first use: create the row as after one request from a fresh state.

    Same parameters and result shape as :func:`gcra_take_pg`; no row when a concurrent
    acquirer created it first.
    """
    limit = bindparam("p_limit", type_=BigInteger())
    now = func.clock_timestamp()
    step_us = bindparam("p_step_us", type_=BigInteger())
    step_rem = bindparam("p_step_rem", type_=BigInteger())
    window_us = bindparam("p_window_us", type_=BigInteger())
    stmt = db_dialect.insert("postgresql", rate_limit_buckets).values(
        bucket_name=bindparam("p_name"),
        kind="gcra",
        capacity=cast(limit, Float()),
        refill_per_second=cast(limit, Float()) * 1e6 / cast(window_us, Float()),
        window_s=bindparam("p_window_s", type_=Float()),
        tokens=cast(step_rem, Float()),
        tat=_plus_us(now, step_us),
        updated_at=now,
    )
    # From a fresh state: remaining = ((window - step) * limit - step_rem) // window.
    remaining = func.div(
        cast(window_us - step_us, Numeric()) * cast(limit, Numeric()) - cast(step_rem, Numeric()),
        cast(window_us, Numeric()),
    )
    return stmt.on_conflict_do_nothing(index_elements=[_b.bucket_name]).returning(
        true(), cast(remaining, Float()), _async_commit()
    )
