"""@actor: decoration-time validation, ActorRef properties, direct invocation, the page's shapes."""

from __future__ import annotations

import asyncio
import threading
from datetime import timedelta
from types import MappingProxyType
from uuid import uuid4

import pytest
from pydantic import BaseModel

from taskq import RetryPolicy, Snooze, actor
from taskq.actor import ActorRef, get_actor
from taskq.context import JobContext
from taskq.exceptions import PayloadValidationError


class ResizePayload(BaseModel):
    image_id: str
    width: int
    height: int


class ResizeResult(BaseModel):
    url: str


class OtherPayload(BaseModel):
    x: int


class DbSession:
    async def fetch_one(self, sql: str, *args: object) -> dict[str, object]:
        return {"sql": sql, "args": args}


class HttpClient:
    pass


def _ctx(payload: BaseModel) -> JobContext[ResizePayload]:
    return JobContext(uuid4(), "resize", "default", 1, uuid4(), payload)  # type: ignore[arg-type]


# --- the page's four handler shapes ---------------------------------------------------


@actor
async def resize_only(payload: ResizePayload) -> ResizeResult:
    return ResizeResult(url=f"https://cdn.example.com/{payload.image_id}")


@actor
async def resize_ctx(payload: ResizePayload, ctx: JobContext[ResizePayload]) -> ResizeResult:
    if ctx.cancellation_requested:
        raise Snooze(timedelta(minutes=1))
    return ResizeResult(url=f"https://cdn.example.com/{payload.image_id}")


@actor
async def resize_di(payload: ResizePayload, *, db: DbSession, http: HttpClient) -> ResizeResult:
    await db.fetch_one("SELECT * FROM images WHERE id = $1", payload.image_id)
    return ResizeResult(url="db")


@actor(queue="priority")
async def resize_all(
    payload: ResizePayload, ctx: JobContext[ResizePayload], *, db: DbSession
) -> ResizeResult:
    ctx.log.info("starting", attempt=ctx.attempt)
    return ResizeResult(url=str(ctx.attempt))


@actor(queue="media")
def generate_pdf(payload: ResizePayload) -> ResizeResult:
    return ResizeResult(url=threading.current_thread().name)


PAYLOAD = ResizePayload(image_id="abc", width=800, height=600)


async def test_handler_shapes_and_direct_invocation() -> None:
    assert (await resize_only(PAYLOAD)).url == "https://cdn.example.com/abc"
    assert (await resize_ctx(PAYLOAD, _ctx(PAYLOAD))).url.endswith("abc")
    assert (await resize_di(PAYLOAD, db=DbSession(), http=HttpClient())).url == "db"
    assert (await resize_all(PAYLOAD, _ctx(PAYLOAD), db=DbSession())).url == "1"
    assert resize_all.queue == "priority"
    assert resize_all.dependencies == {"db": DbSession}
    assert (resize_ctx.wants_ctx, resize_only.wants_ctx) == (True, False)


async def test_ctx_cancellation_snoozes() -> None:
    ctx = _ctx(PAYLOAD)
    ctx.request_cancel()
    with pytest.raises(Snooze):
        await resize_ctx(PAYLOAD, ctx)


async def test_sync_actor_runs_in_a_thread() -> None:
    assert generate_pdf.is_sync
    result = await generate_pdf(PAYLOAD)
    assert result.url != threading.current_thread().name


async def test_direct_invocation_argument_rules() -> None:
    with pytest.raises(TypeError):
        await resize_only(PAYLOAD, _ctx(PAYLOAD))
    with pytest.raises(TypeError):
        await resize_ctx(PAYLOAD)
    with pytest.raises(TypeError):
        await resize_di(PAYLOAD, db=DbSession())
    with pytest.raises(PayloadValidationError):
        await resize_only({"image_id": "a"})


