"""Actors for the client API tests and their generated sync twins (defined once: an actor
name registers once per process, and both modules are collected together)."""

from __future__ import annotations

from datetime import timedelta

from pydantic import BaseModel

from taskq import actor


class Item(BaseModel):
    n: int


class Doubled(BaseModel):
    doubled: int


@actor(name="client_api_double", queue="client_api", priority=4)
async def double(payload: Item) -> Doubled:
    return Doubled(doubled=payload.n * 2)


@actor(name="client_api_unique", unique_for=timedelta(minutes=10))
async def unique(payload: Item) -> None: ...
