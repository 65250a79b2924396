"""Run by ``manage.py test`` (Django's runner, real Postgres, a real worker process).

Started by ``tests/integration/frameworks/test_django.py``, which checks the run passed
and that the test database was dropped.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from django.db import connection, transaction
from django.test import Client, TestCase, TransactionTestCase
from shop.actors import OrderRef, ship_order
from shop.models import Order, Shipment
from shop.tasks import add, boom

from taskq.contrib.django import enqueue, enqueue_on_commit, get_taskq
from taskq.contrib.django.testing import TaskQTestMixin, run_jobs_immediately

HERE = Path(__file__).resolve().parent.parent


def jobs_in_db() -> int:
    with connection.cursor() as cur:
        cur.execute("SELECT count(*) FROM taskq.jobs")
        return int(cur.fetchone()[0])


class Worker:
    """``manage.py taskq_worker`` on the test database, stopped with SIGTERM."""

    def __init__(self, *args: str) -> None:
        env = {**os.environ, "DJ_DB_NAME": connection.settings_dict["NAME"]}
        env["TASKQ_POLL_INTERVAL"] = "0.1"
        self.proc = subprocess.Popen(
            [sys.executable, "manage.py", "taskq_worker", *args],
            cwd=HERE,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def stop(self) -> str:
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        return out


def wait_terminal(job_id: Any, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    tq = get_taskq()
    while time.monotonic() < deadline:
        record = tq.get(job_id).record
        assert record is not None
        if record.is_terminal:
            return record.status
        time.sleep(0.1)
    raise AssertionError(f"job {job_id} not finished in {timeout}s")


class CommitAndRollback(TaskQTestMixin, TransactionTestCase):
    def test_commit_enqueues_exactly_one_job_that_a_worker_runs(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(user="a")
            handle = enqueue(ship_order, OrderRef(order_id=order.pk))
            # inside the block, on Django's connection: visible here, not committed
            self.assertEqual(jobs_in_db(), 1)
        worker = Worker()  # no -q: it claims queue "shop", its actor's
        try:
            self.assertEqual(wait_terminal(handle.job_id), "succeeded")
        finally:
            out = worker.stop()
        self.assertEqual(Shipment.objects.filter(order=order).count(), 1, out)
        self.assertEqual(jobs_in_db(), 1)

    def test_an_exception_leaves_no_row_and_no_job(self) -> None:
        with self.assertRaises(RuntimeError), transaction.atomic():
            order = Order.objects.create(user="b")
            enqueue(ship_order, OrderRef(order_id=order.pk))
            raise RuntimeError("view failed")
        self.assertEqual(Order.objects.count(), 0)
        self.assertEqual(jobs_in_db(), 0)

    def test_enqueue_on_commit_enqueues_after_the_commit_and_not_after_a_rollback(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(user="f")
            enqueue_on_commit(ship_order, OrderRef(order_id=order.pk))
            self.assertEqual(jobs_in_db(), 0)
        self.assertEqual(jobs_in_db(), 1)
        with self.assertRaises(RuntimeError), transaction.atomic():
            enqueue_on_commit(ship_order, OrderRef(order_id=order.pk))
            raise RuntimeError("rolled back")
        self.assertEqual(jobs_in_db(), 1)

    def test_tasks_backend_round_trip(self) -> None:
        ok = add.enqueue(2, 3)
        bad = boom.enqueue()
        self.assertEqual(ok.status, "READY")
        worker = Worker()
        try:
            wait_terminal(uuid.UUID(ok.id))
            wait_terminal(uuid.UUID(bad.id))
        finally:
            out = worker.stop()
        ok.refresh()
        bad.refresh()
        self.assertEqual(ok.status, "SUCCESSFUL", out)
        self.assertEqual(ok.return_value, 5)
        self.assertEqual(bad.status, "FAILED")
        self.assertEqual(bad.errors[0].exception_class_path, "builtins.ValueError")
        self.assertIn("boom from a task", bad.errors[0].traceback)
        self.assertEqual(add.get_result(ok.id).return_value, 5)

    def test_tasks_backend_signals_and_features(self) -> None:
        from taskq.contrib.django.tasks import TaskQBackend, task_backends

        backend = task_backends["default"]
        self.assertIsInstance(backend, TaskQBackend)
        self.assertTrue(
            backend.supports_defer
            and backend.supports_async_task
            and backend.supports_get_result
            and backend.supports_priority
        )
        signals = Path(self.tmp_signals())
        ok = add.enqueue(1, 1)
        bad = boom.enqueue()
        me = str(os.getpid())
        self.assertEqual(
            signals.read_text().split("\n")[:2],
            [f"enqueued {ok.id} READY {me}", f"enqueued {bad.id} READY {me}"],
        )
        worker = Worker()
        try:
            wait_terminal(uuid.UUID(ok.id))
            wait_terminal(uuid.UUID(bad.id))
        finally:
            out = worker.stop()
        lines = [line.split() for line in signals.read_text().splitlines()[2:]]
        by_result = {
            rid: [(name, status) for name, r, status, _ in lines if r == rid]
            for rid in (ok.id, bad.id)
        }
        self.assertEqual(
            by_result[ok.id], [("started", "RUNNING"), ("finished", "SUCCESSFUL")], out
        )
        self.assertEqual(by_result[bad.id], [("started", "RUNNING"), ("finished", "FAILED")])
        # sent in the worker, not here
        self.assertEqual({pid for *_, pid in lines}, {str(worker.proc.pid)})

    def tmp_signals(self) -> str:
        import tempfile

        fd, path = tempfile.mkstemp(prefix="dj-signals-")
        os.close(fd)
        os.environ["DJ_SIGNALS_FILE"] = path
        self.addCleanup(os.environ.pop, "DJ_SIGNALS_FILE", None)
        self.addCleanup(os.unlink, path)
        return path


class TaskOptions(TaskQTestMixin, TransactionTestCase):
    """taskq's options on ``@task`` (and Django's own queue/priority/run_after) reach the
    job, on Django 6.1 and on the django-tasks backport alike."""

    def test_a_task_with_taskq_options_runs_as_its_own_rate_limited_actor(self) -> None:
        from shop.tasks import LIMITED_API, limited

        from taskq.contrib.django.tasks import task_actor

        ref = task_actor(limited)
        self.assertEqual(ref.name, "django.task.shop.tasks.limited")
        self.assertEqual(ref.rate_limits, [LIMITED_API])
        self.assertEqual(ref.queue, "limited")
        result = limited.enqueue(4)
        record = get_taskq().get(uuid.UUID(result.id)).record
        assert record is not None
        self.assertEqual(record.actor, ref.name)
        self.assertEqual((record.queue, record.priority), ("limited", 20))
        worker = Worker()  # no -q: it claims the backend's QUEUES and its actors' queues
        try:
            wait_terminal(record.id)
        finally:
            out = worker.stop()
        result.refresh()
        self.assertEqual(result.status, "SUCCESSFUL", out)
        self.assertEqual(result.return_value, 40)

    def test_the_rate_limit_of_a_task_holds_its_jobs_back(self) -> None:
        from shop.tasks import throttled

        # capacity 2, next token in ~3 hours: two run, two wait (never started)
        ids = [uuid.UUID(throttled.enqueue(n).id) for n in range(4)]
        worker = Worker()
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                statuses = [status_of(i) for i in ids]
                if statuses.count("succeeded") == 2:
                    break
                time.sleep(0.1)
            time.sleep(1.0)  # a third run, if the limit let one through, would have had time
            statuses = [status_of(i) for i in ids]
        finally:
            out = worker.stop()
        self.assertEqual(statuses.count("succeeded"), 2, f"{statuses}\n{out}")
        waiting = [i for i, status in zip(ids, statuses, strict=True) if status != "succeeded"]
        for job_id in waiting:
            record = get_taskq().get(job_id).record
            assert record is not None
            self.assertIn(record.status, ("pending", "scheduled"))
            self.assertEqual(record.attempt, 0)

    def test_queue_priority_and_run_after_reach_the_job(self) -> None:
        from shop.tasks import limited

        run_after = datetime.now(UTC) + timedelta(hours=1)
        for task, actor_name in ((add, "django.task"), (limited, limited_actor_name())):
            result = task.using(queue_name="other", priority=-7, run_after=run_after).enqueue(1, 2)
            record = get_taskq().get(uuid.UUID(result.id)).record
            assert record is not None
            self.assertEqual(record.actor, actor_name)
            self.assertEqual((record.queue, record.priority), ("other", -7))
            self.assertEqual(record.status, "scheduled")
            self.assertEqual(record.scheduled_at, run_after)
            self.assertEqual(result.status, "READY")

    def test_unique_for_two_enqueues_of_one_call_in_the_window_make_one_job(self) -> None:
        from shop.tasks import notify, refresh_feed

        first = refresh_feed.enqueue("news")
        again = refresh_feed.enqueue("news")
        self.assertEqual(again.id, first.id)
        self.assertEqual(jobs_in_db(), 1)
        # another call (other arguments) is another identity
        other = refresh_feed.enqueue("news", full=True)
        self.assertNotEqual(other.id, first.id)
        self.assertEqual(jobs_in_db(), 2)
        # unique_key names the identity: the user, whatever the reason
        with transaction.atomic():  # twice in one transaction: still one job
            a = notify.enqueue(7, reason="signup")
            b = notify.enqueue(7, reason="again")
        self.assertEqual(a.id, b.id)
        self.assertNotEqual(notify.enqueue(8).id, a.id)
        self.assertEqual(jobs_in_db(), 4)
        # a finished job still holds its identity for the window: its result comes back
        worker = Worker()
        try:
            wait_terminal(uuid.UUID(first.id))
        finally:
            out = worker.stop()
        after = refresh_feed.enqueue("news")
        self.assertEqual(after.id, first.id)
        self.assertEqual(after.status, "SUCCESSFUL", out)
        self.assertEqual(after.return_value, "news")
        self.assertEqual(jobs_in_db(), 4)

    def test_unique_key_without_unique_for_is_refused_when_declared(self) -> None:
        from shop import tasks

        with self.assertRaisesMessage(Exception, "unique_key has no effect without unique_for"):
            tasks.task(unique_key=lambda n: str(n))(tasks.undecorated)


def status_of(job_id: uuid.UUID) -> str:
    record = get_taskq().get(job_id).record
    assert record is not None
    return record.status


def limited_actor_name() -> str:
    return "django.task.shop.tasks.limited"


class NestedAtomic(TaskQTestMixin, TestCase):
    def test_a_rolled_back_savepoint_takes_its_job_with_it(self) -> None:
        with transaction.atomic():
            order = Order.objects.create(user="c")
            enqueue(ship_order, OrderRef(order_id=order.pk))
            try:
                with transaction.atomic():  # a savepoint
                    enqueue(ship_order, OrderRef(order_id=order.pk))
                    self.assertEqual(jobs_in_db(), 2)
                    raise RuntimeError("inner fails")
            except RuntimeError:
                pass
            self.assertEqual(jobs_in_db(), 1)
        self.assertEqual(jobs_in_db(), 1)

    def test_enqueue_on_commit_waits_for_the_commit(self) -> None:
        with self.captureOnCommitCallbacks(execute=False) as callbacks, transaction.atomic():
            order = Order.objects.create(user="e")
            enqueue_on_commit(ship_order, OrderRef(order_id=order.pk))
            self.assertEqual(jobs_in_db(), 0)
        self.assertEqual(len(callbacks), 1)
        self.assertEqual(jobs_in_db(), 0)  # not before the commit runs the callback

    def test_djangos_connection_given_to_the_plain_facade_is_a_clear_type_error(self) -> None:
        with self.assertRaisesMessage(TypeError, "taskq.contrib.django"):
            get_taskq().enqueue(ship_order, OrderRef(order_id=1), connection=connection)
        # through the integration the same connection is accepted
        with transaction.atomic():
            enqueue(ship_order, OrderRef(order_id=1), connection=connection)
        self.assertEqual(jobs_in_db(), 1)

    def test_immediate_mode_runs_the_actor_in_process_and_writes_no_job(self) -> None:
        order = Order.objects.create(user="d")
        with run_jobs_immediately():
            enqueue(ship_order, {"order_id": order.pk})
        self.assertEqual(Shipment.objects.filter(order=order).count(), 1)
        self.assertEqual(jobs_in_db(), 0)

    def test_keyed_per_user_bucket_from_a_view(self) -> None:
        client = Client()
        codes: dict[str, list[int]] = {"u1": [], "u2": []}
        for _ in range(5):
            codes["u1"].append(client.get("/orders/u1").status_code)
        for _ in range(4):
            codes["u2"].append(client.get("/orders/u2").status_code)
        self.assertEqual(codes["u1"], [200, 200, 200, 429, 429])
        self.assertEqual(codes["u2"], [200, 200, 200, 429])
        denied = client.get("/orders/u1")
        self.assertEqual(denied.status_code, 429)
        self.assertGreaterEqual(int(denied["Retry-After"]), 1)
        self.assertEqual(Order.objects.count(), 6)
        self.assertEqual(jobs_in_db(), 6)
