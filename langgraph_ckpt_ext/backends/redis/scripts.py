"""The Lua scripts of `RedisStore`: every write, and every read that must follow links (latest
checkpoint, append-delta bases, parent chain), runs server-side in one call.

Every script gets the thread's keys, in `layout.THREAD_KEYS` order, and touches no other key:
one thread lives in one hash slot, so the scripts run unchanged on Redis Cluster.

Members and fields join their parts with NUL (`ns \\0 checkpoint_id`, ...); the store refuses
NUL inside those parts, so a range `[ns\\0, ns\\1)` holds exactly one namespace's members.

Value layouts (bytes):
  checkpoint row  parent \\0 run_id \\0 L \\0 <L bytes: ch \\0 ver \\0 ...> msgpack[types, data]
  blob            base_version \\0 type \\0 data        (base_version empty: a full value)
  write           msgpack[channel, type, data, task_path]
  migration       from_version \\0 repr(migrated_at)   (field: ns \\0 checkpoint_id \\0 to_version)
"""

from __future__ import annotations

# KEYS: 1 ix (zset "ns\0cid"), 2 ord (zset "cid\0ns"), 3 cp (hash "ns\0cid" -> row),
# 4 bl (hash "ns\0ch\0ver" -> blob), 5 wr (hash "ns\0cid\0task\0idx" -> write),
# 6 wx (zset of wr fields), 7 meta (hash: gen, pinned, exp, and the lifecycle row: created,
# written, read, policy, swept), 8 mig (hash "ns\0cid\0to_version" ->
# migration). Whatever loops over the thread's keys (expire_all, DELETE_THREAD, EXISTING,
# EXPIRE) covers mig too; DUMP/LOAD leave it out: a copied thread starts with no migration log.
# The guarded writes and the deletes also get 9 tomb (the tombstone) and 10 lease (the lease
# row), and, on a standalone server, 11 the store's epoch: keys that no TTL and no
# `expire_all` touch (NKEYS, not #KEYS, bounds the thread's own keys).
_PRELUDE = r"""
local NKEYS = 8

local function expire_all(ttl)
  -- Every write leaves all of a thread's keys with one deadline, or none; meta's `exp` field
  -- says which, so a write without a TTL costs nothing here.
  local m = redis.call('HMGET', KEYS[7], 'pinned', 'exp')
  if m[1] or ttl == '' then
    if m[2] then
      for i = 1, NKEYS do redis.call('PERSIST', KEYS[i]) end
      redis.call('HDEL', KEYS[7], 'exp')
    end
  else
    if not m[2] then redis.call('HSET', KEYS[7], 'exp', '1') end
    -- One absolute deadline for every key: the thread expires whole, never in part.
    local t = redis.call('TIME')
    local at = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000) + tonumber(ttl)
    for i = 1, NKEYS do redis.call('PEXPIREAT', KEYS[i], at) end
  end
end

-- A write to the thread (`n` of them, one script): its lifecycle row in meta gets `created`
-- (if missing) and `written` = now, and `gen` goes up by n. Returns 1 if the row is new (the
-- caller indexes the thread again: another process may have dropped its index entry).
local function wrote(now, n)
  redis.call('HSETNX', KEYS[7], 'created', now)
  local g = redis.call('HINCRBY', KEYS[7], 'gen', n)
  redis.call('HSET', KEYS[7], 'written', now)
  if g == n then return 1 end
  return 0
end

local function split_row(row)
  local p1 = string.find(row, '\0', 1, true)
  local p2 = string.find(row, '\0', p1 + 1, true)
  local p3 = string.find(row, '\0', p2 + 1, true)
  local n = tonumber(string.sub(row, p2 + 1, p3 - 1))
  return string.sub(row, 1, p1 - 1), string.sub(row, p1 + 1, p2 - 1), string.sub(row, p3 + 1, p3 + n)
end

-- The checkpoint `cid` of namespace `ns` (its newest when cid is ''): cid, row; or nil.
local function find_row(ns, cid)
  if cid == '' then
    local m = redis.call('ZREVRANGEBYLEX', KEYS[1], '(' .. ns .. '\1', '[' .. ns .. '\0', 'LIMIT', 0, 1)
    if #m == 0 then return nil end
    cid = string.sub(m[1], #ns + 2)
  end
  local row = redis.call('HGET', KEYS[3], ns .. '\0' .. cid)
  if not row then return nil end
  return cid, row
end

-- Blobs for a flat list {ch, ver, ch, ver, ...} and every append-delta base they need:
-- a flat list {ch, ver, value, ...}.
local function blobs(ns, list)
  local out, seen, i = {}, {}, 1
  while i < #list do
    local ch, ver = list[i], list[i + 1]
    i = i + 2
    local f = ns .. '\0' .. ch .. '\0' .. ver
    if not seen[f] then
      seen[f] = true
      local v = redis.call('HGET', KEYS[4], f)
      if v then
        out[#out + 1] = ch; out[#out + 1] = ver; out[#out + 1] = v
        local p = string.find(v, '\0', 1, true)
        if p > 1 then list[#list + 1] = ch; list[#list + 1] = string.sub(v, 1, p - 1) end
      end
    end
  end
  return out
end

local function writes(ns, cid)
  local head = ns .. '\0' .. cid
  local fs = redis.call('ZRANGEBYLEX', KEYS[6], '[' .. head .. '\0', '(' .. head .. '\1')
  local out = {}
  for _, f in ipairs(fs) do
    local v = redis.call('HGET', KEYS[5], f)
    if v then out[#out + 1] = f; out[#out + 1] = v end
  end
  return out
end

local function drop_writes(ns, cid)
  local lo, hi = '[' .. ns .. '\0' .. cid .. '\0', '(' .. ns .. '\0' .. cid .. '\1'
  local fs = redis.call('ZRANGEBYLEX', KEYS[6], lo, hi)
  for _, f in ipairs(fs) do redis.call('HDEL', KEYS[5], f) end
  redis.call('ZREMRANGEBYLEX', KEYS[6], lo, hi)
end

local function index_row(ns, cid)
  redis.call('ZADD', KEYS[1], 0, ns .. '\0' .. cid)
  redis.call('ZADD', KEYS[2], 0, cid .. '\0' .. ns)
end

-- A checkpoint's blobs, checked but not written: `heads` holds `channel \0 version \0 base|'' \0`
-- per blob, whose values are ARGV[first], ARGV[first + 1], ... Returns the channels whose
-- append-delta base is neither stored nor in `made` (fields written earlier in the same call;
-- nil: none), the HSET arguments {field, value, ...} and the index of the next argument.
local function plan_blobs(ns, heads, first, made)
  local missing, sets, i = {}, {}, first
  for ch, ver, base in string.gmatch(heads, '([^%z]*)%z([^%z]*)%z([^%z]*)%z') do
    if base ~= '' then
      local f = ns .. '\0' .. ch .. '\0' .. base
      -- HEXISTS, not HMGET: a base can be a whole list, which need not be copied into Lua.
      if not (made and made[f]) and redis.call('HEXISTS', KEYS[4], f) == 0 then
        missing[#missing + 1] = ch
      end
    end
    sets[#sets + 1] = ns .. '\0' .. ch .. '\0' .. ver
    sets[#sets + 1] = ARGV[i]
    i = i + 1
  end
  return missing, sets, i
end

-- Store a checkpoint row and its blobs (`sets`, from plan_blobs).
local function put_checkpoint(ns, cid, row, sets)
  if #sets > 0 then redis.call('HSET', KEYS[4], unpack(sets)) end
  redis.call('HSET', KEYS[3], ns .. '\0' .. cid, row)
  index_row(ns, cid)
end

-- Store pending writes packed as records
-- `replace '1'|'0' \0 field length \0 field \0 value length \0 value`.
local function put_writes(packed)
  local p = 1
  while p <= #packed do
    local a = string.find(packed, '\0', p, true)
    local fl = tonumber(string.sub(packed, p + 1, a - 1))
    local field = string.sub(packed, a + 1, a + fl)
    local b = string.find(packed, '\0', a + fl + 1, true)
    local vl = tonumber(string.sub(packed, a + fl + 1, b - 1))
    local value = string.sub(packed, b + 1, b + vl)
    if string.sub(packed, p, p) == '1' then
      redis.call('HSET', KEYS[5], field, value)
    else
      redis.call('HSETNX', KEYS[5], field, value)
    end
    redis.call('ZADD', KEYS[6], 0, field)
    p = b + vl + 1
  end
end
"""


