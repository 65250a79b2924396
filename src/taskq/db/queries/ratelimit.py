"""Statements of the SQL rate-limit backend and of reservation slots.

Built here, executed by :mod:`taskq.ratelimit._sql` and :mod:`taskq.ratelimit.reservation`
on Postgres and SQLite alike. Every name arrives as a bound parameter. The store's clock
(``clock_timestamp()`` on Postgres) is read in the same statement that locks the row, so
the decision and the time it is made at cannot disagree.
"""

from __future__ import annotations

import functools
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Delete,
    Interval,
    Select,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    or_,
    select,
    type_coerce,
    update,
)
from sqlalchemy.sql.elements import ColumnElement

from taskq.db import dialect as db_dialect
from taskq.db.tables import rate_limit_buckets, rate_limit_window_entries, reservation_slots
from taskq.db.types import UTCDateTime

__all__ = [
    "bucket_delete",
    "bucket_lock_params",
    "bucket_lock_upsert",
    "bucket_publish",
    "bucket_read",
    "bucket_store",
    "bucket_store_params",
    "db_now",
    "slot_claim",
    "slot_release",
    "slot_renew",
    "slots_delete_excess",
    "slots_ensure",
    "slots_held",
    "slots_held_excess",
    "slots_soonest_expiry",
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


def _now_plus(dialect_name: str, seconds: float) -> ColumnElement[Any]:
    if dialect_name == "postgresql":
        return func.clock_timestamp() + literal(timedelta(seconds=seconds), Interval())
    return func.strftime("%Y-%m-%d %H:%M:%f", "now", f"+{seconds:.6f} seconds")


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
            lease_expires_at=_now_plus(dialect_name, lease_s),
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
        .values(lease_expires_at=_now_plus(dialect_name, lease_s))
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