def test_actor_ref_properties() -> None:
    @actor(
        name="process_order_props",
        queue="payments",
        retry=RetryPolicy(kind="transient", max_attempts=5, base=timedelta(seconds=10)),
        result_ttl=timedelta(hours=24),
        unique_for=timedelta(minutes=10),
        unique_states=("pending", "scheduled", "running"),
        max_pending=5000,
        max_concurrent=10,
        metadata={"team": "billing"},
        priority=7,
        rate_limits=["openai", "vendor_x"],
        reservations=["gpu_pool"],
        non_retryable_exceptions=(KeyError,),
    )
    async def process_order(payload: ResizePayload) -> ResizeResult:
        raise NotImplementedError

    ref = process_order
    assert isinstance(ref, ActorRef)
    assert (ref.name, ref.queue, ref.payload_type, ref.max_pending) == (
        "process_order_props",
        "payments",
        ResizePayload,
        5000,
    )
    assert ref.retry.max_attempts == 5
    assert ref.result_ttl == timedelta(hours=24)
    assert ref.unique_states == ("pending", "scheduled", "running")
    assert (ref.max_concurrent, ref.priority, ref.metadata) == (10, 7, {"team": "billing"})
    assert (ref.rate_limits, ref.reservations) == (["openai", "vendor_x"], ["gpu_pool"])
    assert ref.result_adapter.validate_python({"url": "u"}) == ResizeResult(url="u")
    assert get_actor("process_order_props") is ref
    assert ref.singleton is False


def test_defaults() -> None:
    ref = resize_only
    assert ref.name == "resize_only"
    assert ref.queue == "default"
    assert ref.retry == RetryPolicy()
    assert ref.unique_states == ("pending", "scheduled", "running", "succeeded")
    assert (ref.rate_limits, ref.reservations, ref.metadata) == ([], [], {})
    assert (ref.max_concurrent, ref.max_pending, ref.unique_for, ref.result_ttl) == (
        None,
        None,
        None,
        None,
    )


def test_fire_and_forget_result_is_none() -> None:
    @actor
    async def audit_log(payload: OtherPayload) -> None: ...

    assert audit_log.result_type is None
    assert audit_log.result_adapter.validate_python(None) is None


def _decorate(**options: object):  # type: ignore[no-untyped-def]
    def handler(payload: OtherPayload) -> None: ...

    return actor(**options)(handler)  # type: ignore[call-overload]


@pytest.mark.parametrize(
    ("options", "error", "fragment"),
    [
        ({"max_concurrent": -1}, ValueError, "max_concurrent"),
        ({"max_pending": -1}, ValueError, "max_pending"),
        ({"metadata": MappingProxyType({})}, TypeError, "metadata"),
        ({"metadata": {"singleton": True}}, ValueError, "metadata"),
        ({"singleton": 1}, TypeError, "singleton"),
        ({"queue": "a:b"}, ValueError, "queue"),
        ({"priority": 32768}, ValueError, "priority"),
        ({"retry": "fast"}, TypeError, "retry"),
        ({"unique_states": ("pending", "nope")}, ValueError, "unique_states"),
        ({"unique_for": timedelta(0)}, ValueError, "unique_for"),
        ({"rate_limits": ["bad name"]}, ValueError, "rate_limits"),
        ({"on_success": 3}, TypeError, "on_success"),
        ({"non_retryable_exceptions": (int,)}, TypeError, "non_retryable_exceptions"),
        ({"bogus": 1}, TypeError, "bogus"),
    ],
)
def test_option_validation(
    options: dict[str, object], error: type[Exception], fragment: str
) -> None:
    with pytest.raises(error, match=fragment):
        _decorate(name="validated", **options)


def test_signature_validation() -> None:
    with pytest.raises(TypeError, match="annotation"):

        @actor
        async def no_payload_annotation(payload) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(TypeError, match="return"):

        @actor
        async def no_return(payload: OtherPayload): ...  # type: ignore[no-untyped-def]

    with pytest.raises(TypeError, match="BaseModel"):

        @actor
        async def dict_payload(payload: dict) -> None: ...  # type: ignore[type-arg]

    with pytest.raises(TypeError, match="BaseModel"):

        @actor
        async def dict_result(payload: OtherPayload) -> dict:  # type: ignore[type-arg]
            raise NotImplementedError

    with pytest.raises(TypeError, match="does not match"):

        @actor
        async def wrong_ctx(payload: OtherPayload, ctx: JobContext[ResizePayload]) -> None: ...

    with pytest.raises(TypeError, match="annotation"):

        @actor
        async def untyped_dep(payload: OtherPayload, *, db) -> None: ...  # type: ignore[no-untyped-def]

    with pytest.raises(TypeError, match="args"):

        @actor
        async def variadic(payload: OtherPayload, **kwargs: object) -> None: ...