# The one-writer rule (`core.guard`), restated for the guarded writes. A guard record is
# `flags \0 read_head \0 lease \0 epoch \0 target \0 ns \0`: flags are four characters, '1'
# (guarded) or '0' (an item of a batch with no guard), then 's' (writers="single"), 'f' (a
# run's first checkpoint), 'a' (a replica's apply), '-' for each not set; epoch '' is none;
# target is a put's parent ('' none) or the checkpoint id of pending writes. The rule below
# answers only "refused or not"; a refusal returns the facts it saw and Python raises the
# error `core.guard.put_refusal` / `writes_refusal` build from them, so the messages, the kinds
# and any disagreement (an AssertionError there) come from one place.
# Byte order (Lua's own `<` on strings follows the server's locale).
_AFTER = r"""
local function after(a, b)
  for i = 1, math.min(#a, #b) do
    local x, y = string.byte(a, i), string.byte(b, i)
    if x ~= y then return x > y end
  end
  return #a > #b
end
"""

_GUARD = _AFTER + r"""
local function parse_guards(s)
  local out, field = {}, '([^%z]*)%z'
  for f, r, l, e, t, ns in string.gmatch(s, string.rep(field, 6)) do
    out[#out + 1] = {on = string.sub(f, 1, 1) == '1', single = string.sub(f, 2, 2) == 's',
      fresh = string.sub(f, 3, 3) == 'f', apply = string.sub(f, 4, 4) == 'a',
      read = r, lease = l, epoch = e, target = t, ns = ns}
  end
  return out
end


local function head_of(ns)
  local m = redis.call('ZREVRANGEBYLEX', KEYS[1], '(' .. ns .. '\1', '[' .. ns .. '\0', 'LIMIT', 0, 1)
  if #m == 0 then return nil end
  return string.sub(m[1], #ns + 2)
end

-- What every guard reads: the tombstone, the lease row and (`with_epoch`) the epoch: the
-- store's (KEYS[11] on a standalone server; in Cluster, `pre`, read just before this call)
-- or the thread's own `ep` (the newest epoch that wrote it), whichever is newer.
local function facts(with_epoch, pre)
  local F = {tomb = false, last = '', tok = false, exp = 0, rawexp = '', epoch = 0}
  local t = redis.call('GET', KEYS[9])
  if t then  -- `last \0 at`: the newest checkpoint id the delete removed, and when
    F.tomb, F.last = true, string.sub(t, 1, string.find(t, '\0', 1, true) - 1)
  end
  local l = redis.call('GET', KEYS[10])
  if l then
    local p = string.find(l, '\0', 1, true)
    F.tok, F.rawexp = string.sub(l, 1, p - 1), string.sub(l, p + 1)
    F.exp = tonumber(F.rawexp)
  end
  if with_epoch then
    local e = 0
    if #KEYS >= 11 then e = tonumber(redis.call('GET', KEYS[11]) or '0')
    elseif pre ~= '' then e = tonumber(pre) end
    local t = tonumber(redis.call('HGET', KEYS[7], 'ep') or '0')
    if t > e then e = t end
    F.epoch = e
  end
  return F
end

local function any_epoch(gs)
  for _, G in ipairs(gs) do if G.on and G.epoch ~= '' then return true end end
  return false
end

-- After a guarded write: the thread remembers the newest epoch that wrote it.
local function note_epoch(gs)
  local top = nil
  for _, G in ipairs(gs) do
    if G.on and G.epoch ~= '' and (not top or tonumber(G.epoch) > top) then top = tonumber(G.epoch) end
  end
  if top and top > tonumber(redis.call('HGET', KEYS[7], 'ep') or '0') then
    redis.call('HSET', KEYS[7], 'ep', string.format('%d', top))
  end
end

-- core.guard._holder_refusal
local function holder_refused(G, F, now)
  if G.epoch ~= '' and F.epoch > tonumber(G.epoch) then return true end
  if G.apply then return false end
  local live = F.tok ~= false and F.exp > now
  if G.lease ~= '' then return (not live) or F.tok ~= G.lease end
  return live
end

-- core.guard.put_refusal (`exists`: this very checkpoint is stored already: a retry)
local function put_refused(G, F, head, now, exists)
  if holder_refused(G, F, now) then return true end
  if G.apply or exists then return false end
  if not head then return G.target ~= '' and F.tomb end
  if not G.single or head == G.target then return false end
  if G.read ~= '' then return head ~= G.read end
  if G.target ~= '' then return true end
  return G.fresh
end

-- core.guard.writes_refusal
local function writes_refused(G, F, exists, now)
  if holder_refused(G, F, now) then return true end
  if G.apply then return false end
  return F.tomb and not exists
end

-- Is checkpoint `cid` of namespace `ns` stored (or in `made`, written earlier by the same
-- call)?
local function stored(ns, cid, made)
  local f = ns .. '\0' .. cid
  return (made ~= nil and made[f] == true) or redis.call('HEXISTS', KEYS[3], f) == 1
end

-- writes_refused's `exists`: their checkpoint is stored, or newer than every checkpoint the
-- thread's delete removed (a new run's, whose put is still on its way).
local function writes_exist(G, F, made)
  return stored(G.ns, G.target, made) or (F.tomb and after(G.target, F.last))
end

local function flags(a) return a and '1' or '0' end

-- A refusal: {'\0', item, head of its namespace (a put) or, for writes, a flag '0'|'1'
-- (their checkpoint "exists", `writes_exist`), tombstone '1'|'', lease token, lease expiry,
-- epoch}.
local function refusal(k, seen, F)
  return {'\0', k, seen or '', F.tomb and '1' or '', F.tok or '', F.rawexp,
          string.format('%d', F.epoch)}
end
"""

