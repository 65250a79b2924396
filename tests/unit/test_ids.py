"""Job ids: UUIDv7, strictly increasing in a process, never shared with a forked child."""

from __future__ import annotations

import os
import pickle
import sys
import uuid

import pytest

from taskq import _ids
from taskq._ids import new_job_id, new_job_ids


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


def test_batches_continue_the_sequence_and_equal_plain_uuids() -> None:
    before = new_job_id()
    batch = new_job_ids(10_000)  # more than 4096 ids: the counter carries into the next ms
    after = new_job_id()
    ids = [before, *batch, after]
    assert ids == sorted(ids)
    assert len(set(ids)) == len(ids)
    for made in batch[:50]:
        assert made.version == 7
        assert made.variant == uuid.RFC_4122
        same = uuid.UUID(int=made.int)
        assert (made, hash(made), str(made), made.bytes) == (
            same,
            hash(same),
            str(same),
            same.bytes,
        )
        assert pickle.loads(pickle.dumps(made)) == same
    assert new_job_ids(0) == []


def test_batch_ids_use_the_constructor_when_the_shortcut_is_unavailable(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(_ids, "_FAST_UUID", False)
    batch = new_job_ids(3)
    assert batch == sorted(batch)
    assert all(type(i) is uuid.UUID and i.version == 7 for i in batch)


def test_request_ids_are_random_uuid4_strings() -> None:
    made = [_ids.new_request_id() for _ in range(20_000)]  # spans many random blocks
    parsed = [uuid.UUID(text) for text in made]
    assert all(u.version == 4 and u.variant == uuid.RFC_4122 for u in parsed)
    assert [str(u) for u in parsed] == made  # the canonical lower-case form
    assert len(set(made)) == len(made)
    # every variant digit and every position varies: nothing but the fixed bits is fixed
    assert {text[19] for text in made} == set("89ab")
    for position in (0, 9, 15, 20, 35):
        assert len({text[position] for text in made}) == 16


@pytest.mark.skipif(sys.platform == "win32", reason="needs os.fork")
def test_a_forked_child_makes_other_request_ids() -> None:
    _ids.new_request_id()  # the parent now holds a partly read block of random bytes
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - runs in the child
        os.write(write_end, _ids.new_request_id().encode())
        os._exit(0)
    parent = _ids.new_request_id()
    os.waitpid(pid, 0)
    child = os.read(read_end, 36).decode()
    os.close(read_end)
    os.close(write_end)
    assert parent != child