def test_rate_limit_ref_is_rejected() -> None:
    class RateLimitRef:
        pass

    with pytest.raises(TypeError, match="RateLimitRef"):
        _decorate(rate_limits=[RateLimitRef()])


def test_a_positional_only_dependency_is_rejected() -> None:
    """The worker passes dependencies by keyword; the context may stay positional-only."""

    class Db:
        pass

    with pytest.raises(TypeError, match="positional-only"):

        @actor(name="posonly_dep")
        async def posonly_dep(payload: OtherPayload, db: Db, /) -> None: ...

    @actor(name="posonly_ctx")
    async def posonly_ctx(payload: OtherPayload, ctx: JobContext[OtherPayload], /) -> None: ...

    assert posonly_ctx.wants_ctx


def test_limit_lists_take_only_their_own_primitives() -> None:
    import taskq.ratelimit as rl
    import taskq_sync.ratelimit as srl

    bucket = rl.TokenBucket("lists_tb", capacity=1, refill_per_second=1)
    window = srl.SlidingWindow("lists_sw", limit=1, window=timedelta(seconds=1))
    slots = rl.ConcurrencyReservation("lists_res", slots=1, lease=30)
    keyed_bucket = rl.KeyedRateLimitRef.typed(
        OtherPayload, base_name="lists_kb", key_fn=lambda p: "k", capacity=1, refill_per_second=1
    )
    keyed_slots = rl.KeyedReservationRef.typed(
        OtherPayload, base_name="lists_kr", key_fn=lambda p: "k", slots=1, lease=30
    )
    ok = _decorate(
        name="lists_ok",
        rate_limits=["named", bucket, window, keyed_bucket],
        reservations=["named", slots, keyed_slots],
    )
    assert len(ok.rate_limits) == 4
    assert len(ok.reservations) == 3
    wrong: list[tuple[str, object, str]] = [
        ("rate_limits", slots, "ConcurrencyReservation"),
        ("rate_limits", keyed_slots, "KeyedReservationRef"),
        ("rate_limits", 42, "int"),
        ("reservations", bucket, "TokenBucket"),
        ("reservations", keyed_bucket, "KeyedRateLimitRef"),
        ("reservations", rl.ReservationRef(name="lists_res"), "ReservationRef"),
    ]
    for param, item, shown in wrong:
        with pytest.raises(TypeError, match=f"{param}.*{shown}"):
            _decorate(name="lists_bad", **{param: [item]})


def test_jobcontext_helpers() -> None:
    ctx = _ctx(PAYLOAD)
    assert not ctx.should_abort()
    ctx.check_cancelled()
    ctx.request_cancel()
    assert ctx.should_abort()
    assert ctx.cancellation_requested
    with pytest.raises(asyncio.CancelledError):
        ctx.check_cancelled()


async def test_progress_validates_and_forwards() -> None:
    seen: list[dict[str, object]] = []

    async def sink(**fields: object) -> None:
        seen.append(fields)

    ctx = JobContext(uuid4(), "a", "q", 1, uuid4(), PAYLOAD, progress_sink=sink)
    await ctx.progress(step=1, percent=50.0, detail="half", data={"k": [1, 2]})
    assert seen == [{"step": 1, "percent": 50.0, "detail": "half", "data": {"k": [1, 2]}}]
    with pytest.raises(TypeError):
        await ctx.progress(data={1: "x"})  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="percent"):
        await ctx.progress(percent=101.0)
    with pytest.raises(ValueError, match=r"progress cannot be stored: inf at data\.k\.1"):
        await ctx.progress(data={"k": [1, float("inf")]})
    with pytest.raises(ValueError, match=r"progress cannot be stored: .* at detail: .*NUL"):
        await ctx.progress(detail="a\x00b")
    assert len(seen) == 1  # nothing refused reached the sink
    await ctx.progress(detail="NaN and Infinity are words here")
    assert seen[-1]["detail"] == "NaN and Infinity are words here"
