"""One Redis reply (RESP2 or RESP3) parsed from the bytes read so far: the hot path's read.

The ``EVALSHA`` of an acquire reads its reply straight from the socket or stream
(``taskq.ratelimit._redis_utils._receive``, and its generated sync twin) instead of
through redis-py's reader, whose buffered, line-by-line parse is about as much client
work as everything else a sync acquire does. The scripts answer with one short bulk string, but every reply type
redis-py's own readers know parses here, to the same values (a Lua table is an array, a
Lua ``false`` a nil; RESP3 adds maps, sets, doubles, booleans and push messages), so that
nothing a script or the server may send is misread.

Pure: it parses bytes; the caller reads them and says how to decode a string and how to
build the exception of an error reply (redis-py's ``encoder.decode`` and
``parse_error``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["IncompleteReply", "ProtocolError", "Push", "parse_reply"]


class IncompleteReply(Exception):
    """The bytes end before the reply does: read more and parse again."""


class ProtocolError(ValueError):
    """The bytes are not a reply redis-py could read."""


class Push(list[Any]):
    """A RESP3 push message (``>``), which may come before the reply to a command:
    the caller hands it to redis-py's push handler and parses on."""

    __slots__ = ()


_AGGREGATES = frozenset(b"*~>%")
_BLOBS = frozenset(b"$=!")


def parse_reply(
    data: bytes,
    decode: Callable[[bytes], Any],
    error: Callable[[str], BaseException],
    pos: int = 0,
) -> tuple[Any, int]:
    """The reply that starts at ``data[pos]`` and the offset just past it.

    As redis-py's readers return it: strings (bulk, simple, verbatim) through ``decode``;
    an error reply as ``error(message)``, returned, not raised (an array may hold one);
    a nil as ``None``; a set as a list; a push message as a :class:`Push`.
    :class:`IncompleteReply` when ``data`` ends first, :class:`ProtocolError` when it is
    not a reply.
    """
    end = data.find(b"\r\n", pos)
    if end < 0:
        raise IncompleteReply
    if end == pos:
        raise ProtocolError("Protocol Error: an empty line")
    kind = data[pos]
    head = data[pos + 1 : end]
    after = end + 2
    try:
        if kind in _BLOBS:
            size = int(head)
            if size < 0:
                return None, after
            stop = after + size
            if len(data) < stop + 2:
                raise IncompleteReply
            if data[stop : stop + 2] != b"\r\n":
                raise ProtocolError(f"Protocol Error: a string of {size} bytes runs on")
            blob = data[after:stop]
            if kind == 0x24:  # $
                return decode(blob), stop + 2
            if kind == 0x3D:  # =, verbatim: "txt:" or "mkd:", then the text
                return decode(blob[4:]), stop + 2
            return error(blob.decode("utf-8", errors="replace")), stop + 2
        if kind == 0x2B:  # +
            return decode(head), after
        if kind == 0x2D:  # -
            return error(head.decode("utf-8", errors="replace")), after
        if kind == 0x3A or kind == 0x28:  # : and (, an integer and a big number
            return int(head), after
        if kind == 0x5F:  # _
            return None, after
        if kind == 0x2C:  # ,
            return float(head), after
        if kind == 0x23:  # #
            return head == b"t", after
        if kind in _AGGREGATES:
            count = int(head)
            if count < 0:
                return None, after
            if kind == 0x25:  # %
                mapping: dict[Any, Any] = {}
                for _ in range(count):
                    key, after = parse_reply(data, decode, error, after)
                    mapping[key], after = parse_reply(data, decode, error, after)
                return mapping, after
            items = Push() if kind == 0x3E else []  # >
            for _ in range(count):
                item, after = parse_reply(data, decode, error, after)
                items.append(item)
            return items, after
    except (ProtocolError, UnicodeError):  # UnicodeError: ``decode``'s own, as redis-py's
        raise
    except (ValueError, TypeError) as exc:  # a malformed length or number; an unhashable key
        raise ProtocolError(f"Protocol Error: {data[pos:after]!r}") from exc
    raise ProtocolError(f"Protocol Error: {data[pos:after]!r}")
