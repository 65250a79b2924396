"""The hot path's own reply reader (``_resp.parse_reply`` and ``_redis_utils._read_reply``,
blocking and asyncio) reads what redis-py's readers read, to the same values.

redis-py's pure-Python RESP2 and RESP3 readers are the oracle: each generated reply is
written to one end of a socket pair and read from the other by redis-py's reader on a
``redis.Connection``, and parsed by ours; the values (and error replies) must be equal,
and every proper prefix of a reply must be incomplete. Then ``_read_reply`` on both
flavours: a reply in pieces, and what it does with what is not one whole reply (bytes
after it, a closed peer, a timeout, a push message before it, a cancelled read).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest
import redis
import redis.asyncio
from hypothesis import given, settings
from hypothesis import strategies as st
from redis._parsers.resp2 import _RESP2Parser
from redis._parsers.resp3 import _RESP3Parser
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

import taskq_sync.ratelimit._redis_utils as srru
from taskq.ratelimit import _redis_utils as arru
from taskq.ratelimit._resp import IncompleteReply, ProtocolError, Push, parse_reply

_READERS: dict[int, Any] = {2: _RESP2Parser, 3: _RESP3Parser}
_CONNECTION: Any = redis.Connection  # redis-py leaves it untyped
_ASYNC_CONNECTION: Any = redis.asyncio.Connection
text = st.binary(max_size=40)
words = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=1, max_size=12)


def _line(kind: bytes, body: bytes) -> bytes:
    return kind + body + b"\r\n"


def _blob(kind: bytes, body: bytes) -> bytes:
    return kind + b"%d\r\n" % len(body) + body + b"\r\n"


def _resp2() -> st.SearchStrategy[bytes]:
    leaves = st.one_of(
        text.map(lambda b: _blob(b"$", b)),
        st.just(b"$-1\r\n"),
        st.just(b"*-1\r\n"),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: _line(b":", b"%d" % i)),
        words.map(lambda w: _line(b"+", w.encode())),
        words.map(lambda w: _line(b"-", b"ERR " + w.encode())),
    )
    return st.recursive(
        leaves,
        lambda inner: st.lists(inner, max_size=4).map(
            lambda items: b"*%d\r\n" % len(items) + b"".join(items)
        ),
        max_leaves=8,
    )


def _resp3() -> st.SearchStrategy[bytes]:
    leaves = st.one_of(
        text.map(lambda b: _blob(b"$", b)),
        text.map(lambda b: _blob(b"=", b"txt:" + b)),
        words.map(lambda w: _blob(b"!", b"ERR " + w.encode())),
        st.just(b"_\r\n"),
        st.integers(-(2**63), 2**63 - 1).map(lambda i: _line(b":", b"%d" % i)),
        st.integers().map(lambda i: _line(b"(", b"%d" % i)),
        st.floats(allow_nan=False).map(lambda f: _line(b",", repr(f).encode())),
        st.sampled_from([b"#t\r\n", b"#f\r\n"]),
        words.map(lambda w: _line(b"+", w.encode())),
    )
    keys = words.map(lambda w: _blob(b"$", w.encode()))

    def aggregates(inner: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
        arrays = st.tuples(st.sampled_from([b"*", b"~"]), st.lists(inner, max_size=4)).map(
            lambda t: t[0] + b"%d\r\n" % len(t[1]) + b"".join(t[1])
        )
        maps = st.dictionaries(keys, inner, max_size=3).map(
            lambda d: b"%%%d\r\n" % len(d) + b"".join(k + v for k, v in d.items())
        )
        return arrays | maps

    return st.recursive(leaves, aggregates, max_leaves=8)


def _connection(
    sock: socket.socket, protocol: int, decode: bool = False, socket_timeout: float = 1.0
) -> Any:
    """A redis-py connection reading ``sock`` with its pure-Python reader for ``protocol``."""
    conn: Any = _CONNECTION(
        protocol=protocol, socket_timeout=socket_timeout, decode_responses=decode
    )
    assert conn._parser.__class__ is _READERS[protocol]  # not hiredis's
    conn._sock = sock
    conn._parser.on_connect(conn)
    return conn


def _redis_py(reply: bytes, protocol: int, decode: bool) -> Any:
    """What redis-py's own reader makes of ``reply``: the value, or the error reply."""
    ours, theirs = socket.socketpair()
    conn = _connection(ours, protocol, decode)
    try:
        theirs.sendall(reply)
        return conn._parser.read_response()
    except ResponseError as exc:  # a top-level error reply is raised, not returned
        return exc
    finally:
        conn._sock = None
        ours.close()
        theirs.close()


