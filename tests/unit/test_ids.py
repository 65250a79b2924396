"""Job ids: UUIDv7, strictly increasing in a process, never shared with a forked child."""

from __future__ import annotations

import os
import sys

import pytest

from taskq._ids import new_job_id


def test_ids_are_uuid7_increasing_and_unique() -> None:
    ids = [new_job_id() for _ in range(20_000)]  # spans several random blocks
    assert all(i.version == 7 for i in ids)
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(sys.platform == "win32", reason="needs os.fork")
def test_a_forked_child_draws_fresh_random_bits() -> None:
    new_job_id()  # the parent now holds a partly read block of random bytes
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(write_end, new_job_id().bytes)
        os._exit(0)
    parent = new_job_id().bytes
    os.waitpid(pid, 0)
    child = os.read(read_end, 16)
    os.close(read_end)
    os.close(write_end)
    assert parent[8:] != child[8:]
