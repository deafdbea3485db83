"""The Lua scripts of an upstream's rate (``rate.py``) and gate (``gate.py``): each step one atomic script.

Every time is Redis' own (``TIME``, in microseconds), so the fleet's processes
agree on it whatever their clocks; a time written into a key is formatted
``%.0f`` (Lua would write a large number in exponent form, losing digits).
"""

# --- the rate ---

# KEYS: the log of admitted and reserved calls (scores: microseconds, some in the future), the participants
# (one member per process), the pause key (set after a 429), the reservation of the caller's subject (or a key nobody
# uses). ARGV: limit, a call-unique member, this process's id, the window, how long a process counts as seen,
# the longest wait (µs) an acquire may reserve, the mode (acquire, reserve or take), calls, the longest wait (µs)
# a take waits where it is. Returns {status, microseconds, processes seen, calls of the reservation}:
# 1, slots reserved for the caller (wait that long, then call); 0, nothing reserved (paused: until the pause
# ends; or no slot within the wait); 2, a reservation that far ahead made under the key; 3, the key's reservation
# is that far ahead. A taken reservation's calls are at that time and one spacing apart after it. Its key holds
# "<time>:<calls>": a take gets the calls reserved, not the ones it asked for (a sync short of calls reserves
# more, and its job comes back with the data it had).
BUDGET_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window, mode, calls = tonumber(ARGV[4]), ARGV[7], tonumber(ARGV[8])
local spacing = window / tonumber(ARGV[1])
redis.call('ZADD', KEYS[2], now, ARGV[3])
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now - tonumber(ARGV[5]))
redis.call('PEXPIRE', KEYS[2], 20000)
local seen = redis.call('ZCARD', KEYS[2])
local paused = redis.call('PTTL', KEYS[3])
if paused > 0 then
  return {0, paused * 1000, seen, 0}
end
if mode ~= 'acquire' then
  local value = redis.call('GET', KEYS[4])
  if value then
    local held, held_calls = string.match(value, '^(%d+):(%d+)$')
    held, held_calls = tonumber(held), tonumber(held_calls)
    if mode == 'reserve' or held - now > tonumber(ARGV[9]) then
      return {3, held - now, seen, held_calls}
    end
    redis.call('DEL', KEYS[4])
    return {1, math.max(held - now, 0), seen, held_calls}
  end
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
local at = now
local last = redis.call('ZRANGE', KEYS[1], -1, -1, 'WITHSCORES')
if last[2] then
  at = math.max(now, tonumber(last[2]) + spacing)
end
if mode == 'acquire' and at - now > tonumber(ARGV[6]) then
  return {0, at - now, seen, 0}
end
for k = 0, calls - 1 do
  redis.call('ZADD', KEYS[1], at + k * spacing, string.format('%.0f', at + k * spacing) .. ':' .. ARGV[2] .. ':' .. k)
end
redis.call('PEXPIRE', KEYS[1], math.floor((at - now + calls * spacing) / 1000) + 2000)
if mode == 'reserve' or (mode == 'take' and at - now > tonumber(ARGV[9])) then
  local value = string.format('%.0f', at) .. ':' .. calls
  redis.call('SET', KEYS[4], value, 'PX', math.max(1, math.floor((at - now + spacing) / 1000)))
  return {2, at - now, seen, calls}
end
return {1, at - now, seen, calls}
"""

# KEYS: the log of calls made (scores: microseconds), the pause key. ARGV: limit, window (µs), a call-unique member.
# Returns 0 when the call is admitted (and logged), else how many microseconds to wait before asking again.
ADMIT_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local window = tonumber(ARGV[2])
local paused = redis.call('PTTL', KEYS[2])
if paused > 0 then
  return paused * 1000
end
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now - window)
if redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now, ARGV[3])
  redis.call('PEXPIRE', KEYS[1], math.floor(window / 1000) + 1000)
  return 0
end
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return math.max(tonumber(oldest[2]) + window - now, 1000)
"""

# --- the gate ---

# KEYS: paused, state (hash: held_since, probe_at, last_error, last_error_at), probe claim, leases in flight,
# subjects waiting. ARGV: mode ('check': may this subject go on?, 'enter': the call is made now), subject, token,
# cap (0: none), lease (µs), probe interval (µs). Returns {verdict, wait (µs), pause left (µs; -1 until resumed)}:
# 0 go on; 1 go on as the probe (check: a probe is due); 2 held; 3 paused; 4 the cap in flight is full.
GATE_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local mode, subject, probe_us = ARGV[1], ARGV[2], tonumber(ARGV[6])
local function wait(verdict, us, left)
  if subject ~= '' then
    redis.call('ZADD', KEYS[5], string.format('%.0f', now + us + tonumber(ARGV[7])), subject)
    redis.call('ZREMRANGEBYSCORE', KEYS[5], '-inf', now)
    redis.call('PEXPIRE', KEYS[5], 86400000)
  end
  return {verdict, us, left}
