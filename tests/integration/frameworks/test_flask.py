"""Flask + Flask-SQLAlchemy on real Postgres: enqueue joins ``db.session``'s transaction.

Commit: exactly one job, run once by a real ``taskq worker`` process started without
``-q`` (it claims queue ``flask``, its actor's). An exception: no row, no job. A threaded
WSGI server hit by 8 threads admits exactly 20 requests through a capacity-20 bucket.
"""

from __future__ import annotations

import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from flask import Flask
from sqlalchemy import text
from sqlalchemy.engine import URL
from werkzeug.serving import make_server

from taskq.db.dialect import sync_url
from tests.integration.frameworks import flask_app
from tests.support.workers import spawn_worker, stop_worker

pytestmark = pytest.mark.e2e


@pytest.fixture
def app(pg_url: URL, redis_url: str, unique_name: str) -> Iterator[Flask]:
    url = sync_url(pg_url).render_as_string(hide_password=False)
    made = flask_app.create_app(url, redis_url=redis_url, bucket=f"{unique_name}_web")
    with made.app_context():
        flask_app.db.create_all()
    yield made
    with made.app_context():
        flask_app.db.drop_all()
        flask_app.taskq_ext.close()
        flask_app.db.engine.dispose()


def _counts(app: Flask) -> tuple[int, int]:
    with app.app_context():
        conn = flask_app.db.session.connection()
        orders = conn.execute(text("SELECT count(*) FROM flask_orders")).scalar_one()
        jobs = conn.execute(text("SELECT count(*) FROM taskq.jobs")).scalar_one()
        flask_app.db.session.rollback()
    return int(orders), int(jobs)


def test_commit_enqueues_one_job_that_a_worker_without_q_runs_once(
    app: Flask, pg_url: URL, tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    runs.touch()
    reply = app.test_client().post("/orders?item=book")
    assert reply.status_code == 200, reply.data
    order_id = reply.get_json()["order"]
    assert _counts(app) == (1, 1)
    proc = spawn_worker(
        sync_url(pg_url),
        "tests.integration.frameworks.flask_app:ACTORS",
        log_path=tmp_path / "worker.log",
        env={"FLASK_RUNS_FILE": str(runs)},
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not runs.read_text():
            time.sleep(0.1)
        with app.app_context():
            record: object = flask_app.taskq_ext.tq.get(_job_id(reply.get_json())).wait(timeout=30)
            assert record is None  # the actor returns nothing
    finally:
        assert stop_worker(proc) == 0, (tmp_path / "worker.log").read_text()
    assert runs.read_text().split() == [str(order_id)]
    log = (tmp_path / "worker.log").read_text()
    assert "not claimed" not in log


def _job_id(body: dict[str, Any]) -> Any:
    import uuid

    return uuid.UUID(body["job"])


def test_an_exception_in_the_view_leaves_no_row_and_no_job(app: Flask) -> None:
    app.config["PROPAGATE_EXCEPTIONS"] = False
    reply = app.test_client().post("/orders?item=x&fail=1")
    assert reply.status_code == 500
    assert _counts(app) == (0, 0)


def test_rollback_of_the_session_takes_the_job_with_it(app: Flask) -> None:
    with app.app_context():
        order = flask_app.FlaskOrder(item="y")
        flask_app.db.session.add(order)
        flask_app.db.session.flush()
        flask_app.taskq_ext.enqueue(flask_app.flask_ship, {"order_id": order.id})
        flask_app.db.session.rollback()
    assert _counts(app) == (0, 0)


def test_threaded_wsgi_server_admits_exactly_the_buckets_capacity(app: Flask) -> None:
    server = make_server("127.0.0.1", 0, app, threaded=True)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    url = f"http://127.0.0.1:{server.server_port}/limited"
    codes: Counter[int] = Counter()
    retry_after: list[str] = []
    lock = threading.Lock()

    def hit(n: int) -> None:
        for _ in range(n):
            try:
                with urllib.request.urlopen(url, timeout=30) as resp:
                    code = resp.status
            except urllib.error.HTTPError as err:
                code = err.code
                with lock:
                    retry_after.append(str(err.headers.get("Retry-After")))
            with lock:
                codes[code] += 1

    threads = [threading.Thread(target=hit, args=(10,)) for _ in range(8)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
    finally:
        server.shutdown()
    assert codes == Counter({200: 20, 429: 60})
    assert all(int(value) >= 1 for value in retry_after)


def test_the_extension_follows_flasks_conventions(pg_url: URL) -> None:
    from taskq.contrib.flask import TaskQ as FlaskTaskQ

    url = sync_url(pg_url).render_as_string(hide_password=False)
    # No Flask-SQLAlchemy: the database is SQLALCHEMY_DATABASE_URI, enqueues commit alone
    plain = Flask("plain")
    plain.config["SQLALCHEMY_DATABASE_URI"] = url
    ext = FlaskTaskQ(plain)
    assert "taskq" in plain.extensions
    with plain.app_context():
        assert ext.tq.engine.url.database == pg_url.database
        job = ext.enqueue(flask_app.flask_ship, {"order_id": 7})
        assert job.status() == "pending"
    # TASKQ_DATABASE_URL wins over SQLALCHEMY_DATABASE_URI; other TASKQ_* keys are settings
    other = Flask("other")
    other.config["SQLALCHEMY_DATABASE_URI"] = "postgresql+psycopg://nobody@127.0.0.1/nowhere"
    other.config["TASKQ_DATABASE_URL"] = url
    other.config["TASKQ_PAYLOAD_MAX_BYTES"] = 4096
    ext.init_app(other)  # one extension object, many apps (each its own TaskQ)
    with other.app_context():
        assert ext.tq.engine.url.database == pg_url.database
        assert ext.tq.settings.payload_max_bytes == 4096
        assert ext.tq.get(job.job_id).record is not None
        assert ext.tq is not plain.extensions["taskq"].tq
    with pytest.raises(RuntimeError, match="init_app"), Flask("bare").app_context():
        _ = ext.tq
    ext.close(plain)
    ext.close(other)