def _normal(value: Any) -> Any:
    """Error replies compare by class and message; a set is a list to both readers."""
    if isinstance(value, BaseException):
        return (type(value), str(value))
    if isinstance(value, list):
        return [_normal(v) for v in value]
    if isinstance(value, dict):
        return {k: _normal(v) for k, v in value.items()}
    return value


def _ours(reply: bytes, protocol: int, decode: bool) -> Any:
    parser = _READERS[protocol]
    encoder = _CONNECTION(decode_responses=decode).encoder
    value, end = parse_reply(reply, encoder.decode, parser.parse_error)
    assert end == len(reply)
    return value


@pytest.mark.parametrize("protocol", [2, 3])
@settings(max_examples=300, deadline=None)
@given(data=st.data(), decode=st.booleans())
def test_replies_parse_as_redis_pys_reader_reads_them(
    protocol: int, data: st.DataObject, decode: bool
) -> None:
    reply = data.draw(_resp2() if protocol == 2 else _resp3(), label="reply")
    try:
        expected = _normal(_redis_py(reply, protocol, decode))
    except UnicodeDecodeError:
        with pytest.raises(UnicodeDecodeError):
            _ours(reply, protocol, decode)
        return
    assert _normal(_ours(reply, protocol, decode)) == expected


@settings(max_examples=100, deadline=None)
@given(reply=_resp3())
def test_every_proper_prefix_of_a_reply_is_incomplete(reply: bytes) -> None:
    for cut in range(len(reply)):
        with pytest.raises(IncompleteReply):
            parse_reply(reply[:cut], bytes, ResponseError)


@pytest.mark.parametrize(
    "data",
    [b"?3\r\n", b"\r\n", b"$x\r\n", b":1.5\r\n", b"$3\r\nabcd\r\n", b"*z\r\n", b",nope\r\n"],
)
def test_bytes_that_are_no_reply_are_a_protocol_error(data: bytes) -> None:
    with pytest.raises(ProtocolError):
        parse_reply(data, bytes, ResponseError)


def test_a_push_message_parses_as_a_push() -> None:
    data = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n$1\r\nx\r\n"
    push, end = parse_reply(data, bytes, ResponseError)
    assert push.__class__ is Push
    assert push == [b"message", b"c", b"hi"]
    assert parse_reply(data, bytes, ResponseError, end) == (b"x", len(data))


class _End:
    """Our end of a socket pair as a redis-py connection of one flavour (``sync``: its
    socket; ``async``: a stream over it), the other end the server's (``server``), and
    what ``_read_reply`` did to the connection: disconnects and pushes handed on."""

    def __init__(self, flavour: str, conn: Any, source: Any, server: socket.socket) -> None:
        self.flavour = flavour
        self.conn = conn
        self.source = source
        self.server = server
        self.disconnects = 0
        self.pushes: list[list[Any]] = []
        conn.disconnect = self._disconnect if flavour == "sync" else self._adisconnect
        if hasattr(conn._parser, "handle_push_response"):  # RESP3's readers only
            conn._parser.handle_push_response = (
                self.pushes.append if flavour == "sync" else self._apush
            )

    async def read(self) -> Any:
        """``_read_reply`` of this end's flavour."""
        if self.flavour == "sync":
            return srru._read_reply(self.conn, self.source)
        return await arru._read_reply(self.conn, self.source)

    def _disconnect(self, *args: Any, **kwargs: Any) -> None:
        self.disconnects += 1

    async def _adisconnect(self, *args: Any, **kwargs: Any) -> None:
        self.disconnects += 1

    async def _apush(self, response: list[Any]) -> None:
        self.pushes.append(response)


MakeEnd = Callable[..., Awaitable[_End]]


@pytest.fixture(params=["sync", "async"])
async def make_end(request: pytest.FixtureRequest) -> AsyncIterator[MakeEnd]:
    """Makes :class:`_End` s of the test's flavour (each test runs with both)."""
    flavour: str = request.param
    closers: list[Any] = []

    async def make(protocol: int, decode: bool = False, socket_timeout: float = 1.0) -> _End:
        ours, theirs = socket.socketpair()
        closers.extend((ours, theirs))
        if flavour == "sync":
            ours.settimeout(socket_timeout)
            return _End(flavour, _connection(ours, protocol, decode, socket_timeout), ours, theirs)
        reader, writer = await asyncio.open_connection(sock=ours)
        closers.append(writer)
        conn: Any = _ASYNC_CONNECTION(
            protocol=protocol, socket_timeout=socket_timeout, decode_responses=decode
        )
        assert conn._parser.__class__.__name__ == f"_AsyncRESP{protocol}Parser"  # no hiredis
        conn._reader, conn._writer = reader, writer
        conn._parser.on_connect(conn)
        return _End(flavour, conn, reader, theirs)

    yield make
    for closer in closers:
        closer.close()


