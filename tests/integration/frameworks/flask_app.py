"""A real Flask + Flask-SQLAlchemy app for the framework tests (and its worker's actors).

``create_app(url)`` makes the app: ``POST /orders`` writes an order and enqueues
``flask_ship`` (queue ``flask``) in ``db.session``'s transaction; ``?fail=1`` raises
after both; ``GET /limited`` takes one token from a capacity-20 Redis bucket.
``ACTORS`` is what ``taskq worker tests.integration.frameworks.flask_app:ACTORS`` runs:
the actor appends its order id to the file ``$FLASK_RUNS_FILE``.
"""

from __future__ import annotations

import os

from flask import Flask, jsonify, request
from flask.typing import ResponseReturnValue
from flask_sqlalchemy import SQLAlchemy
from pydantic import BaseModel
from sqlalchemy import Integer, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from taskq import actor
from taskq.contrib.flask import TaskQ, too_many_requests
from taskq_sync.ratelimit import TokenBucket
from taskq_sync.ratelimit.registry import registry


class ShipOrder(BaseModel):
    order_id: int


@actor(name="flask_ship", queue="flask")
def flask_ship(payload: ShipOrder) -> None:
    with open(os.environ["FLASK_RUNS_FILE"], "a") as out:
        out.write(f"{payload.order_id}\n")


ACTORS = [flask_ship]


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)
taskq_ext = TaskQ(db=db)


class FlaskOrder(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_orders"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    item: Mapped[str] = mapped_column(String(50))


def create_app(url: str, *, redis_url: str, bucket: str) -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = url
    app.config["TASKQ_REDIS_URL"] = redis_url
    db.init_app(app)
    taskq_ext.init_app(app)
    registry.register(TokenBucket(bucket, capacity=20, refill_per_second=0.0001))

    @app.post("/orders")
    def place_order() -> ResponseReturnValue:
        order = FlaskOrder(item=str(request.args.get("item", "x")))
        db.session.add(order)
        db.session.flush()
        handle = taskq_ext.enqueue(flask_ship, ShipOrder(order_id=order.id))
        if request.args.get("fail"):
            raise RuntimeError("the view failed after the enqueue")
        db.session.commit()
        return jsonify(order=order.id, job=str(handle.job_id))

    @app.get("/limited")
    def limited() -> ResponseReturnValue:
        decision = taskq_ext.acquire_rate_limit(bucket)
        if not decision.allowed:
            return too_many_requests(decision)
        return "ok"

    return app