# ARGV: ttl_ms|'', now, ns, cid, row, heads, guard record|'' (none: no check), the epoch read
# before (Cluster; else ''), then one value per blob; heads is one string of
# `channel \0 version \0 base|'' \0` per blob (values stay separate arguments, so that Lua
# never copies them). Returns a refusal (nothing written), or the channels whose append-delta
# base is gone (nothing written then), or 1 if the thread's lifecycle row is new, else 0.
# KEYS: the thread's 8, and with a guard tomb, lease (and the epoch key, standalone).
PUT = _PRELUDE + _GUARD + r"""
local ttl, now, ns, cid, row = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
local gs = {}
if ARGV[7] ~= '' then
  gs = parse_guards(ARGV[7])
  local F = facts(any_epoch(gs), ARGV[8])
  local head = head_of(ns)
  if put_refused(gs[1], F, head, tonumber(now), stored(ns, cid, nil)) then
    return refusal(0, head, F)
  end
end
local missing, sets = plan_blobs(ns, ARGV[6], 9, nil)
if #missing > 0 then return missing end
put_checkpoint(ns, cid, row, sets)
note_epoch(gs)
local new = wrote(now, 1)
expire_all(ttl)
return new
"""

# ARGV: ttl_ms|'', now, writes: one string of records
# `replace '1'|'0' \0 field length \0 field \0 value length \0 value`, guard record|'', the
# epoch read before|''. Returns a refusal, or 1 if the thread's lifecycle row is new, else 0.
PUT_WRITES = _PRELUDE + _GUARD + r"""
local gs = {}
if ARGV[4] ~= '' then
  gs = parse_guards(ARGV[4])
  local G = gs[1]
  local F = facts(any_epoch(gs), ARGV[5])
  local exists = writes_exist(G, F, nil)
  if writes_refused(G, F, exists, tonumber(ARGV[2])) then
    return refusal(0, flags(exists), F)
  end
end
put_writes(ARGV[3])
note_epoch(gs)
local new = wrote(ARGV[2], 1)
expire_all(ARGV[1])
return new
"""