@pytest.fixture
def read_size(monkeypatch: pytest.MonkeyPatch) -> Callable[[int], None]:
    """Sets how many bytes each read of ``_read_reply`` asks for (both flavours)."""

    def set_size(size: int) -> None:
        monkeypatch.setattr(srru, "_READ_SIZE", size)
        monkeypatch.setattr(arru, "_READ_SIZE", size)

    return set_size


@pytest.mark.parametrize("protocol", [2, 3])
async def test_a_reply_in_pieces_is_read_whole(
    make_end: MakeEnd, protocol: int, read_size: Callable[[int], None]
) -> None:
    end = await make_end(protocol, decode=True)
    read_size(1)  # one byte per read
    end.server.sendall(b"$9\r\n0 41 -1.5\r\n")
    assert await end.read() == "0 41 -1.5"
    assert end.disconnects == 0


@pytest.mark.parametrize("protocol", [2, 3])
async def test_an_error_reply_is_raised_and_keeps_the_connection(
    make_end: MakeEnd, protocol: int
) -> None:
    end = await make_end(protocol)
    end.server.sendall(b"-NOSCRIPT No matching script. Please use EVAL.\r\n")
    with pytest.raises(NoScriptError, match="No matching script"):
        await end.read()
    assert end.disconnects == 0
    end.server.sendall(b"$1\r\n1\r\n")
    assert await end.read() == b"1"  # still in step with the stream


async def test_an_error_redis_py_counts_as_a_connection_error_disconnects(
    make_end: MakeEnd,
) -> None:
    end = await make_end(3)
    end.server.sendall(b"-LOADING Redis is loading the dataset in memory\r\n")
    with pytest.raises(RedisConnectionError, match="loading"):
        await end.read()
    assert end.disconnects == 1


async def test_bytes_after_the_reply_disconnect(make_end: MakeEnd) -> None:
    end = await make_end(3)
    end.server.sendall(b"+PONG\r\n$1\r\n1\r\n")  # a reply nobody asked for, then the one
    with pytest.raises(RedisConnectionError, match="bytes after the reply"):
        await end.read()
    assert end.disconnects == 1


async def test_garbage_disconnects_as_a_connection_error(make_end: MakeEnd) -> None:
    end = await make_end(2)
    end.server.sendall(b"HTTP/1.1 400 Bad Request\r\n")
    with pytest.raises(RedisConnectionError, match="Protocol Error"):
        await end.read()
    assert end.disconnects == 1


async def test_a_closed_peer_disconnects(make_end: MakeEnd) -> None:
    end = await make_end(3)
    end.server.sendall(b"$5\r\n0 1")  # half a reply, then the server goes
    end.server.close()
    with pytest.raises(RedisConnectionError, match="closed by server"):
        await end.read()
    assert end.disconnects == 1


async def test_no_reply_within_the_socket_timeout_is_a_timeout(make_end: MakeEnd) -> None:
    end = await make_end(3, socket_timeout=0.05)
    end.server.sendall(b"$5\r\n0 ")
    with pytest.raises(RedisTimeoutError, match="Timeout reading"):
        await end.read()
    assert end.disconnects == 1


async def test_a_push_before_the_reply_goes_to_the_push_handler(
    make_end: MakeEnd, read_size: Callable[[int], None]
) -> None:
    end = await make_end(3)
    push = b">3\r\n$7\r\nmessage\r\n$1\r\nc\r\n$2\r\nhi\r\n"
    end.server.sendall(push + push + b"$3\r\n1 9\r\n")
    assert await end.read() == b"1 9"
    assert end.pushes == [[b"message", b"c", b"hi"]] * 2
    read_size(3)  # the push and the reply in pieces
    end.server.sendall(push + b"$3\r\n1 8\r\n")
    assert await end.read() == b"1 8"
    assert len(end.pushes) == 3
    assert end.disconnects == 0


async def test_a_push_on_a_resp2_connection_disconnects(make_end: MakeEnd) -> None:
    end = await make_end(2)
    end.server.sendall(b">1\r\n$1\r\nx\r\n$1\r\n1\r\n")
    with pytest.raises(RedisConnectionError, match="push message on a RESP2"):
        await end.read()
    assert end.disconnects == 1


@pytest.mark.parametrize("make_end", ["async"], indirect=True)  # a blocking read is not
async def test_a_cancelled_read_disconnects(make_end: MakeEnd) -> None:
    end = await make_end(3)
    task = asyncio.ensure_future(end.read())
    await asyncio.sleep(0)  # the read waits on the stream
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert end.disconnects == 1
