"""The statements of a reservation slot handed from one job of a worker to the next, and
of its release with a wake-up for the other workers (:mod:`taskq.worker.admission`)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from sqlalchemy import Float, Update, bindparam, cast, func, literal, select, update

from taskq.db.dialect import now, now_plus
from taskq.db.tables import reservation_slots

__all__ = ["SLOT_FREED_PREFIX", "adopt_slot", "release_slot_notify", "slot_freed_payload"]

SLOT_FREED_PREFIX = "slot "
"""NOTIFY payloads starting with this name a freed reservation slot, not a queue (a queue
name has no space in it)."""

_s = reservation_slots.c


def slot_freed_payload(name: str) -> str:
    """The NOTIFY payload that says a slot of reservation ``name`` was released."""
    return SLOT_FREED_PREFIX + name


def adopt_slot(dialect_name: str) -> Update:
    """Tie a slot the worker kept from a job that ended to the job it has just claimed,
    with a fresh lease (one row: ``b_name``, ``b_slot``, ``b_job``, ``b_worker``,
    ``b_lease_s``).

    Fenced on the holder only: while the row names this worker nobody else holds the slot
    (a taker writes its own id under the row lock this update takes), even if the lease
    lapsed meanwhile. Changes no row when another worker took it.
    """
    lease = cast(bindparam("b_lease_s", type_=Float()), Float())
    return (
        update(reservation_slots)
        .where(
            _s.name == bindparam("b_name", type_=_s.name.type),
            _s.slot_index == bindparam("b_slot", type_=_s.slot_index.type),
            _s.worker_id == bindparam("b_worker", type_=_s.worker_id.type),
        )
        .values(
            job_id=bindparam("b_job", type_=_s.job_id.type),
            acquired_at=now(dialect_name),
            lease_expires_at=now_plus(dialect_name, lease),
        )
    )


def release_slot_notify(channel: str, name: str, slot_index: int, worker_id: UUID) -> Any:
    """Postgres: free a slot ``worker_id`` holds and, in the same statement, NOTIFY
    ``channel`` that it is free (delivered at commit; nothing sent when the slot was not
    this worker's)."""
    freed = (
        update(reservation_slots)
        .where(_s.name == name, _s.slot_index == slot_index, _s.worker_id == worker_id)
        .values(job_id=None, worker_id=None, acquired_at=None, lease_expires_at=None)
        .returning(_s.name)
        .cte("freed")
    )
    return select(
        func.pg_notify(literal(channel), literal(SLOT_FREED_PREFIX) + freed.c.name)
    ).select_from(freed)