# Several PUTs and PUT_WRITES of one thread, in order, as one: ARGV: ttl_ms|'', now, kinds (one
# character per item: 'c' a checkpoint, 'w' writes), guard records (one per item) or '' (no
# check), the epoch read before|'', then each item's arguments: a checkpoint's ns, cid, row,
# heads and one value per blob (as PUT), or one string of write records (as PUT_WRITES). Every
# guarded item is checked, against the thread as the items before it leave it, before any is
# written: a refusal writes nothing. An append-delta's base may be a blob of an earlier item.
# If some base is gone, nothing is written and the result is {item, channel, ...} (item: its
# 0-based position); else every item is stored, `gen` counts one write per item, and the
# result is 1 if the thread's lifecycle row is new, else 0.
BATCH = _PRELUDE + _GUARD + r"""
local kinds, now = ARGV[3], ARGV[2]
local gs, F, heads, stored_ids = {}, nil, {}, {}
if ARGV[4] ~= '' then
  gs = parse_guards(ARGV[4])
  F = facts(any_epoch(gs), ARGV[5])
end
local plans, missing, made, a = {}, {}, {}, 6
for k = 1, #kinds do
  local G = gs[k]
  if string.sub(kinds, k, k) == 'c' then
    local ns, cid = ARGV[a], ARGV[a + 1]
    if F then
      if heads[ns] == nil then heads[ns] = head_of(ns) or false end
      local head = heads[ns] or nil
      if G.on and put_refused(G, F, head, tonumber(now), stored(ns, cid, stored_ids)) then
        return refusal(k - 1, head, F)
      end
      if not head or after(cid, head) then heads[ns] = cid end
      stored_ids[ns .. '\0' .. cid] = true
    end
    local gone, sets, after_ = plan_blobs(ns, ARGV[a + 3], a + 4, made)
    for _, ch in ipairs(gone) do missing[#missing + 1] = k - 1; missing[#missing + 1] = ch end
    for j = 1, #sets, 2 do made[sets[j]] = true end
    plans[k] = {ns, cid, ARGV[a + 2], sets}
    a = after_
  else
    if F and G.on then
      local exists = writes_exist(G, F, stored_ids)
      if writes_refused(G, F, exists, tonumber(now)) then
        return refusal(k - 1, flags(exists), F)
      end
    end
    plans[k] = ARGV[a]
    a = a + 1
  end
end
if #missing > 0 then return missing end
for k = 1, #kinds do
  local p = plans[k]
  if type(p) == 'table' then put_checkpoint(p[1], p[2], p[3], p[4]) else put_writes(p) end
end
note_epoch(gs)
local new = wrote(now, #kinds)
expire_all(ARGV[1])
return new
"""

# ARGV: ns, cid|''. Returns false, or {cid, row, {ch, ver, blob, ...}, {field, write, ...}}.
GET_TUPLE = _PRELUDE + r"""
local ns = ARGV[1]
local cid, row = find_row(ns, ARGV[2])
if not cid then return false end
local _, _, names = split_row(row)
local list = {}
for item in string.gmatch(names, '([^%z]*)%z') do list[#list + 1] = item end
return {cid, row, blobs(ns, list), writes(ns, cid)}
"""

# ARGV: ns, cid|''. Returns false or {cid, row}.
GET_ROW = _PRELUDE + r"""
local cid, row = find_row(ARGV[1], ARGV[2])
if not cid then return false end
return {cid, row}
"""

