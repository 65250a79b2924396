"""``@actor`` and ``ActorRef[P, R]``: declaring a job handler and validating it at import.

The decorator reads the handler's signature once: the payload model ``P`` (first
parameter), an optional ``ctx: JobContext[P]`` (second positional), the DI dependencies
(every other parameter, by annotated class) and the result type ``R``. Every mistake it
can see raises here, at decoration time, naming the actor and the parameter: ``TypeError``
for types and annotations, ``ValueError`` for out-of-range values.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import sys
import types
import typing
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any, Generic, TypeVar, cast, get_args, get_origin, overload

import structlog
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import PydanticSerializationError, to_json

from taskq._acompat import ato_thread
from taskq.constants import (
    DEFAULT_QUEUE,
    DEFAULT_UNIQUE_STATES,
    JOB_STATUSES,
    MAX_NAME_LENGTH,
    SMALLINT_MAX,
    SMALLINT_MIN,
    JobStatus,
    validate_queue_name,
)
from taskq.context import JobContext
from taskq.cron.schedule import Schedule, bind_schedules
from taskq.exceptions import PayloadValidationError
from taskq.retry import OnCancel, OnRetryExhausted, OnSuccess, RetryClassifierHook, RetryPolicy
from taskq.storable_json import (
    describe,
    document_size,
    first_hidden_nonfinite,
    first_unstorable,
    too_deep_error,
    too_large_error,
    unstorable_error,
)

__all__ = [
    "ActorRef",
    "actor",
    "find_actor",
    "get_actor",
    "registered_actors",
    "validate_actor_name",
]

P = TypeVar("P", bound=BaseModel)
R = TypeVar("R")

_log = structlog.get_logger("taskq.actor")
_ACTORS: dict[str, ActorRef[Any, Any]] = {}


def validate_actor_name(name: object) -> str:
    """An actor name: a non-empty ``str`` of at most 200 printable, non-space characters."""
    if not isinstance(name, str):
        raise TypeError(f"actor name must be a str, got {type(name).__name__}")
    if (
        not name
        or len(name) > MAX_NAME_LENGTH
        or not name.isprintable()
        or any(c.isspace() for c in name)
    ):
        raise ValueError(
            f"invalid actor name {name!r}: 1..{MAX_NAME_LENGTH} printable characters, no spaces"
        )
    return name


@dataclass(frozen=True, eq=False)
class ActorRef(Generic[P, R]):
    """A declared actor: its handler, its types and its options.

    Pass it to ``JobsClient.enqueue`` (``taskq`` or ``taskq_sync``) to queue a job. Calling
    it (``await ref(payload, ...)``; from blocking code ``asyncio.run(ref(payload, ...))``,
    a ``def`` actor included) runs the handler in-process, bypassing the queue: for tests
    and simulators. The same object serves both packages: ``taskq_sync.ActorRef`` is this
    class.
    """

    name: str
    queue: str
    payload_type: type[P]
    result_type: Any
    result_adapter: TypeAdapter[R]
    fn: Callable[..., Any]
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    result_ttl: timedelta | None = None
    singleton: bool = False
    max_concurrent: int | None = None
    max_pending: int | None = None
    metadata: dict[str, object] = field(default_factory=dict)
    unique_for: timedelta | None = None
    unique_states: tuple[JobStatus, ...] = cast("tuple[JobStatus, ...]", DEFAULT_UNIQUE_STATES)
    start_to_close: timedelta | None = None
    rate_limits: list[Any] = field(default_factory=list)
    reservations: list[Any] = field(default_factory=list)
    non_retryable_exceptions: tuple[type[BaseException], ...] = ()
    retry_classifier: RetryClassifierHook | None = None
    on_retry_exhausted: OnRetryExhausted | None = None
    on_retry_exhausted_timeout: float = 3.0
    on_success: OnSuccess | None = None
    on_success_timeout: float = 3.0
    on_cancel: OnCancel | None = None
    on_cancel_timeout: float = 3.0
    priority: int = 0
    wants_ctx: bool = False
    is_sync: bool = False
    dependencies: dict[str, type[object]] = field(default_factory=dict)
    schedules: tuple[Schedule, ...] = ()
    """Periodic jobs declared with the actor (``@actor(schedules=[...])``), each bound."""

    def __repr__(self) -> str:
        return f"<ActorRef {self.name!r} queue={self.queue!r}>"

    def validate_payload(self, payload: object) -> P:
        """Return ``payload`` as the actor's model; ``PayloadValidationError`` if it does not fit.

        A model instance of another class is re-validated from its fields, never trusted.
        """
        if type(payload) is self.payload_type:
            return payload
        raw = payload.model_dump() if isinstance(payload, BaseModel) else payload
        try:
            return self.payload_type.model_validate(raw)
        except ValidationError as exc:
            raise PayloadValidationError(self.name, exc.errors(include_url=False)) from exc

    def dump_payload(self, payload: object) -> dict[str, Any]:
        """Validate and serialise a payload to the JSON document stored on the job row.

        ``PayloadValidationError`` (nothing is written) for an infinite or NaN float
        (``finite_number``, in an ``Any``-typed field too), a NUL character
        (``string_nul``) or a lone surrogate (``string_surrogate``) anywhere in it, a
        value nested too deep to serialise (``too_deep``, naming the field), or a document
        over ``TASKQ_PAYLOAD_MAX_BYTES`` (``too_large``): see :mod:`taskq.storable_json`.
        """
        model = self.validate_payload(payload)
        document = self._dump_one(model)
        error = unstorable_error(document)
        if error is None and self._payload_has_any:
            hidden = first_hidden_nonfinite([model.model_dump()])
            error = hidden[1] if hidden is not None else None
        if error is None:
            limit = payload_max_bytes()
            if limit is not None and (size := document_size(document)) > limit:
                error = too_large_error(size, limit)
        if error is not None:
            raise PayloadValidationError(self.name, [error])
        return document

    def dump_payloads(self, payloads: Sequence[P]) -> list[dict[str, Any]]:
        """:meth:`dump_payload` of every item of ``payloads``, which are all instances of
        exactly the payload model (so nothing needs validating): one call into
        pydantic-core for the list instead of one ``model_dump`` each (a fifth of the
        cost). Checked for unstorable values as :meth:`dump_payload` is."""
        documents = self._dump_list(payloads)
        found = first_unstorable(documents)
        if found is None:
            found = self._hidden(payloads)
        if found is not None:
            raise PayloadValidationError(self.name, [found[1]])
        limit = payload_max_bytes()
        if limit is not None:
            for document in documents:
                if (size := document_size(document)) > limit:
                    raise PayloadValidationError(self.name, [too_large_error(size, limit)])
        return documents

    def dump_payloads_json(self, payloads: Sequence[P]) -> list[bytes]:
        """:meth:`dump_payloads` as the JSON text of each document (what a row stores, the
        bytes ``pydantic_core.to_json`` makes of it), for ``enqueue_many``'s bulk batches:
        the texts are made once and the storable check searches them."""
        documents = self._dump_list(payloads)
        found = None
        try:
            raws = list(map(to_json, documents))
        except PydanticSerializationError:  # a lone surrogate
            raws = None
        found = first_unstorable(documents, raws)
        if found is None:
            found = self._hidden(payloads)
        if found is not None:
            raise PayloadValidationError(self.name, [found[1]])
        assert raws is not None  # a surrogate would have been found
        limit = payload_max_bytes()
        if limit is not None:
            size = max(map(len, raws), default=0)
            if size > limit:
                raise PayloadValidationError(self.name, [too_large_error(size, limit)])
        return raws

    def _dump_one(self, model: BaseModel) -> dict[str, Any]:
        try:
            document: dict[str, Any] = model.model_dump(mode="json")
        except PydanticSerializationError:  # a value of a type pydantic cannot serialise
            raise
        except ValueError as exc:  # nested past the serialiser's depth: name the field
            error = too_deep_error(_deep_field(model), exc)
            raise PayloadValidationError(self.name, [error]) from None
        return document

    def _dump_list(self, payloads: Sequence[P]) -> list[dict[str, Any]]:
        try:
            dumped: list[dict[str, Any]] = self._payload_list_adapter.dump_python(
                list(payloads), mode="json"
            )
        except ValueError:
            for payload in payloads:  # the one too deep, with its field named
                self._dump_one(payload)
            raise
        return dumped

    def _hidden(self, payloads: Sequence[P]) -> tuple[int, dict[str, Any]] | None:
        """Infinite or NaN floats the JSON-mode dump of an ``Any`` field made ``null``."""
        if not self._payload_has_any:
            return None
        return first_hidden_nonfinite(self._payload_list_adapter.dump_python(list(payloads)))

    @functools.cached_property
    def _payload_has_any(self) -> bool:
        """Whether the payload model has an ``Any``-typed value somewhere (whose JSON-mode
        dump would turn an infinite or NaN float into ``null``)."""
        return _has_any_schema(self.payload_type.__pydantic_core_schema__)

    @functools.cached_property
    def _payload_list_adapter(self) -> TypeAdapter[list[P]]:
        item: Any = self.payload_type
        adapter: TypeAdapter[list[P]] = TypeAdapter(list[item])
        return adapter

    def dump_result(self, result: R) -> Any:
        """Serialise a handler's return value for ``jobs.result`` (JSON).

        ``ValueError`` for an infinite or NaN float, or a NUL character, anywhere in it
        (:mod:`taskq.storable_json`): the attempt fails with that error, as if the handler
        had raised it, instead of the result's write being refused by Postgres.
        """
        try:
            document = self.result_adapter.dump_python(result, mode="json")
        except PydanticSerializationError:
            raise
        except ValueError as exc:
            raise ValueError(
                f"actor {self.name!r} returned a result that cannot be stored: {exc}"
            ) from None
        error = unstorable_error(document)
        if error is None and _has_any_schema(self.result_adapter.core_schema):
            hidden = first_hidden_nonfinite([self.result_adapter.dump_python(result)])
            error = hidden[1] if hidden is not None else None
        if error is not None:
            raise ValueError(
                f"actor {self.name!r} returned a result that cannot be stored: " + describe(error)
            )
        return document

    def load_result(self, raw: Any) -> R:
        """Rebuild the typed result from the stored JSON (``JobHandle.wait`` uses this)."""
        return self.result_adapter.validate_python(raw)

    async def invoke(self, payload: P, ctx: JobContext[P] | None, deps: dict[str, object]) -> R:
        """Run the handler with resolved DI ``deps`` (the worker's entry point).

        A sync handler runs in a thread; an async one is awaited on the current loop.
        """
        args: tuple[object, ...] = (payload, ctx) if self.wants_ctx else (payload,)
        if self.is_sync:
            return cast("R", await ato_thread(functools.partial(self.fn, *args, **deps)))
        return cast("R", await self.fn(*args, **deps))

    async def __call__(self, payload: P, *args: Any, **kwargs: Any) -> R:
        """Direct in-process invocation: ``await ref(payload)`` or ``await ref(payload, ctx, **deps)``
        (``asyncio.run(ref(payload))`` from blocking code).

        ``TypeError`` when ``ctx`` is given to a handler without one, omitted for a handler
        that declares one, or a DI keyword is missing or unknown.
        """
        if self.wants_ctx and len(args) != 1:
            raise TypeError(
                f"actor {self.name!r} declares a JobContext: call it as (payload, ctx, ...)"
            )
        if not self.wants_ctx and args:
            raise TypeError(
                f"actor {self.name!r} takes no JobContext: call it as (payload, **deps)"
            )
        model = self.validate_payload(payload)
        call_args = (model, *args)
        inspect.signature(self.fn).bind(*call_args, **kwargs)
        return await self.invoke(model, args[0] if args else None, kwargs)


def get_actor(name: str) -> ActorRef[Any, Any]:
    """The actor declared in this process under ``name``; ``LookupError`` when there is none."""
    try:
        return _ACTORS[name]
    except KeyError:
        raise LookupError(
            f"unknown actor {name!r}: no @actor with that name was imported"
        ) from None


def find_actor(name: str) -> ActorRef[Any, Any] | None:
    """The actor declared in this process under ``name``, or ``None``."""
    return _ACTORS.get(name)


def registered_actors() -> dict[str, ActorRef[Any, Any]]:
    """A snapshot of every actor declared (imported) in this process, by name."""
    return dict(_ACTORS)


@overload
def actor(fn: Callable[..., Any], /) -> ActorRef[Any, Any]: ...
@overload
def actor(
    fn: None = None,
    /,
    *,
    name: str | None = None,
    queue: str = DEFAULT_QUEUE,
    retry: RetryPolicy | None = None,
    result_ttl: timedelta | None = None,
    singleton: bool = False,
    max_concurrent: int | None = None,
    max_pending: int | None = None,
    metadata: dict[str, object] | None = None,
    unique_for: timedelta | None = None,
    unique_states: tuple[JobStatus, ...] = ...,
    start_to_close: timedelta | None = None,
    rate_limits: Sequence[Any] | None = None,
    reservations: Sequence[Any] | None = None,
    non_retryable_exceptions: tuple[type[BaseException], ...] = (),
    retry_classifier: RetryClassifierHook | None = None,
    on_retry_exhausted: OnRetryExhausted | None = None,
    on_retry_exhausted_timeout: float = 3.0,
    on_success: OnSuccess | None = None,
    on_success_timeout: float = 3.0,
    on_cancel: OnCancel | None = None,
    on_cancel_timeout: float = 3.0,
    priority: int = 0,
    schedules: Sequence[Schedule] | None = None,
) -> Callable[[Callable[..., Any]], ActorRef[Any, Any]]: ...
def actor(
    fn: Callable[..., Any] | None = None, /, **options: Any
) -> ActorRef[Any, Any] | Callable[[Callable[..., Any]], ActorRef[Any, Any]]:
    """Declare a job handler. Plain (``@actor``) or parameterised (``@actor(queue=...)``).

    The handler takes a pydantic payload model, optionally a ``JobContext`` second, and
    any other parameter is a dependency resolved by its annotated class from the worker's
    DI registry; it returns a pydantic model or ``None``,
    ``async def`` or plain ``def`` (run on a worker thread). Returns an
    :class:`ActorRef` carrying the payload and result types. The options, all keywords,
    all validated here (``TypeError`` for a wrong type, ``ValueError`` for an
    out-of-range value):

    - ``name`` (the function's qualified name), ``queue`` (``"default"``), ``priority``
      (``0``, higher first): where and in what order its jobs run.
    - ``retry`` (a ``RetryPolicy``: 3 attempts, exponential backoff from 5 s),
      ``non_retryable_exceptions``, ``retry_classifier``, ``start_to_close`` (the
      per-attempt timeout): what a failure does.
    - ``singleton``, ``unique_for`` with ``unique_states``, ``max_pending``: what an
      enqueue refuses or deduplicates.
    - ``max_concurrent`` (fleet-wide, best effort), ``rate_limits`` and
      ``reservations`` (``taskq.ratelimit`` primitives or their names).
    - ``result_ttl``, ``metadata``; ``schedules`` (``Schedule`` values: periodic jobs).
    - ``on_success``, ``on_retry_exhausted``, ``on_cancel`` hooks, each with a
      ``*_timeout`` (3 s).

    ``max_concurrent``, ``max_pending`` and ``result_ttl`` only seed the stored
    ``actor_config`` row, which operators then own. The documentation's Actors page
    (``docs/actors.md``) has every option's type, default and rules.
    """
    caller = sys._getframe(1)
    localns = dict(caller.f_locals)
    if fn is not None:
        if options:
            raise TypeError("@actor takes options as keywords only: @actor(queue=...)")
        return _build(fn, localns, {})

    def decorate(handler: Callable[..., Any]) -> ActorRef[Any, Any]:
        return _build(handler, localns, options)

    return decorate


_DERIVED_FIELDS = frozenset(
    {"fn", "payload_type", "result_type", "result_adapter", "wants_ctx", "is_sync", "dependencies"}
)
"""The :class:`ActorRef` fields read from the handler's signature, not given as options."""

_OPTION_NAMES = frozenset(f.name for f in fields(ActorRef)) - _DERIVED_FIELDS
"""Every ``@actor`` option: the ``ActorRef`` fields, declared once there (the overload of
:func:`actor` and :func:`_check_options` are tested to name the same set)."""


def _build(
    fn: Callable[..., Any], localns: dict[str, Any], opts: dict[str, Any]
) -> ActorRef[Any, Any]:
    if not callable(fn) or isinstance(fn, ActorRef):
        raise TypeError(f"@actor decorates a function, got {fn!r}")
    unknown = set(opts) - _OPTION_NAMES
    if unknown:
        raise TypeError(f"@actor got unknown option(s): {sorted(unknown)}")
    raw_name = opts.get("name")
    name = validate_actor_name(raw_name if raw_name is not None else fn.__qualname__)

    def fail(param: str, message: str, exc: type[Exception] = TypeError) -> Exception:
        return exc(f"@actor {name!r}: {param}: {message}")

    sig = _signature(fn, name, localns, fail)
    values = _check_options(opts, fail)
    ref: ActorRef[Any, Any] = ActorRef(name=name, fn=fn, **sig, **values)
    if opts.get("schedules") is not None:
        try:
            ref = dataclasses.replace(ref, schedules=bind_schedules(ref, opts["schedules"]))
        except (TypeError, ValueError) as exc:
            kind = ValueError if isinstance(exc, ValueError) else TypeError
            raise fail("schedules", str(exc), kind) from exc
    _ACTORS[name] = ref
    return ref


def _resolve_hints(fn: Callable[..., Any], localns: dict[str, Any]) -> dict[str, Any]:
    globalns = getattr(fn, "__globals__", {})
    try:
        return typing.get_type_hints(fn, globalns=globalns, localns=localns)
    except NameError as exc:
        raise TypeError(f"@actor {fn.__qualname__!r}: cannot resolve an annotation: {exc}") from exc


def _signature(
    fn: Callable[..., Any], name: str, localns: dict[str, Any], fail: Callable[..., Exception]
) -> dict[str, Any]:
    hints = _resolve_hints(fn, localns)
    params = list(inspect.signature(fn).parameters.values())
    if not params or params[0].kind not in (
        inspect.Parameter.POSITIONAL_ONLY,
        inspect.Parameter.POSITIONAL_OR_KEYWORD,
    ):
        raise fail("payload", "the handler must take the payload as its first positional parameter")
    payload_param = params[0]
    if payload_param.name not in hints:
        raise fail(payload_param.name, "the payload parameter needs a type annotation")
    payload_type = hints[payload_param.name]
    if not (isinstance(payload_type, type) and issubclass(payload_type, BaseModel)):
        raise fail(
            payload_param.name,
            f"payload type must be a pydantic BaseModel subclass, got {payload_type!r}",
        )
    if "return" not in hints:
        raise fail("return", "the handler needs a return annotation (a BaseModel subclass or None)")
    result_type = hints["return"]
    if result_type is types.NoneType:
        result_type = None
    if result_type is not None and not (
        isinstance(result_type, type) and issubclass(result_type, BaseModel)
    ):
        raise fail(
            "return",
            f"result type must be a pydantic BaseModel subclass or None, got {result_type!r}",
        )

    wants_ctx = False
    deps: dict[str, type[object]] = {}
    for index, param in enumerate(params[1:], start=1):
        if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            raise fail(param.name, "*args/**kwargs are not allowed in an actor signature")
        annotation = hints.get(param.name, inspect.Parameter.empty)
        is_ctx = annotation is JobContext or get_origin(annotation) is JobContext
        if param.kind is inspect.Parameter.POSITIONAL_ONLY and not is_ctx:
            raise fail(
                param.name,
                "DI parameters are passed by keyword: make it keyword-only or positional, "
                "not positional-only",
            )
        if annotation is inspect.Parameter.empty:
            raise fail(param.name, "every DI parameter needs a type annotation (a concrete class)")
        if is_ctx:
            if index != 1 or param.kind is inspect.Parameter.KEYWORD_ONLY:
                raise fail(
                    param.name, "the JobContext parameter must be the second positional parameter"
                )
            ctx_args = get_args(annotation)
            if ctx_args and ctx_args[0] is not payload_type:
                raise fail(
                    param.name,
                    f"JobContext[{getattr(ctx_args[0], '__name__', ctx_args[0])}] does not match "
                    f"the payload type {payload_type.__name__}",
                )
            wants_ctx = True
            continue
        if not isinstance(annotation, type):
            raise fail(
                param.name, f"DI parameter annotation must be a concrete class, got {annotation!r}"
            )
        if issubclass(annotation, BaseModel) and annotation is payload_type:
            raise fail(param.name, "the payload type cannot be a DI dependency")
        deps[param.name] = annotation
    return {
        "payload_type": payload_type,
        "result_type": result_type,
        "result_adapter": TypeAdapter(result_type if result_type is not None else type(None)),
        "wants_ctx": wants_ctx,
        "is_sync": not inspect.iscoroutinefunction(fn),
        "dependencies": deps,
    }


def _timedelta_opt(value: object, param: str, fail: Callable[..., Exception]) -> timedelta | None:
    if value is None:
        return None
    if not isinstance(value, timedelta):
        raise fail(param, f"must be a timedelta or None, got {type(value).__name__}")
    if value <= timedelta(0):
        raise fail(param, "must be > 0", ValueError)
    return value


def _count_opt(value: object, param: str, fail: Callable[..., Exception]) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise fail(param, f"must be an int or None, got {type(value).__name__}")
    if value < 0:
        raise fail(param, f"must be >= 0, got {value}", ValueError)
    return value


def _timeout(value: object, param: str, fail: Callable[..., Exception]) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise fail(param, "must be a number of seconds")
    if not value > 0:
        raise fail(param, "must be > 0", ValueError)
    return float(value)


def _callable_opt(value: object, param: str, fail: Callable[..., Exception]) -> Any:
    if value is not None and not callable(value):
        raise fail(param, "must be callable or None")
    return value


_LIMIT_TYPES: dict[str, tuple[str, ...]] = {
    "rate_limits": ("TokenBucket", "SlidingWindow", "KeyedRateLimitRef"),
    "reservations": ("ConcurrencyReservation", "KeyedReservationRef"),
}
"""The primitives each list of ``@actor`` takes besides names, by class name: the model
layer does not import the rate-limit services (``taskq.ratelimit`` and its generated
``taskq_sync.ratelimit`` twin both qualify)."""


def _is_limit(item: object, param: str) -> bool:
    return any(
        cls.__name__ in _LIMIT_TYPES[param]
        and cls.__module__.startswith(("taskq.ratelimit", "taskq_sync.ratelimit"))
        for cls in type(item).__mro__
    )


def _limits(value: object, param: str, fail: Callable[..., Exception]) -> list[Any]:
    if value is None:
        return []
    if isinstance(value, str) or not isinstance(value, Sequence):
        raise fail(param, "must be a list")
    out: list[Any] = []
    for item in value:
        if type(item).__name__ in ("RateLimitRef", "ReservationRef"):
            raise fail(
                param, f"pass the primitive's name or the primitive, not a {type(item).__name__}"
            )
        if isinstance(item, str):
            from taskq.constants import validate_name

            try:
                validate_name(item, kind=param.removesuffix("s"))
            except ValueError as exc:
                raise fail(param, str(exc), ValueError) from exc
        elif not _is_limit(item, param):
            raise fail(
                param,
                f"items must be names or {', '.join(_LIMIT_TYPES[param])}, "
                f"got {type(item).__name__}",
            )
        out.append(item)
    return out


def _check_options(opts: dict[str, Any], fail: Callable[..., Exception]) -> dict[str, Any]:
    queue = opts.get("queue", DEFAULT_QUEUE)
    try:
        validate_queue_name(queue)
    except ValueError as exc:
        raise fail("queue", str(exc), ValueError) from exc
    retry = opts.get("retry")
    if retry is None:
        retry = RetryPolicy()
    elif not isinstance(retry, RetryPolicy):
        raise fail("retry", f"must be a RetryPolicy or None, got {type(retry).__name__}")
    singleton = opts.get("singleton", False)
    if not isinstance(singleton, bool):
        raise fail("singleton", f"must be a bool, got {type(singleton).__name__}")
    metadata = opts.get("metadata")
    if metadata is None:
        metadata = {}
    elif type(metadata) is not dict:
        raise fail("metadata", f"must be a plain dict or None, got {type(metadata).__name__}")
    if "singleton" in metadata:
        raise fail("metadata", 'the key "singleton" is reserved by the library', ValueError)
    try:
        json.dumps(metadata)
    except (TypeError, ValueError) as exc:
        raise fail("metadata", f"must be JSON-serialisable: {exc}") from exc
    unique_states = opts.get("unique_states", DEFAULT_UNIQUE_STATES)
    if not isinstance(unique_states, tuple) or not unique_states:
        raise fail("unique_states", "must be a non-empty tuple of job statuses")
    for status in unique_states:
        if status not in JOB_STATUSES:
            raise fail("unique_states", f"unknown status {status!r}", ValueError)
    nre = opts.get("non_retryable_exceptions", ())
    if not isinstance(nre, tuple) or not all(
        isinstance(t, type) and issubclass(t, BaseException) for t in nre
    ):
        raise fail("non_retryable_exceptions", "must be a tuple of exception classes")
    priority = opts.get("priority", 0)
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise fail("priority", "must be an int")
    if not SMALLINT_MIN <= priority <= SMALLINT_MAX:
        raise fail(
            "priority", f"must be in {SMALLINT_MIN}..{SMALLINT_MAX}, got {priority}", ValueError
        )
    return {
        "queue": queue,
        "retry": retry,
        "result_ttl": _timedelta_opt(opts.get("result_ttl"), "result_ttl", fail),
        "singleton": singleton,
        "max_concurrent": _count_opt(opts.get("max_concurrent"), "max_concurrent", fail),
        "max_pending": _count_opt(opts.get("max_pending"), "max_pending", fail),
        "metadata": metadata,
        "unique_for": _timedelta_opt(opts.get("unique_for"), "unique_for", fail),
        "unique_states": unique_states,
        "start_to_close": _timedelta_opt(opts.get("start_to_close"), "start_to_close", fail),
        "rate_limits": _limits(opts.get("rate_limits"), "rate_limits", fail),
        "reservations": _limits(opts.get("reservations"), "reservations", fail),
        "non_retryable_exceptions": nre,
        "retry_classifier": _callable_opt(opts.get("retry_classifier"), "retry_classifier", fail),
        "on_retry_exhausted": _callable_opt(
            opts.get("on_retry_exhausted"), "on_retry_exhausted", fail
        ),
        "on_success": _callable_opt(opts.get("on_success"), "on_success", fail),
        "on_cancel": _callable_opt(opts.get("on_cancel"), "on_cancel", fail),
        "on_retry_exhausted_timeout": _timeout(
            opts.get("on_retry_exhausted_timeout", 3.0), "on_retry_exhausted_timeout", fail
        ),
        "on_success_timeout": _timeout(
            opts.get("on_success_timeout", 3.0), "on_success_timeout", fail
        ),
        "on_cancel_timeout": _timeout(
            opts.get("on_cancel_timeout", 3.0), "on_cancel_timeout", fail
        ),
        "priority": priority,
        # Checked and bound in _build, once the ActorRef they bind to exists.
        "schedules": (),
    }


@functools.cache
def payload_max_bytes() -> int | None:
    """``TASKQ_PAYLOAD_MAX_BYTES``, read once per process (``cache_clear()`` re-reads it)."""
    from taskq.settings import TaskQSettings

    return TaskQSettings.load().payload_max_bytes


def _has_any_schema(schema: Any) -> bool:
    """Whether a pydantic core schema has an ``any`` node (searched once per model)."""
    stack = [schema]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, dict):
            if node.get("type") == "any":
                return True
            stack.extend(node.values())
        elif isinstance(node, (list, tuple)):
            stack.extend(node)
    return False


def _deep_field(model: BaseModel) -> tuple[str, ...]:
    """The first field of ``model`` whose value is too deep to serialise (``()`` if none)."""
    for name in type(model).model_fields:
        try:
            model.model_dump(mode="json", include={name})
        except ValueError:
            return (name,)
    return ()
