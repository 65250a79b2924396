"""A pre-fork server in miniature: enqueue in the parent, then fork children that enqueue.

``python -m tests.e2e.frameworks.prefork_app URL CHILDREN PER_CHILD`` prints one line per
child, ``child <pid> <exit status>``, and exits 0 only if every child exited 0 in time.
A child that hangs is killed after 60 s and reported as ``child <pid> hung``.
"""

from __future__ import annotations

import os
import signal
import sys
import time

from pydantic import BaseModel

import taskq_sync
from taskq import actor


class Ping(BaseModel):
    n: int


@actor(name="t_prefork_ping")
async def ping(payload: Ping) -> None: ...


def main(url: str, children: int, per_child: int) -> int:
    tq = taskq_sync.TaskQ(url)
    tq.enqueue(ping, Ping(n=-1))  # the parent's pool and held connection are now live
    pids = []
    for c in range(children):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                for i in range(per_child):
                    tq.enqueue(ping, Ping(n=c * per_child + i))
            except BaseException as exc:
                print(f"child error {type(exc).__name__}: {exc}", flush=True)
                code = 1
            os._exit(code)
        pids.append(pid)
    ok = True
    deadline = time.monotonic() + 60
    for pid in pids:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                code = os.waitstatus_to_exitcode(status)
                print(f"child {pid} {code}", flush=True)
                ok = ok and code == 0
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                print(f"child {pid} hung", flush=True)
                ok = False
                break
            time.sleep(0.05)
    tq.enqueue(ping, Ping(n=-2))  # the parent's own connection still works after the forks
    tq.close()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))