# ARGV: ns, then (channel, version) pairs.
GET_BLOBS = _PRELUDE + r"""
local list = {}
for i = 2, #ARGV do list[#list + 1] = ARGV[i] end
return blobs(ARGV[1], list)
"""

# ARGV: ns, then checkpoint ids. Returns {field, write, ...} over all of them.
GET_WRITES = _PRELUDE + r"""
local out = {}
for i = 2, #ARGV do
  for _, x in ipairs(writes(ARGV[1], ARGV[i])) do out[#out + 1] = x end
end
return out
"""

# ARGV: ns, cid, limit. The parent chain from cid: {cid, row, cid, row, ...}.
GET_ANCESTORS = _PRELUDE + r"""
local ns, cid, left = ARGV[1], ARGV[2], tonumber(ARGV[3])
local out = {}
while cid ~= '' and left > 0 do
  local row = redis.call('HGET', KEYS[3], ns .. '\0' .. cid)
  if not row then break end
  out[#out + 1] = cid; out[#out + 1] = row
  left = left - 1
  cid = split_row(row)
end
return out
"""

# ARGV: index ('ix' | 'ord'), max, min, limit: a page of an index, newest first, with rows:
# {ns\0cid, row, ...}.
PAGE = _PRELUDE + r"""
local by_ns = ARGV[1] == 'ix'
local index = by_ns and KEYS[1] or KEYS[2]
local ms = redis.call('ZREVRANGEBYLEX', index, ARGV[2], ARGV[3], 'LIMIT', 0, tonumber(ARGV[4]))
local out = {}
for _, m in ipairs(ms) do
  local f = m
  if not by_ns then
    local p = string.find(m, '\0', 1, true)
    f = string.sub(m, p + 1) .. '\0' .. string.sub(m, 1, p - 1)
  end
  local row = redis.call('HGET', KEYS[3], f)
  if row then out[#out + 1] = f; out[#out + 1] = row end
end
return out
"""

# ARGV: run ids. Returns {ns\0cid, ...} of this thread's checkpoints of those runs. It reads
# every row of the thread: delete_for_runs is rare, and a per-thread run index would cost every
# put a write.
FIND_RUNS = _PRELUDE + r"""
local wanted, out = {}, {}
for i = 1, #ARGV do wanted[ARGV[i]] = true end
local all = redis.call('HGETALL', KEYS[3])
for i = 1, #all, 2 do
  local _, run = split_row(all[i + 1])
  if wanted[run] then out[#out + 1] = all[i] end
end
return out
"""

# ARGV: n, then n x (ns, cid): the checkpoints to delete, with their writes; then every blob
# that no remaining checkpoint reads (by its channel list, as GET_TUPLE reads them), directly
# or as an append-delta base. One script: no write lands between the plan and the deletes,
# however busy the thread. Returns how many blobs went. The lifecycle row stays as it is: a
# history cut is no write (the sweeper records it with `swept`).
DELETE_CHECKPOINTS = _PRELUDE + r"""
local n = tonumber(ARGV[1])
for i = 2, 1 + 2 * n, 2 do
  local ns, cid = ARGV[i], ARGV[i + 1]
  local f = ns .. '\0' .. cid
  redis.call('HDEL', KEYS[3], f)
  redis.call('ZREM', KEYS[1], f)
  redis.call('ZREM', KEYS[2], cid .. '\0' .. ns)
  drop_writes(ns, cid)
end
local live = {}
local rows = redis.call('HGETALL', KEYS[3])
for i = 1, #rows, 2 do
  local ns = string.sub(rows[i], 1, string.find(rows[i], '\0', 1, true) - 1)
  local _, _, names = split_row(rows[i + 1])
  for ch, ver in string.gmatch(names, '([^%z]*)%z([^%z]*)%z') do
    local f = ns .. '\0' .. ch .. '\0' .. ver
    while f and not live[f] do
      live[f] = true
      local v = redis.call('HGET', KEYS[4], f)
      f = nil
      local p = v and string.find(v, '\0', 1, true)
      if p and p > 1 then f = ns .. '\0' .. ch .. '\0' .. string.sub(v, 1, p - 1) end
    end
  end
end
local dead = {}
for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
  if not live[f] then dead[#dead + 1] = f end
end
for i = 1, #dead, 1000 do
  redis.call('HDEL', KEYS[4], unpack(dead, i, math.min(i + 999, #dead)))
end
return #dead
"""

# The raw contents to copy: {{ns\0cid, row, ...}, {field, blob, ...}, {field, write, ...}}.
DUMP = _PRELUDE + r"""
return {redis.call('HGETALL', KEYS[3]), redis.call('HGETALL', KEYS[4]), redis.call('HGETALL', KEYS[5])}
"""

