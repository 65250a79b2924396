"""Flask + Flask-SQLAlchemy + taskq: a view writes an order and enqueues its shipping job
in the same transaction; the job calls a rate-limited outgoing API.

Run it with the two commands of README.md. ``POST /orders`` places an order;
``/shipping-api`` stands in for the shipping company's API (the job calls it over HTTP,
at most 2 calls a second fleet-wide: the ``shipping_api`` bucket, kept in Postgres).
"""

from __future__ import annotations

import os
import urllib.request

from flask import Flask, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from pydantic import BaseModel

from taskq import actor
from taskq.contrib.flask import TaskQ
from taskq.ratelimit import TokenBucket
from taskq_sync.db.engine import make_engine
from taskq_sync.db.migrate import upgrade

DATABASE_URL = os.environ.get(
    "TASKQ_DATABASE_URL", "postgresql+psycopg://postgres@127.0.0.1/postgres"
)
API_URL = os.environ.get("SHIPPING_API_URL", "http://127.0.0.1:5000/shipping-api")

SHIPPING_API = TokenBucket("shipping_api", capacity=2, refill_per_second=2, backend="postgres")


class Ship(BaseModel):
    order_id: int


@actor(name="flask_example_ship", queue="shipping", rate_limits=[SHIPPING_API])
def ship(payload: Ship) -> None:
    """Book the shipment with the (rate-limited) shipping API."""
    with urllib.request.urlopen(f"{API_URL}?order={payload.order_id}", timeout=10) as reply:
        reply.read()


ACTORS = [ship]

db = SQLAlchemy()
tq = TaskQ(db=db)


class Order(db.Model):  # type: ignore[name-defined,misc]
    id = db.Column(db.Integer, primary_key=True)
    item = db.Column(db.String(100), nullable=False)


def create_app() -> Flask:
    app = Flask(__name__)
    app.config["SQLALCHEMY_DATABASE_URI"] = DATABASE_URL
    db.init_app(app)
    tq.init_app(app)

    @app.post("/orders")
    def place_order():  # type: ignore[no-untyped-def]
        order = Order(item=request.args.get("item", "book"))
        db.session.add(order)
        db.session.flush()
        job = tq.enqueue(ship, Ship(order_id=order.id))  # in db.session's transaction
        db.session.commit()  # the order and its job, together
        return jsonify(order=order.id, job=str(job.job_id))

    @app.get("/shipping-api")
    def shipping_api():  # type: ignore[no-untyped-def]
        return jsonify(booked=request.args["order"])

    with app.app_context():
        db.create_all()
    return app


if __name__ == "__main__":
    engine = make_engine(DATABASE_URL)
    upgrade(engine)  # taskq's tables (the same as `taskq migrate up`)
    engine.dispose()
    create_app().run(port=int(os.environ.get("PORT", "5000")), threaded=True)