end
local paused = redis.call('PTTL', KEYS[1])
if paused == -1 then return wait(3, probe_us, -1) end
if paused > 0 then return wait(3, math.min(paused * 1000, probe_us), paused * 1000) end
local probe = false
local held = redis.call('HGET', KEYS[2], 'held_since')
if held then
  local probe_at = tonumber(redis.call('HGET', KEYS[2], 'probe_at')) or now
  if now < probe_at then return wait(2, probe_at - now, 0) end
  local claim = redis.call('GET', KEYS[3])
  if claim then
    local started = tonumber(string.match(claim, '^(%d+):')) or now
    local left = math.max(redis.call('PTTL', KEYS[3]), 0) * 1000
    return wait(2, math.max(tonumber(ARGV[8]), math.min(now - started, left)), 0)
  end
  probe = true
end
if subject ~= '' then redis.call('ZREM', KEYS[5], subject) end
if mode == 'check' then
  return {probe and 1 or 0, 0, 0}
end
local cap = tonumber(ARGV[4])
if cap > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', now)
  if redis.call('ZCARD', KEYS[4]) >= cap then return {4, 0, 0} end
  redis.call('ZADD', KEYS[4], string.format('%.0f', now + tonumber(ARGV[5])), ARGV[3])
  redis.call('PEXPIRE', KEYS[4], math.floor(tonumber(ARGV[5]) / 1000) + 1000)
end
if probe then
  redis.call('SET', KEYS[3], string.format('%.0f', now) .. ':' .. ARGV[3], 'PX', math.floor(tonumber(ARGV[5]) / 1000))
  return {1, 0, 0}
end
return {0, 0, 0}
"""

# KEYS: state, subjects failing, probe claim, leases in flight. ARGV: 'answered', 'failed' or 'released' (no
# outcome: the call was not made), subject, token, the error (failed), hold threshold, probe interval (µs), how
# long the failing set lives (ms), '1' when a hold that begins is confirmed by the caller first (it gets the probe's
# claim: the others wait briefly), lease (µs). Returns {outcome, µs}: 0 nothing changed; 1 the hold ended (held
# that long); 2 the hold began (the first probe that far ahead); 3 still held (the next probe that far).
RECORD_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
redis.call('ZREM', KEYS[4], ARGV[3])
if ARGV[1] == 'released' then
  local claim = redis.call('GET', KEYS[3])
  if claim and string.match(claim, '^%d+:(.*)$') == ARGV[3] then redis.call('DEL', KEYS[3]) end
  return {0, 0}
end
if ARGV[1] == 'answered' then
  redis.call('DEL', KEYS[2])
  local held = redis.call('HGET', KEYS[1], 'held_since')
  if not held then return {0, 0} end
  redis.call('HDEL', KEYS[1], 'held_since', 'probe_at')
  redis.call('DEL', KEYS[3])
  return {1, now - tonumber(held)}
end
local probe_us = tonumber(ARGV[6])
redis.call('HSET', KEYS[1], 'last_error', ARGV[4], 'last_error_at', string.format('%.0f', now))
if redis.call('HGET', KEYS[1], 'held_since') then
  local probe_at = tonumber(redis.call('HGET', KEYS[1], 'probe_at')) or now
  local claim = redis.call('GET', KEYS[3])
  if claim and string.match(claim, '^%d+:(.*)$') == ARGV[3] then
    probe_at = now + probe_us
    redis.call('HSET', KEYS[1], 'probe_at', string.format('%.0f', probe_at))
    redis.call('DEL', KEYS[3])
  end
  return {3, math.max(probe_at - now, 0)}
end
redis.call('SADD', KEYS[2], ARGV[2])
redis.call('PEXPIRE', KEYS[2], tonumber(ARGV[7]))
if redis.call('SCARD', KEYS[2]) < tonumber(ARGV[5]) then return {0, 0} end
redis.call('DEL', KEYS[2])
redis.call('HSET', KEYS[1], 'held_since', string.format('%.0f', now), 'probe_at', string.format('%.0f', now + probe_us))
if ARGV[8] == '1' then
  redis.call('SET', KEYS[3], string.format('%.0f', now) .. ':' .. ARGV[3], 'PX', math.floor(tonumber(ARGV[9]) / 1000))
end
return {2, probe_us}
"""

# KEYS: paused, state, subjects waiting. Returns {now, pause left (ms; -2 not paused, -1 until resumed),
# paused since, held since, last error, last error at, subjects waiting} (times in µs, '' when unset).
STATUS_LUA = """
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000000 + tonumber(t[2])
local state = redis.call('HMGET', KEYS[2], 'held_since', 'last_error', 'last_error_at')
return {string.format('%.0f', now), redis.call('PTTL', KEYS[1]), redis.call('GET', KEYS[1]) or '',
  state[1] or '', state[2] or '', state[3] or '', redis.call('ZCOUNT', KEYS[3], now, '+inf')}
"""