# ARGV: ttl, now, n_rows, n_blobs, then rows (field, value), blobs (field, value), writes
# (field, value). Rows and writes already there are kept, as put_writes keeps them. A write
# to the target: returns 1 if its lifecycle row is new, else 0.
LOAD = _PRELUDE + r"""
local n_rows, n_blobs = tonumber(ARGV[3]), tonumber(ARGV[4])
local i = 5
for _ = 1, n_rows do
  local f, row = ARGV[i], ARGV[i + 1]
  if redis.call('HSETNX', KEYS[3], f, row) == 1 then
    local p = string.find(f, '\0', 1, true)
    index_row(string.sub(f, 1, p - 1), string.sub(f, p + 1))
  end
  i = i + 2
end
for _ = 1, n_blobs do redis.call('HSET', KEYS[4], ARGV[i], ARGV[i + 1]); i = i + 2 end
while i < #ARGV do
  redis.call('HSETNX', KEYS[5], ARGV[i], ARGV[i + 1])
  redis.call('ZADD', KEYS[6], 0, ARGV[i])
  i = i + 2
end
local new = wrote(ARGV[2], 1)
expire_all(ARGV[1])
return new
"""

# ARGV: ttl, ns, cid, row, keep ('1': keep the stored row's channel list, the new row has
# none), to_version, log value, replace writes ('1' | ''), packed writes (as PUT_WRITES), then
# heads and blob values (as PUT). Logs the migration ns\0cid\0to_version and rewrites the
# checkpoint: returns 1; or 0, changing nothing, if that migration is logged already or the
# checkpoint is gone; or, changing nothing, the channels whose append-delta base is gone.
REWRITE = _PRELUDE + r"""
local ttl, ns, cid, row = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local f = ns .. '\0' .. cid
local logged = f .. '\0' .. ARGV[6]
if redis.call('HEXISTS', KEYS[8], logged) == 1 then return 0 end
local old = redis.call('HGET', KEYS[3], f)
if not old then return 0 end
if ARGV[5] == '1' then
  local _, _, names = split_row(old)
  local p1 = string.find(row, '\0', 1, true)
  local p2 = string.find(row, '\0', p1 + 1, true)
  local p3 = string.find(row, '\0', p2 + 1, true)
  local n = tonumber(string.sub(row, p2 + 1, p3 - 1))
  row = string.sub(row, 1, p2) .. #names .. '\0' .. names .. string.sub(row, p3 + 1 + n)
end
local missing, sets = plan_blobs(ns, ARGV[10], 11, nil)
if #missing > 0 then return missing end
put_checkpoint(ns, cid, row, sets)
if ARGV[8] == '1' then
  drop_writes(ns, cid)
  put_writes(ARGV[9])
end
redis.call('HSET', KEYS[8], logged, ARGV[7])
redis.call('HINCRBY', KEYS[7], 'gen', 1)
expire_all(ttl)
return 1
"""

# Values rewritten in place (`Store.reseal`): ARGV holds records `kind, field, old, new`, kind
# 'c' (a checkpoint row: old and new are its msgpack tail, the record and metadata; the head,
# parent, run and channel list, stays), 'b' (a blob: `type \0 data`; its base stays) or 'w' (a
# write: the msgpack of type then data, the items after the channel; channel and task path
# stay). Each is replaced only if the stored value holds exactly `old`. HSET on a field keeps
# its key's TTL; no lifecycle field, no index, no expiry is touched. Returns how many applied.
RESEAL = r"""
-- Where a write's items after its channel start (it is msgpack[channel, type, data, path]),
-- nil for a value of another shape.
local function after_channel(v)
  if string.byte(v, 1) ~= 0x94 then return nil end
  local b = string.byte(v, 2) or 0
  if b >= 0xa0 and b <= 0xbf then return 3 + b - 0xa0 end
  if b == 0xd9 then return 4 + string.byte(v, 3) end
  if b == 0xda then return 5 + string.byte(v, 3) * 256 + string.byte(v, 4) end
  if b == 0xdb then
    local n = 0
    for i = 3, 6 do n = n * 256 + string.byte(v, i) end
    return 7 + n
  end
  return nil
end
local done = 0
for i = 1, #ARGV, 4 do
  local kind, f, old, new = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local key = KEYS[3]
  if kind == 'b' then key = KEYS[4] elseif kind == 'w' then key = KEYS[5] end
  local v = redis.call('HGET', key, f)
  local at = nil
  if v and kind == 'c' then
    local p1 = string.find(v, '\0', 1, true)
    local p2 = string.find(v, '\0', p1 + 1, true)
    local p3 = string.find(v, '\0', p2 + 1, true)
    at = p3 + 1 + tonumber(string.sub(v, p2 + 1, p3 - 1))
    if string.sub(v, at) ~= old then at = nil end
  elseif v and kind == 'b' then
    at = string.find(v, '\0', 1, true) + 1
    if string.sub(v, at) ~= old then at = nil end
  elseif v then
    at = after_channel(v)
    if at and string.sub(v, at, at + #old - 1) ~= old then at = nil end
  end
  if at then
    -- msgpack items delimit themselves: a write's task path follows `old` unchanged.
    local rest = ''
    if kind == 'w' then rest = string.sub(v, at + #old) end
    redis.call('HSET', key, f, string.sub(v, 1, at - 1) .. new .. rest)
    done = done + 1
  end
end
return done
"""

