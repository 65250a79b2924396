"""Lua source of the Redis scripts, one atomic script per operation.

Each script reads Redis ``TIME`` (never the client's clock), works in microseconds since
:data:`~taskq.ratelimit._algorithms.EPOCH` (passed in as ``ARGV`` so there is one
definition), mirrors the maths of :mod:`taskq.ratelimit._algorithms`, and sets a TTL on
every key it writes. Floats go back to Python as ``%.17g`` strings: Lua would truncate a
number reply to an integer. Scripts are bytes so redis-py's ``Script`` needs no client to
hash them; redis-py runs them by ``EVALSHA`` and reloads them on ``NOSCRIPT``. Each
script replies with one string ``"<allowed> <value> <wait_us>"`` (cheaper to parse than
an array).
"""

from __future__ import annotations

from typing import Final

__all__ = ["GCRA_LUA", "LOG_LUA", "TOKEN_BUCKET_LUA", "redis_key"]


def redis_key(name: str, suffix: str) -> str:
    """``taskq:rl:{<name>}:<suffix>``: the braces put a primitive's keys in one cluster slot."""
    return f"taskq:rl:{{{name}}}:{suffix}"


_NOW: Final = """
local t = redis.call('TIME')
local now = (tonumber(t[1]) - tonumber(ARGV[1])) * 1000000 + tonumber(t[2])
local function f(x) return string.format('%.17g', x) end
"""

TOKEN_BUCKET_LUA: Final = (
    _NOW
    + """
-- ARGV: epoch_s, capacity, refill_per_second, count, ttl_s, mode (acquire|peek|refund)
local cap = tonumber(ARGV[2])
local rate = tonumber(ARGV[3])
local count = tonumber(ARGV[4])
local ttl = tonumber(ARGV[5])
local mode = ARGV[6]
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
local stamp = math.max(ts, now)
if mode == 'refund' then
  cur = math.min(cap, cur + count)
  redis.call('HSET', KEYS[1], 't', f(cur), 's', string.format('%d', stamp))
  redis.call('EXPIRE', KEYS[1], ttl)
  return '1 ' .. f(cur) .. ' ' .. '0'
end
if cur + 1e-9 >= count then
  if mode == 'peek' then return '1 ' .. f(cur) .. ' ' .. '0' end
  local left = math.max(0, cur - count)
  redis.call('HSET', KEYS[1], 't', f(left), 's', string.format('%d', stamp))
  redis.call('EXPIRE', KEYS[1], ttl)
  return '1 ' .. f(left) .. ' ' .. '0'
end
if rate > 0 then return '0 ' .. f(cur) .. ' ' .. f((count - cur) * 1000000 / rate) end
return '0 ' .. f(cur) .. ' ' .. '-1'
"""
).encode()

GCRA_LUA: Final = (
    _NOW
    + """
-- ARGV: epoch_s, limit, window_us, ttl_s, mode (acquire|peek)
-- TAT = t + r / limit microseconds (integers: no drift); hash fields t and r.
local limit = tonumber(ARGV[2])
local win = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local mode = ARGV[5]
local h = redis.call('HMGET', KEYS[1], 't', 'r')
local bt = tonumber(h[1])
local br = tonumber(h[2])
if bt == nil or br == nil or bt < now or (bt == now and br == 0) then
  bt = now
  br = 0
end
local step_rem = win % limit
local step_us = (win - step_rem) / limit
local nr = br + step_rem
local carry = 0
if nr >= limit then
  carry = 1
  nr = nr - limit
end
local nt = bt + step_us + carry
local allow_at = nt - win
if (now - allow_at) * limit >= nr then
  local st = bt
  local sr = br
  if mode == 'acquire' then
    st = nt
    sr = nr
    redis.call('HSET', KEYS[1], 't', string.format('%d', nt), 'r', string.format('%d', nr))
    redis.call('EXPIRE', KEYS[1], ttl)
  end
  local rem = math.floor(((now + win - st) * limit - sr) / win)
  if rem < 0 then rem = 0 end
  return '1 ' .. f(rem) .. ' ' .. '0'
end
local wait = allow_at - now
if nr > 0 then wait = wait + 1 end
return '0 ' .. '0' .. ' ' .. f(wait)
"""
).encode()

LOG_LUA: Final = (
    _NOW
    + """
-- ARGV: epoch_s, limit, window_us, ttl_s, mode (acquire|peek), request_id
local limit = tonumber(ARGV[2])
local win = tonumber(ARGV[3])
local ttl = tonumber(ARGV[4])
local mode = ARGV[5]
local cutoff = now - win
if mode == 'acquire' then
  redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', f(cutoff))
end
local n = redis.call('ZCOUNT', KEYS[1], '(' .. f(cutoff), '+inf')
if n < limit then
  if mode == 'peek' then return '1 ' .. f(limit - n) .. ' ' .. '0' end
  redis.call('ZADD', KEYS[1], f(now), ARGV[6])
  redis.call('EXPIRE', KEYS[1], ttl)
  return '1 ' .. f(limit - n - 1) .. ' ' .. '0'
end
local oldest = redis.call('ZRANGEBYSCORE', KEYS[1], '(' .. f(cutoff), '+inf', 'WITHSCORES', 'LIMIT', 0, 1)
local wait = tonumber(oldest[2]) + win - now
if wait < 0 then wait = 0 end
return '0 ' .. '0' .. ' ' .. f(wait)
"""
).encode()
