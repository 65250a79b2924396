"""Lua source of the Redis scripts, one atomic script per operation.

Each script reads Redis ``TIME`` (never the client's clock), works in microseconds since
:data:`~taskq.ratelimit._algorithms.EPOCH` (baked into the source, so it costs no
argument), mirrors the maths of :mod:`taskq.ratelimit._algorithms`, and sets a TTL on
every key it writes. Floats go back to Python as ``%.17g`` strings: Lua would truncate a
number reply to an integer.

The hot path is one ``EVALSHA`` per operation (see :mod:`taskq.ratelimit._redis_utils`),
pre-encoded once per primitive, so the primitive's configuration travels as separate
arguments (each read with one ``tonumber``: parsing one space-separated argument with
``string.match`` cost the server about 2 µs more per call), followed by an optional mode
(absent means "acquire"). Each script replies with one string, cheaper to parse than an
array:
``"1 <value>"`` when allowed, ``"0 <value> <wait_us>"`` when denied (``wait_us`` is
``-1`` when the state never recovers on its own).
"""

from __future__ import annotations

import hashlib
from typing import Final

from taskq.ratelimit._algorithms import EPOCH_UNIX_S

__all__ = [
    "GCRA",
    "LOG",
    "TOKEN_BUCKET",
    "EncodedCall",
    "LuaScript",
    "evalsha_command",
    "redis_key",
]


def redis_key(name: str, suffix: str) -> str:
    """``taskq:rl:{<name>}:<suffix>``: the braces put a primitive's keys in one cluster slot."""
    return f"taskq:rl:{{{name}}}:{suffix}"


class LuaScript:
    """A script's source and its SHA1, the name ``EVALSHA`` runs it by.

    One object per script serves every client, async and sync. ``sha`` is a plain
    attribute so that a test can make the server "forget" the script.
    """

    __slots__ = ("sha", "source")

    def __init__(self, source: str) -> None:
        self.source: Final = source.encode()
        self.sha: bytes = hashlib.sha1(self.source, usedforsecurity=False).hexdigest().encode()


def evalsha_command(sha: bytes, *args: bytes) -> bytes:
    """``EVALSHA sha 1 *args`` (the key first) as the bytes Redis reads (RESP).

    Built once per primitive for the acquire hot path, so redis-py has nothing to encode
    or frame per call (see ``taskq.ratelimit._redis_utils.evalsha``).
    """
    parts = (b"EVALSHA", sha, b"1", *args)
    return b"*%d\r\n" % len(parts) + b"".join(b"$%d\r\n%s\r\n" % (len(p), p) for p in parts)


class EncodedCall:
    """One fixed call of ``script`` (its key and arguments), pre-encoded as the ``EVALSHA``
    the hot path writes, and encoded again only when the script's ``sha`` changed."""

    __slots__ = ("_args", "_command", "_script", "_sha")

    def __init__(self, script: LuaScript, args: tuple[bytes, ...]) -> None:
        self._script = script
        self._args = args
        self._sha = b""
        self._command = b""

    def command(self) -> bytes:
        """``EVALSHA <current sha> 1 *args`` as RESP bytes."""
        sha = self._script.sha
        if sha is not self._sha:
            self._sha, self._command = sha, evalsha_command(sha, *self._args)
        return self._command


_NOW: Final = f"""
local t = redis.call('TIME')
local now = (t[1] - {EPOCH_UNIX_S}) * 1000000 + t[2]
local fmt = string.format
"""

TOKEN_BUCKET: Final = LuaScript(
    _NOW
    + """
-- KEYS[1]: hash with t = tokens, s = when they were counted (us since the epoch)
-- ARGV: capacity, refill_per_second, count, ttl_s[, mode: 'peek' | 'refund']
local cap = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local count = tonumber(ARGV[3])
local ttl = ARGV[4]
local mode = ARGV[5]
local h = redis.call('HMGET', KEYS[1], 't', 's')
local tokens = tonumber(h[1])
local ts = tonumber(h[2])
if tokens == nil or ts == nil then
  tokens = cap
  ts = now
end
local elapsed = now - ts
if elapsed < 0 then elapsed = 0 end
local cur = math.min(cap, tokens + elapsed * rate / 1000000)
if now > ts then ts = now end
if mode == 'refund' then
  local v = fmt('%.17g', math.min(cap, cur + count))
  redis.call('HSET', KEYS[1], 't', v, 's', fmt('%d', ts))
  redis.call('EXPIRE', KEYS[1], ttl)
  return '1 ' .. v
end
if cur + 1e-9 >= count then
  if mode == 'peek' then return '1 ' .. fmt('%.17g', cur) end
  local left = cur - count
  if left < 0 then left = 0 end
  local v = fmt('%.17g', left)
  redis.call('HSET', KEYS[1], 't', v, 's', fmt('%d', ts))
  redis.call('EXPIRE', KEYS[1], ttl)
  return '1 ' .. v
end
if rate > 0 then
  return '0 ' .. fmt('%.17g', cur) .. ' ' .. fmt('%.17g', (count - cur) * 1000000 / rate)
end
return '0 ' .. fmt('%.17g', cur) .. ' -1'
"""
)

GCRA: Final = LuaScript(
    _NOW
    + """
-- KEYS[1]: hash with t, r: TAT = t + r / limit microseconds (integers: no drift)
-- ARGV: limit, window_us, ttl_s[, mode: 'peek']
local limit = tonumber(ARGV[1])
local win = tonumber(ARGV[2])
local ttl = ARGV[3]
local h = redis.call('HMGET', KEYS[1], 't', 'r')
local bt = tonumber(h[1])
local br = tonumber(h[2])
if bt == nil or br == nil or bt < now or (bt == now and br == 0) then
  bt = now
  br = 0
end
local step_rem = win % limit
local nr = br + step_rem
local nt = bt + (win - step_rem) / limit
if nr >= limit then
  nt = nt + 1
  nr = nr - limit
end
local allow_at = nt - win
if (now - allow_at) * limit >= nr then
  if ARGV[4] == 'peek' then
    nt = bt
    nr = br
  else
    redis.call('HSET', KEYS[1], 't', fmt('%d', nt), 'r', fmt('%d', nr))
    redis.call('EXPIRE', KEYS[1], ttl)
  end
  local rem = math.floor(((now + win - nt) * limit - nr) / win)
  if rem < 0 then rem = 0 end
  return '1 ' .. fmt('%d', rem)
end
local wait = allow_at - now
if nr > 0 then wait = wait + 1 end
return '0 0 ' .. fmt('%d', wait)
"""
)

LOG: Final = LuaScript(
    _NOW
    + """
-- KEYS[1]: sorted set of request ids scored by acceptance time (us since the epoch)
-- ARGV: limit, window_us, ttl_s, request_id[, mode: 'peek']
local limit = tonumber(ARGV[1])
local win = tonumber(ARGV[2])
local ttl = ARGV[3]
local cutoff = fmt('%.17g', now - win)
local n
if ARGV[5] == 'peek' then
  n = redis.call('ZCOUNT', KEYS[1], '(' .. cutoff, '+inf')
  if n < limit then return '1 ' .. (limit - n) end
else
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', cutoff)
  n = redis.call('ZCARD', KEYS[1])
  if n < limit then
    redis.call('ZADD', KEYS[1], fmt('%.17g', now), ARGV[4])
    redis.call('EXPIRE', KEYS[1], ttl)
    return '1 ' .. (limit - n - 1)
  end
end
local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. cutoff, '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local wait = tonumber(oldest[2]) + win - now
if wait < 0 then wait = 0 end
return '0 0 ' .. fmt('%.17g', wait)
"""
)