# The migration log: {field, value, ...}.
MIGRATIONS = r"""
return redis.call('HGETALL', KEYS[8])
"""

# KEYS: the thread's 8, tomb, lease. ARGV: the tombstone's time|'' (none left), its native
# TTL (ms)|''. Every key of the thread and its lease go; the tombstone stays (or is left).
_BURY = _AFTER + r"""
local function bury(at, ttl)
  local tomb = ''
  if at ~= '' then  -- `last \0 at`: the newest checkpoint id that goes (ord: "cid \0 ns")
    local m = redis.call('ZREVRANGEBYLEX', KEYS[2], '+', '-', 'LIMIT', 0, 1)
    local last = ''
    if #m > 0 then last = string.sub(m[1], 1, string.find(m[1], '\0', 1, true) - 1) end
    local old = redis.call('GET', KEYS[9])
    if old then
      local before = string.sub(old, 1, string.find(old, '\0', 1, true) - 1)
      if after(before, last) then last = before end
    end
    tomb = last .. '\0' .. at
  end
  redis.call('DEL', unpack(KEYS, 1, 8))
  redis.call('DEL', KEYS[10])
  if at == '' then return end
  if ttl == '' then redis.call('SET', KEYS[9], tomb) else redis.call('SET', KEYS[9], tomb, 'PX', ttl) end
end
"""

DELETE_THREAD = _BURY + r"""
bury(ARGV[1], ARGV[2])
return 1
"""

# The lifecycle row of a thread that has none yet (set_pinned, set_policy before the first
# write): created = written = now, gen 0. Returns whether it was made.
_NEW_ROW = r"""
local function new_row(now)
  if redis.call('EXISTS', KEYS[7]) == 1 then return false end
  redis.call('HSET', KEYS[7], 'created', now, 'written', now, 'gen', 0)
  return true
end
"""

# ARGV: '1' to pin | '' to unpin, ttl, now. Pinned: every key persists; unpinned: the TTL
# counts again from now. Makes the row if the thread has none.
PIN = _PRELUDE + _NEW_ROW + r"""
new_row(ARGV[3])
if ARGV[1] == '1' then
  redis.call('HSET', KEYS[7], 'pinned', '1')
else
  redis.call('HDEL', KEYS[7], 'pinned')
end
expire_all(ARGV[2])
return 1
"""

# ARGV: ttl. Refreshes the TTL of a thread that exists.
TOUCH = _PRELUDE + r"""
if redis.call('EXISTS', KEYS[1]) == 1 then expire_all(ARGV[1]) end
return 1
"""

# The thread's keys that exist.
EXISTING = r"""
local out = {}
for i = 1, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then out[#out + 1] = KEYS[i] end
end
return out
"""

# What the thread takes (`Store.sizes`): {ns, kind, channel, rows, bytes, ...} with kind c
# (checkpoint rows), b (blobs) or w (writes); bytes are the stored values' lengths. A write's
# channel is the first item of its msgpack array (a str header read in place, nothing decoded).
SIZES = r"""
local acc, order = {}, {}
local function add(ns, kind, ch, n)
  local key = ns .. '\0' .. kind .. '\0' .. ch
  local a = acc[key]
  if not a then
    a = {ns, kind, ch, 0, 0}
    acc[key] = a
    order[#order + 1] = key
  end
  a[4] = a[4] + 1
  a[5] = a[5] + n
end
local function write_channel(v)
  local b = string.byte(v, 2) or 0
  if b >= 0xa0 and b <= 0xbf then return string.sub(v, 3, 2 + b - 0xa0) end
  if b == 0xd9 then return string.sub(v, 4, 3 + string.byte(v, 3)) end
  if b == 0xda then return string.sub(v, 5, 4 + string.byte(v, 3) * 256 + string.byte(v, 4)) end
  return ''
end
for _, f in ipairs(redis.call('HKEYS', KEYS[3])) do
  add(string.sub(f, 1, string.find(f, '\0', 1, true) - 1), 'c', '', redis.call('HSTRLEN', KEYS[3], f))
end
for _, f in ipairs(redis.call('HKEYS', KEYS[4])) do
  local p1 = string.find(f, '\0', 1, true)
  local p2 = string.find(f, '\0', p1 + 1, true)
  add(string.sub(f, 1, p1 - 1), 'b', string.sub(f, p1 + 1, p2 - 1), redis.call('HSTRLEN', KEYS[4], f))
end
for _, f in ipairs(redis.call('HKEYS', KEYS[5])) do
  local v = redis.call('HGET', KEYS[5], f)
  add(string.sub(f, 1, string.find(f, '\0', 1, true) - 1), 'w', write_channel(v), #v)
end
local out = {}
for _, key in ipairs(order) do
  local a = acc[key]
  for i = 1, 5 do out[#out + 1] = a[i] end
end
return out
"""

# ARGV: policy | '' (none: the checkpointer's), ttl, now. Makes the row if the thread has none
# (with the TTL a write would give it, so that a row alone does not outlive it).
POLICY = _PRELUDE + _NEW_ROW + r"""
local made = new_row(ARGV[3])
if ARGV[1] == '' then
  redis.call('HDEL', KEYS[7], 'policy')
else
  redis.call('HSET', KEYS[7], 'policy', ARGV[1])
end
if made then expire_all(ARGV[2]) end
return 1
"""

# KEYS: meta. ARGV: now. The lifecycle row {created, written, read, gen, pinned, policy,
# swept}, or false if the thread has none. A row written before the lifecycle fields existed
# gets them now (created = written = now: its age counts from the first look, never less).
STATE = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return false end
redis.call('HSETNX', KEYS[1], 'created', ARGV[1])
redis.call('HSETNX', KEYS[1], 'written', ARGV[1])
return redis.call('HMGET', KEYS[1], 'created', 'written', 'read', 'gen', 'pinned', 'policy', 'swept')
"""

# KEYS: meta. ARGV: field, value. Sets a field of an existing row (a read's time, the swept
# generation); never makes a row (a key without the thread's TTL would outlive it).
SET_IF_ROW = r"""
if redis.call('EXISTS', KEYS[1]) == 0 then return 0 end
redis.call('HSET', KEYS[1], ARGV[1], ARGV[2])
return 1
"""

# KEYS: as DELETE_THREAD. ARGV: generation, tombstone's time|'', its TTL|''. Deletes the
# thread as DELETE_THREAD does if its row's gen is still that: 1; else 0.
EXPIRE = _BURY + r"""
local g = redis.call('HGET', KEYS[7], 'gen')
if not g then
  if redis.call('EXISTS', KEYS[7]) == 0 then return 0 end
  g = '0'
end
if g ~= ARGV[1] then return 0 end
bury(ARGV[2], ARGV[3])
return 1
"""

# KEYS: the sweep lock. ARGV: token, lease (ms). Extends the lease if the token still holds it.
LOCK_RENEW = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], ARGV[2])
end
return 0
"""

# KEYS: the sweep lock. ARGV: token. Releases it if the token still holds it.
LOCK_RELEASE = r"""
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""

# -- leases, tombstones, the epoch (KEYS: one key each; a lease row is `token \0 repr(expiry)`)

# KEYS: lease. ARGV: token, now, expiry. Takes (or renews, same token) unless another token's
# lease is live: 1; else 0.
LEASE_ACQUIRE = r"""
local l = redis.call('GET', KEYS[1])
if l then
  local p = string.find(l, '\0', 1, true)
  if string.sub(l, 1, p - 1) ~= ARGV[1] and tonumber(string.sub(l, p + 1)) > tonumber(ARGV[2]) then
    return 0
  end
end
redis.call('SET', KEYS[1], ARGV[1] .. '\0' .. ARGV[3])
return 1
"""

# KEYS: lease. ARGV: token, now, expiry. Extends the token's live lease: 1; else 0.
LEASE_RENEW = r"""
local l = redis.call('GET', KEYS[1])
if not l then return 0 end
local p = string.find(l, '\0', 1, true)
if string.sub(l, 1, p - 1) ~= ARGV[1] or tonumber(string.sub(l, p + 1)) <= tonumber(ARGV[2]) then
  return 0
end
redis.call('SET', KEYS[1], ARGV[1] .. '\0' .. ARGV[3])
return 1
"""

# KEYS: lease. ARGV: token. Drops the token's lease (nothing if another holds it).
LEASE_RELEASE = r"""
local l = redis.call('GET', KEYS[1])
if l and string.sub(l, 1, string.find(l, '\0', 1, true) - 1) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: tomb or lease. ARGV: before. Deletes the tombstone (its time after the newest id it
# keeps) or the lease row (its expiry after the token) if that is older than `before`: 1;
# else 0.
DROP_IF_BEFORE = r"""
local v = redis.call('GET', KEYS[1])
if not v then return 0 end
local p = string.find(v, '\0', 1, true)
if p then v = string.sub(v, p + 1) end
if tonumber(v) < tonumber(ARGV[1]) then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
"""

# KEYS: an index zset. ARGV: before, members. Drops the members still scored before `before`
# (one scored anew meanwhile stays).
UNINDEX_BEFORE = r"""
local n = 0
for i = 2, #ARGV do
  local s = redis.call('ZSCORE', KEYS[1], ARGV[i])
  if s and tonumber(s) < tonumber(ARGV[1]) then n = n + redis.call('ZREM', KEYS[1], ARGV[i]) end
end
return n
"""

# KEYS: epoch. ARGV: epoch. Raises the store's epoch to at least that; the epoch in force.
RAISE_EPOCH = r"""
local cur = tonumber(redis.call('GET', KEYS[1]) or '0')
local e = tonumber(ARGV[1])
if e > cur then
  redis.call('SET', KEYS[1], ARGV[1])
  return e
end
return cur
"""
