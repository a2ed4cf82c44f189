"""The work queue: items are (run, shard); a run is leased to one worker at a time.

Every state transition is one Lua script, so each is atomic on the Redis server:

    pending --claim--> leased --ack--> done
                       leased --release(preempted)--> pending           (attempts unchanged)
                       leased --release(error) / lease expiry--> pending (attempts + 1)
                                                  ... or dead         (attempts >= max_attempts)
                       leased --dead_letter(permanent error)--> dead

A packed worker (`claim_also`, issue 33) holds several runs' leases at once: after its claim, the runs nobody
holds whose next day is the same day of the same dataset, each lease made as `claim` makes one and living alone
(its token, deadline, heartbeat, ack, release and expiry), so a sweep's runs train as one stacked model.

Leases carry a fencing token (a global counter): only the holder of the current token can
heartbeat, ack or release. The token is also written into what the holder puts on the share (see
workload.share.checkpoint), so the share itself refuses a stale holder; `raise_token` keeps the counter
above every token on the share when Redis lost its data.

A reply can be lost after Redis ran the command (the connection dies in between), and the client sends it
again: a retried ack finds its item done, and a retried claim carries the id the worker drew for it and
gets back the lease it made, instead of leasing nothing while that lease runs out at the cost of an attempt.

Every item is validated when it is claimed: an item that is not valid JSON, lacks a field, has a
wrong type, names another run than the list it sits in, or names a run or dataset that is not a
plain folder name is dead-lettered at once with an error naming what is wrong.

Time comes from the Redis server (``TIME``), so workers with skewed clocks agree on when a lease
expired. Key names are built once (`Keys`) and handed to every script as KEYS; arguments are
named (`_Lua`). Scripts that walk the runs append a run name to a key stem inside Redis, so this
targets a single Redis instance (not Redis Cluster), which is what the stack deploys.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import PurePosixPath
from typing import Any, TypeVar

import redis
from redis.backoff import ExponentialBackoff
from redis.retry import Retry

from workload.core.errors import ItemFault
from workload.share.paths import check_name

log = logging.getLogger(__name__)
T = TypeVar("T")


class Keys:
    """Redis key names, built in one spot. Every Lua script gets all of them as KEYS, in `FIELDS`
    order, and reads them by name (``K.items``); no script spells a key name itself."""

    FIELDS = ("items", "runs", "specs", "leases", "attempts", "errors", "done", "dead", "acked_by", "token",
              "seeded", "alive", "pending_of", "lease_of", "launch")

    def __init__(self, prefix: str) -> None:
        self.items = f"{prefix}:items"  # hash  item id -> item JSON (kept forever: idempotent enqueue)
        self.runs = f"{prefix}:runs"  # set   run names
        self.specs = f"{prefix}:specs"  # hash  run -> hyperparameters JSON
        self.leases = f"{prefix}:leases"  # zset  run -> lease deadline (ms, server time)
        self.attempts = f"{prefix}:attempts"  # hash  item id -> failed attempts
        self.errors = f"{prefix}:errors"  # hash  item id -> last error text
        self.done = f"{prefix}:done"  # set   item ids
        self.dead = f"{prefix}:dead"  # hash  item id -> JSON {error, attempts, owner, at}
        self.acked_by = f"{prefix}:acked_by"  # hash  item id -> the owner whose ack made it done
        self.token = f"{prefix}:token"  # int   fencing token counter
        self.seeded = f"{prefix}:seeded"  # string  set by seed/restore: a queue without it was never filled
        self.alive = f"{prefix}:alive"  # int   server time (ms) a lease script last ran: gaps are Redis's outages
        # Per-run keys are these stems + the run name. A script that walks the runs (claim, reap, counts)
        # only learns them inside Redis, so it gets the stem and appends the run (pending_key/lease_key).
        self.pending_of = f"{prefix}:pending:"  # zset  item id -> chronological seq
        self.lease_of = f"{prefix}:lease:"  # hash  item, owner, token, deadline, ttl, forgiven, claimed_at, seq, claim
        # The scheduled loader's word to the launcher (infra/schedule.py): loads, added, scoring_days; summed.
        self.launch = f"{prefix}:launch"  # hash  LaunchRequest's fields -> counts not yet acted on

    def pending(self, run: str) -> str:
        return self.pending_of + run

    def lease(self, run: str) -> str:
        return self.lease_of + run

    def as_keys(self) -> list[str]:
        """KEYS for every script, in `FIELDS` order (the Lua prologue binds them by name)."""
        return [getattr(self, name) for name in self.FIELDS]


@dataclass(frozen=True)
class _Lua:
    """A script body and its named arguments: Python passes them by keyword, Lua reads ``A.<name>``
    (strings, as Redis hands every ARGV over)."""

    params: tuple[str, ...]
    body: str

    def source(self) -> str:
        keys = ", ".join(f"{name}=KEYS[{i}]" for i, name in enumerate(Keys.FIELDS, 1))
        args = ", ".join(f"{name}=ARGV[{i}]" for i, name in enumerate(self.params, 1))
        return (f"local K = {{{keys}}}\nlocal A = {{{args}}}\n"
                "local function pending_key(run) return K.pending_of..run end\n"
                "local function lease_key(run) return K.lease_of..run end\n" + self.body)


class _Script:
    """A `_Lua` registered on one client for one key prefix; called with its named arguments."""

    def __init__(self, client: redis.Redis, keys: Keys, lua: _Lua) -> None:
        self.params = lua.params
        self.keys = keys.as_keys()
        self.script = client.register_script(lua.source())

    def __call__(self, **args: Any) -> Any:
        if set(args) != set(self.params):
            raise TypeError(f"script arguments are {self.params}, got {tuple(args)}")
        return self.script(keys=self.keys, args=[args[name] for name in self.params])


# Shared Lua helpers: server time in ms, and the one place an item fails (back to pending or dead).
_HELPERS = """
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fail(run, id, seq, owner, err, max_attempts, now)
  local n = redis.call('HINCRBY', K.attempts, id, 1)
  redis.call('HSET', K.errors, id, err)
  if n >= max_attempts then
    redis.call('HSET', K.dead, id, cjson.encode({error=err, attempts=n, owner=owner, at=now}))
    return 'dead'
  end
  redis.call('ZADD', pending_key(run), seq, id)
  return 'pending'
end
local function drop_lease(run)
  redis.call('DEL', lease_key(run))
  redis.call('ZREM', K.leases, run)
end
-- Time Redis itself was away (frozen, out of memory, restarting) is not held against a lease: its
-- owner could not renew it then. When no lease script ran for more than a third of a lease's TTL
-- (a live owner renews three times a TTL), a lease still valid when Redis was last seen moves on by
-- the gap, once: only its owner's next renewal earns it another. A dead owner's lease is delayed by
-- one gap, then expires (Redis cannot tell an idle spell from a frozen one).
local function forgive(now)
  local last = tonumber(redis.call('GET', K.alive) or now)
  redis.call('SET', K.alive, now)
  local gap = now - last
  if gap <= 0 then return end
  for _, run in ipairs(redis.call('ZRANGEBYSCORE', K.leases, last, '+inf')) do
    local l = redis.call('HMGET', lease_key(run), 'deadline', 'ttl', 'forgiven')
    if l[1] and l[3] ~= '1' and gap * 3 > tonumber(l[2] or '0') then
      local deadline = tonumber(l[1]) + gap
      redis.call('HSET', lease_key(run), 'deadline', deadline, 'forgiven', '1')
      redis.call('ZADD', K.leases, deadline, run)
    end
  end
end
local function reap(now, max_attempts)
  forgive(now)
  local expired = redis.call('ZRANGEBYSCORE', K.leases, '-inf', now)
  for _, run in ipairs(expired) do
    local l = redis.call('HMGET', lease_key(run), 'item', 'owner', 'seq')
    drop_lease(run)
    if l[1] then
      fail(run, l[1], tonumber(l[3]), l[2], 'lease expired: owner '..tostring(l[2])..' stopped heartbeating',
           max_attempts, now)
    end
  end
  return #expired
end
-- Fencing compares the (token, owner) pair: even if a restored Redis handed a token out twice,
-- it would not be to the same worker.
local function owns(run, token, owner)
  local l = redis.call('HMGET', lease_key(run), 'token', 'owner')
  return l[1] == token and l[2] == owner
end
"""

# -> 1 when the item is new, 0 when its id was seen before (done and dead items included)
_ENQUEUE = _Lua(("id", "run", "seq", "item"), """
if redis.call('HSETNX', K.items, A.id, A.item) == 0 then return 0 end
redis.call('SADD', K.runs, A.run)
redis.call('ZADD', pending_key(A.run), tonumber(A.seq), A.id)
return 1
""")

# -> {item JSON, token, deadline, attempts, id, run}, or nil when no run without a lease has work.
# `claim` is an id the worker draws for each claim: a claim sent again because its reply was lost (the
# connection died after Redis ran it) finds the lease it already made and gets it back, charged nothing.
_CLAIM = _Lua(("owner", "ttl_ms", "max_attempts", "claim"), _HELPERS + """
local now = now_ms()
reap(now, tonumber(A.max_attempts))
for _, run in ipairs(redis.call('ZRANGE', K.leases, 0, -1)) do
  local l = redis.call('HMGET', lease_key(run), 'owner', 'claim', 'item', 'token', 'deadline')
  if l[1] == A.owner and l[2] == A.claim then
    local attempts = tonumber(redis.call('HGET', K.attempts, l[3]) or '0')
    return {redis.call('HGET', K.items, l[3]) or '', l[4], l[5], attempts, l[3], run}
  end
end
local runs = redis.call('SMEMBERS', K.runs)
table.sort(runs)
for _, run in ipairs(runs) do
  if redis.call('EXISTS', lease_key(run)) == 0 then
    local first = redis.call('ZRANGE', pending_key(run), 0, 0, 'WITHSCORES')
    if #first > 0 then
      local id, seq = first[1], first[2]
      redis.call('ZREM', pending_key(run), id)
      local token = redis.call('INCR', K.token)
      local deadline = now + tonumber(A.ttl_ms)
      redis.call('HSET', lease_key(run), 'item', id, 'owner', A.owner, 'token', token,
                 'deadline', deadline, 'ttl', A.ttl_ms, 'claimed_at', now, 'seq', seq, 'claim', A.claim)
      redis.call('ZADD', K.leases, deadline, run)
      local attempts = tonumber(redis.call('HGET', K.attempts, id) or '0')
      return {redis.call('HGET', K.items, id) or '', token, deadline, attempts, id, run}
    end
  end
end
return false
""")

# -> {{item JSON, token, deadline, attempts, id, run}, ...}: up to `count` more leases for `owner`, each its own
# (token, deadline, attempts), on runs nobody holds whose next pending item is of `dataset` and `shard` (the
# runs of a sweep that can train packed with a lease the owner already holds; a run's next item only: its days
# stay in order). Runs in name order, as claim. `claim`: as claim's, a resent call gets back the leases it made.
_CLAIM_ALSO = _Lua(("owner", "ttl_ms", "max_attempts", "claim", "dataset", "shard", "count"), _HELPERS + """
local now = now_ms()
reap(now, tonumber(A.max_attempts))
local out = {}
for _, run in ipairs(redis.call('ZRANGE', K.leases, 0, -1)) do
  local l = redis.call('HMGET', lease_key(run), 'owner', 'claim', 'item', 'token', 'deadline')
  if l[1] == A.owner and l[2] == A.claim then
    local attempts = tonumber(redis.call('HGET', K.attempts, l[3]) or '0')
    table.insert(out, {redis.call('HGET', K.items, l[3]) or '', l[4], l[5], attempts, l[3], run})
  end
end
if #out > 0 then return out end
local runs = redis.call('SMEMBERS', K.runs)
table.sort(runs)
for _, run in ipairs(runs) do
  if #out >= tonumber(A.count) then break end
  if redis.call('EXISTS', lease_key(run)) == 0 then
    local first = redis.call('ZRANGE', pending_key(run), 0, 0, 'WITHSCORES')
    if #first > 0 then
      local id, seq = first[1], first[2]
      local raw = redis.call('HGET', K.items, id) or ''
      local ok, item = pcall(cjson.decode, raw)
      if ok and type(item) == 'table' and item.dataset == A.dataset and item.shard == A.shard then
        redis.call('ZREM', pending_key(run), id)
        local token = redis.call('INCR', K.token)
        local deadline = now + tonumber(A.ttl_ms)
        redis.call('HSET', lease_key(run), 'item', id, 'owner', A.owner, 'token', token,
                   'deadline', deadline, 'ttl', A.ttl_ms, 'claimed_at', now, 'seq', seq, 'claim', A.claim)
        redis.call('ZADD', K.leases, deadline, run)
        local attempts = tonumber(redis.call('HGET', K.attempts, id) or '0')
        table.insert(out, {raw, token, deadline, attempts, id, run})
      end
    end
  end
end
return out
""")

# -> new deadline, or 0 when the lease is not ours any more
_HEARTBEAT = _Lua(("run", "token", "owner", "ttl_ms"), _HELPERS + """
local now = now_ms()
forgive(now)
if not owns(A.run, A.token, A.owner) then return 0 end
local deadline = now + tonumber(A.ttl_ms)
redis.call('HSET', lease_key(A.run), 'deadline', deadline, 'ttl', A.ttl_ms, 'forgiven', '0')
redis.call('ZADD', K.leases, deadline, A.run)
return deadline
""")

# -> {1, owner, items left in the run} acked, {2, who acked it} already done (a retried ack, or a peer's),
# {0, ''} refused. The count is read in the same script: a moment later a peer may have claimed the run's
# next day (no longer pending), and "nothing pending" would then look like "this ack finished the run".
_ACK = _Lua(("run", "token", "owner", "id"), _HELPERS + """
forgive(now_ms())
if owns(A.run, A.token, A.owner) and redis.call('HGET', lease_key(A.run), 'item') == A.id then
  drop_lease(A.run)
  redis.call('SADD', K.done, A.id)
  redis.call('HDEL', K.errors, A.id)
  redis.call('HSET', K.acked_by, A.id, A.owner)
  return {1, A.owner, redis.call('ZCARD', pending_key(A.run))}
end
if redis.call('SISMEMBER', K.done, A.id) == 1 then
  return {2, redis.call('HGET', K.acked_by, A.id) or '?'}
end
return {0, ''}
""")

# mode: 'preempted' | 'error' | 'dead' -> 'pending' | 'dead' | '' (refused: not the lease owner)
_RELEASE = _Lua(("run", "token", "owner", "mode", "error", "max_attempts"), _HELPERS + """
local now = now_ms()
forgive(now)
if not owns(A.run, A.token, A.owner) then return '' end
local l = redis.call('HMGET', lease_key(A.run), 'item', 'owner', 'seq')
drop_lease(A.run)
if A.mode == 'preempted' then
  redis.call('ZADD', pending_key(A.run), tonumber(l[3]), l[1])
  return 'pending'
end
local max_attempts = tonumber(A.max_attempts)
if A.mode == 'dead' then max_attempts = 1 end
return fail(A.run, l[1], tonumber(l[3]), l[2], A.error, max_attempts, now)
""")

# -> number of expired leases returned to the queue
_REAP = _Lua(("max_attempts",), _HELPERS + """
return reap(now_ms(), tonumber(A.max_attempts))
""")

# -> the counter after: never below `floor` (the highest token seen on the share)
_RAISE_TOKEN = _Lua(("floor",), """
local cur = tonumber(redis.call('GET', K.token) or '0')
if cur < tonumber(A.floor) then redis.call('SET', K.token, A.floor) return tonumber(A.floor) end
return cur
""")

# run, id: '' = all -> ids put back to pending (attempts reset)
_REQUEUE = _Lua(("run", "id"), """
local out = {}
for _, id in ipairs(redis.call('HKEYS', K.dead)) do
  local raw = redis.call('HGET', K.items, id)
  local ok, item = pcall(cjson.decode, raw or '')
  if ok and type(item) == 'table' and type(item.run) == 'string' and tonumber(item.seq)
     and (A.run == '' or item.run == A.run) and (A.id == '' or id == A.id) then
    redis.call('HDEL', K.dead, id)
    redis.call('HDEL', K.attempts, id)
    redis.call('HDEL', K.errors, id)
    redis.call('SADD', K.runs, item.run)
    redis.call('ZADD', pending_key(item.run), tonumber(item.seq), id)
    table.insert(out, id)
  end
end
return out
""")

# Under the run's lease: each [item id, seq] that is done goes back to pending (a re-application), and
# one already pending is re-ordered to its chronological seq. -> ids put back; false when not the owner
_REAPPLY = _Lua(("run", "token", "owner", "pairs"), _HELPERS + """
if not owns(A.run, A.token, A.owner) then return false end
local out = {}
for _, pair in ipairs(cjson.decode(A.pairs)) do
  if redis.call('SREM', K.done, pair[1]) == 1 then
    redis.call('HDEL', K.acked_by, pair[1])
    redis.call('ZADD', pending_key(A.run), pair[2], pair[1])
    table.insert(out, pair[1])
  elseif redis.call('ZSCORE', pending_key(A.run), pair[1]) then
    redis.call('ZADD', pending_key(A.run), pair[2], pair[1])
  end
end
return out
""")

# pairs: JSON [[run, item id], ...] -> how many pending items were marked done (restore: the share's
# checkpoints already record them)
_MARK_DONE = _Lua(("pairs",), """
local n = 0
for _, pair in ipairs(cjson.decode(A.pairs)) do
  if redis.call('ZREM', pending_key(pair[1]), pair[2]) == 1 then
    redis.call('SADD', K.done, pair[2])
    redis.call('HSET', K.acked_by, pair[2], 'restore from the share')
    n = n + 1
  end
end
return n
""")

# triples: JSON [[run, item id, seq], ...] -> the ids moved from done back to pending: the share's newest
# checkpoint does not record them (a Redis from an older snapshot, or a share restored from an older backup)
_UNDONE = _Lua(("triples",), """
local out = {}
for _, t in ipairs(cjson.decode(A.triples)) do
  if redis.call('SREM', K.done, t[2]) == 1 then
    redis.call('HDEL', K.acked_by, t[2])
    redis.call('ZADD', pending_key(t[1]), t[3], t[2])
    table.insert(out, t[2])
  end
end
return out
""")

# -> {pending, leased}: read together so "drained" is never a torn view
_COUNTS = _Lua((), """
local pending = 0
for _, run in ipairs(redis.call('SMEMBERS', K.runs)) do
  pending = pending + redis.call('ZCARD', pending_key(run))
end
return {pending, redis.call('ZCARD', K.leases)}
""")


@dataclass(frozen=True)
class Item:
    """One unit of work: apply `shard` (a path relative to the dataset folder) to `run`."""

    run: str
    shard: str
    dataset: str
    seq: int

    @property
    def id(self) -> str:
        return f"{self.run}/{self.shard}"

    def to_json(self) -> str:
        return json.dumps({"run": self.run, "shard": self.shard, "dataset": self.dataset, "seq": self.seq})

    @classmethod
    def parse(cls, text: str | bytes, item_id: str, run: str) -> Item:
        """The item stored under `item_id` in `run`'s list, or MalformedItem naming what is wrong.

        Names become folders on the share and the shard a path under the dataset: both are checked
        here, before anything touches the share (the dataset folder re-checks the shard)."""
        where = f"queue item {item_id!r}"
        try:
            data = json.loads(text)
        except (ValueError, UnicodeDecodeError) as exc:
            raise MalformedItem(f"{where}: not valid JSON ({exc}): {_clip(text)}") from None
        if not isinstance(data, dict):
            raise MalformedItem(f"{where}: expected a JSON object {{run, shard, dataset, seq}}, got {_clip(text)}")
        missing = [k for k in ("run", "shard", "dataset", "seq") if k not in data]
        if missing:
            raise MalformedItem(f"{where}: missing field(s) {missing}; an item is {{run, shard, dataset, seq}}")
        for key, kind in (("run", str), ("shard", str), ("dataset", str), ("seq", int)):
            if not isinstance(data[key], kind) or isinstance(data[key], bool):
                raise MalformedItem(f"{where}: field {key!r} must be a {kind.__name__}, got {data[key]!r}")
        if data["run"] != run:
            raise MalformedItem(f"{where}: names run {data['run']!r} but sits in the queue of run {run!r}")
        try:
            check_name(data["run"], "run")
            check_name(data["dataset"], "dataset")
        except ValueError as exc:
            raise MalformedItem(f"{where}: {exc}") from None
        shard = PurePosixPath(data["shard"])
        if shard.is_absolute() or ".." in shard.parts or not data["shard"]:
            raise MalformedItem(f"{where}: shard {data['shard']!r} must be a relative path inside the dataset "
                                "folder (no leading '/', no '..')")
        item = cls(run=data["run"], shard=data["shard"], dataset=data["dataset"], seq=data["seq"])
        if item.id != item_id:
            raise MalformedItem(f"{where}: its fields make the id {item.id!r}, not {item_id!r}")
        return item


def _clip(text: str | bytes, n: int = 80) -> str:
    shown = text.decode(errors="replace") if isinstance(text, bytes) else str(text)
    return repr(shown if len(shown) <= n else shown[:n] + "...")


class MalformedItem(ItemFault):
    """A queue item that no worker can process as it is (dead-lettered at claim)."""


@dataclass(frozen=True)
class AckResult:
    """What an ack did: 'acked' (by us), 'already-done' (by `by`: a retry, or a peer), 'refused'.
    `left` is how many of the run's items were still to do when ours was acked (-1 unless 'acked')."""

    state: str
    by: str = ""
    left: int = -1

    def __bool__(self) -> bool:
        return self.state != "refused"

    @property
    def finished_run(self) -> bool:
        """This ack was of the run's last item: nothing of the run was left to do at that instant."""
        return self.state == "acked" and self.left == 0


@dataclass(frozen=True)
class Lease:
    """A claimed item. `token` fences every later call: a stale holder is refused."""

    item: Item
    token: int
    owner: str
    deadline_ms: int
    attempts: int  # failed attempts before this claim


@dataclass(frozen=True)
class Counts:
    pending: int
    leased: int
    done: int
    dead: int
    total: int

    @property
    def drained(self) -> bool:
        return self.pending == 0 and self.leased == 0


@dataclass(frozen=True)
class LaunchRequest:
    """What the scheduled loads recorded since the launcher last acted: how many loads finished, the items
    they enqueued, the scoring/ days they published; and ``rescore``: training Jobs the launcher posted whose
    models no scoring Job has scored yet. ``loads == 0``: no load has finished since."""

    loads: int = 0
    added: int = 0
    scoring_days: int = 0
    rescore: int = 0

    FIELDS = ("loads", "added", "scoring_days", "rescore")


# Error replies about Redis's state, not about the request: out of memory under noeviction, a script
# running too long, loading its data set, a read-only replica, a failed disk save. They pass: wait.
# (redis-py strips the code from the replies it maps to a class; a script's error keeps it in the text.)
_STATE_CODES = ("OOM", "BUSY", "LOADING", "READONLY", "MASTERDOWN", "MISCONF", "NOREPLICAS", "TRYAGAIN",
                "CLUSTERDOWN")
_STATE_CLASSES = (redis.exceptions.OutOfMemoryError, redis.exceptions.ReadOnlyError,
                  redis.exceptions.MasterDownError, redis.exceptions.TryAgainError, redis.exceptions.ClusterDownError)


def transient(exc: BaseException) -> bool:
    """Whether `exc` says Redis cannot serve now (unreachable, timed out, or in a state that passes):
    an infrastructure fault to wait out, never the item's."""
    if isinstance(exc, redis.AuthenticationError):
        return False  # a ConnectionError subclass, but waiting will not fix a wrong password
    if isinstance(exc, (redis.ConnectionError, redis.TimeoutError, *_STATE_CLASSES)):
        return True
    text = str(exc)
    return isinstance(exc, redis.ResponseError) and any(
        text.startswith(code + " ") or f"-{code} " in text for code in _STATE_CODES)


class QueueUnavailable(RuntimeError):
    """Redis stayed unreachable for longer than the retry budget (an infrastructure fault)."""


class QueueInterrupted(QueueUnavailable):
    """A stop was asked (SIGTERM) while waiting for an unreachable Redis: give up waiting at once."""


CALL_TIMEOUT_S = 10.0  # a frozen Redis (SIGSTOP, a stuck node) fails a call after this instead of hanging it


def connect(url: str, password: str | None = None, *, timeout_s: float = CALL_TIMEOUT_S) -> redis.Redis:
    """A client that rides out short blips itself (each call tried 4 times, `timeout_s` each); `WorkQueue`
    retries longer outages."""
    return redis.Redis.from_url(
        url,
        password=password or None,
        socket_timeout=timeout_s,
        socket_connect_timeout=min(timeout_s, 3.0),
        health_check_interval=15,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), retries=3),
        retry_on_error=[redis.ConnectionError, redis.TimeoutError],
    )


class WorkQueue:
    def __init__(self, client: redis.Redis, prefix: str = "spottrain", *, max_attempts: int = 5,
                 retry_for_s: float = 300.0, interrupt: threading.Event | None = None) -> None:
        if max_attempts < 1:
            raise ValueError(f"max_attempts must be >= 1, got {max_attempts}")
        self.redis = client
        self.keys = Keys(prefix)
        self.max_attempts = max_attempts
        self.retry_for_s = retry_for_s
        self.interrupt = interrupt or threading.Event()  # set by SIGTERM: stop waiting for Redis
        self._enqueue = _Script(client, self.keys, _ENQUEUE)
        self._claim = _Script(client, self.keys, _CLAIM)
        self._claim_also = _Script(client, self.keys, _CLAIM_ALSO)
        self._heartbeat = _Script(client, self.keys, _HEARTBEAT)
        self._ack = _Script(client, self.keys, _ACK)
        self._release = _Script(client, self.keys, _RELEASE)
        self._reap = _Script(client, self.keys, _REAP)
        self._counts = _Script(client, self.keys, _COUNTS)
        self._raise_token = _Script(client, self.keys, _RAISE_TOKEN)
        self._requeue = _Script(client, self.keys, _REQUEUE)
        self._mark_done = _Script(client, self.keys, _MARK_DONE)
        self._reapply = _Script(client, self.keys, _REAPPLY)
        self._undone = _Script(client, self.keys, _UNDONE)

    # -- connection loss -------------------------------------------------------------------------
    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Retry `call` with capped exponential backoff while Redis is unreachable (e.g. restarting) or
        cannot serve (out of memory, loading): `transient` errors."""
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.2
        while True:
            try:
                return call()
            except redis.RedisError as exc:
                if not transient(exc):
                    raise
                away = isinstance(exc, redis.ConnectionError | redis.TimeoutError)
                why = "unreachable" if away else "unable to serve"
                if time.monotonic() + delay > deadline:
                    raise QueueUnavailable(
                        f"Redis {why} for {self.retry_for_s:.0f}s during {what}: {exc}") from exc
                log.warning("Redis %s during %s (%s); retrying in %.1fs", why, what, exc, delay)
                if self.interrupt.wait(delay):
                    raise QueueInterrupted(f"stopped while Redis was unreachable (during {what}): {exc}") from exc
                delay = min(delay * 2, 5.0)

    # -- producers -------------------------------------------------------------------------------
    def enqueue(self, items: Iterable[Item]) -> int:
        """Add items not seen before (done and dead items included). Returns how many were new."""
        added = 0
        for item in items:
            added += int(self._retrying("enqueue", lambda it=item: self._enqueue(
                id=it.id, run=it.run, seq=it.seq, item=it.to_json())))
        return added

    def put_spec(self, run: str, spec: dict[str, Any]) -> None:
        """Record a run's hyperparameters once; a different spec for an existing run is refused."""
        text = json.dumps(spec, sort_keys=True)
        if not self._retrying("put_spec", lambda: self.redis.hsetnx(self.keys.specs, run, text)):
            seen = self.spec(run)
            if seen != json.loads(text):
                raise ValueError(
                    f"run {run!r} already exists with hyperparameters {seen}; got {spec}. A run is one "
                    "model lineage: give the new hyperparameters a new run name.")

    def spec(self, run: str) -> dict[str, Any]:
        text = self._retrying("spec", lambda: self.redis.hget(self.keys.specs, run))
        if text is None:
            raise KeyError(f"run {run!r} has no hyperparameters in Redis (seed it first)")
        return json.loads(text)

    # -- consumers -------------------------------------------------------------------------------
    def claim(self, owner: str, ttl_s: float) -> Lease | None:
        """Atomically reap expired leases and lease the next shard of a run nobody holds.

        A malformed item is dead-lettered here, on its first claim, and the next one is claimed. Each
        claim carries an id drawn here: resent (by redis-py or `_retrying`) after its reply was lost, it
        gets back the lease it made instead of leaving that lease to expire at the cost of an attempt."""
        while True:
            claim_id = uuid.uuid4().hex
            got = self._retrying("claim", lambda cid=claim_id: self._claim(
                owner=owner, ttl_ms=int(ttl_s * 1000), max_attempts=self.max_attempts, claim=cid))
            if not got:
                return None
            raw, token, deadline, attempts, item_id, run = got
            item_id, run = item_id.decode(errors="replace"), run.decode(errors="replace")
            try:
                item = Item.parse(raw, item_id, run)
            except MalformedItem as exc:
                state = self._release_raw(run, int(token), owner, "dead", str(exc))
                log.error("%s -> %s", exc, state or "refused")
                continue
            return Lease(item=item, token=int(token), owner=owner, deadline_ms=int(deadline),
                         attempts=int(attempts))

    def claim_also(self, first: Lease, ttl_s: float, count: int) -> list[Lease]:
        """Up to `count` more leases for `first`'s owner, in one atomic step: runs nobody holds whose next day
        is `first`'s day of `first`'s dataset (a sweep's runs that may train packed with it). Each lease is a
        lease as `claim` makes them (its own token, deadline and attempts; heartbeat, ack and release it
        alone). Fewer, or none, when fewer such runs wait. A malformed item is dead-lettered, as at claim."""
        if count < 1:
            return []
        claim_id = uuid.uuid4().hex
        got = self._retrying("claim_also", lambda: self._claim_also(
            owner=first.owner, ttl_ms=int(ttl_s * 1000), max_attempts=self.max_attempts, claim=claim_id,
            dataset=first.item.dataset, shard=first.item.shard, count=int(count)))
        leases = []
        for raw, token, deadline, attempts, item_id, run in got:
            item_id, run = item_id.decode(errors="replace"), run.decode(errors="replace")
            try:
                item = Item.parse(raw, item_id, run)
            except MalformedItem as exc:
                state = self._release_raw(run, int(token), first.owner, "dead", str(exc))
                log.error("%s -> %s", exc, state or "refused")
                continue
            leases.append(Lease(item=item, token=int(token), owner=first.owner, deadline_ms=int(deadline),
                                attempts=int(attempts)))
        return leases

    def _release_raw(self, run: str, token: int, owner: str, mode: str, error: str) -> str:
        res = self._retrying("release", lambda: self._release(
            run=run, token=token, owner=owner, mode=mode, error=error,
            max_attempts=self.max_attempts))
        return res.decode() if isinstance(res, bytes) else str(res)

    def heartbeat(self, lease: Lease, ttl_s: float) -> int | None:
        """Extend the lease; None means it is no longer ours (expired and reaped, or taken over)."""
        deadline = self._heartbeat(run=lease.item.run, token=lease.token, owner=lease.owner,
                                   ttl_ms=int(ttl_s * 1000))
        return int(deadline) or None

    def holds(self, lease: Lease) -> bool:
        """Whether `lease` is still the current lease of its run (the fencing check)."""
        token, owner = self._retrying("holds", lambda: self.redis.hmget(self.keys.lease(lease.item.run),
                                                                         "token", "owner"))
        return token is not None and int(token) == lease.token and owner.decode() == lease.owner

    def ack(self, lease: Lease) -> AckResult:
        """Mark done. 'already-done' names who acked it; 'refused' (falsy) when the lease is not ours."""
        code, by, *left = self._retrying("ack", lambda: self._ack(
            run=lease.item.run, token=lease.token, owner=lease.owner, id=lease.item.id))
        by = by.decode() if isinstance(by, bytes) else str(by)
        return AckResult({1: "acked", 2: "already-done"}.get(int(code), "refused"), by, int(left[0]) if left else -1)

    def release(self, lease: Lease, *, error: str | None = None, permanent: bool = False) -> str | None:
        """Give the item back. Without `error` (preemption) it costs no attempt; with one it
        counts an attempt and dead-letters at max_attempts; `permanent` dead-letters at once.
        Returns the item's new state ('pending' | 'dead'), or None when refused (not the owner)."""
        mode = "dead" if permanent else ("error" if error else "preempted")
        state = self._release_raw(lease.item.run, lease.token, lease.owner, mode, error or "")
        if not state:
            log.warning("release of %s refused: token %d no longer holds the lease",
                        lease.item.id, lease.token)
            return None
        return state

    def reap(self) -> int:
        """Return expired leases to the queue (any live worker may call this)."""
        return int(self._retrying("reap", lambda: self._reap(max_attempts=self.max_attempts)))

    # -- repair ----------------------------------------------------------------------------------
    def raise_token(self, floor: int) -> int:
        """Keep the token counter at or above `floor` (the highest token on the share); returns it."""
        return int(self._retrying("raise_token", lambda: self._raise_token(floor=int(floor))))

    def requeue(self, run: str | None = None, item_id: str | None = None) -> list[str]:
        """Put dead-lettered items (all, one run's, or one) back to pending with attempts reset."""
        res = self._retrying("requeue", lambda: self._requeue(run=run or "", id=item_id or ""))
        return sorted(r.decode() for r in res)

    def reapply(self, lease: Lease, later: list[tuple[str, int]]) -> list[str] | None:
        """Under `lease`, put the run's later days (item id, chronological seq) that are done back to
        pending, and re-order the pending ones by seq: after a rewind they are applied again in date
        order. Returns the ids put back, or None when the lease is not ours (nothing changed)."""
        res = self._retrying("reapply", lambda: self._reapply(
            run=lease.item.run, token=lease.token, owner=lease.owner, pairs=json.dumps([list(p) for p in later])))
        return None if res is None else [r.decode() for r in res]

    def mark_done(self, items: Iterable[Item]) -> int:
        """Mark pending items done without training them (the share records them as applied)."""
        pairs = [[it.run, it.id] for it in items]
        if not pairs:
            return 0
        return int(self._retrying("mark_done", lambda: self._mark_done(pairs=json.dumps(pairs))))

    def mark_pending(self, items: Iterable[Item]) -> list[str]:
        """Put done items back to pending at their seq (the share does not record them as applied); the ids
        moved (one already pending, or moved by a peer first, is not)."""
        triples = [[it.run, it.id, it.seq] for it in items]
        if not triples:
            return []
        res = self._retrying("mark_pending", lambda: self._undone(triples=json.dumps(triples)))
        return [r.decode() for r in res]

    def done_ids(self) -> set[str]:
        """The ids of every item Redis calls done."""
        return {d.decode(errors="replace") for d in self._retrying("done_ids", lambda: self.redis.smembers(
            self.keys.done))}

    def mark_seeded(self) -> None:
        """Record that the queue was filled from the share: an empty queue without it was wiped."""
        self._retrying("mark_seeded", lambda: self.redis.set(self.keys.seeded, "1"))

    def seeded(self) -> bool:
        return bool(self._retrying("seeded", lambda: self.redis.exists(self.keys.seeded)))

    # -- the scheduled loader and the launcher -------------------------------------------------------
    def request_launch(self, added: int, scoring_days: int) -> None:
        """The scheduled loader's last step: one more finished load, with what it added. Summed into what the
        launcher has not acted on yet, so a load whose launcher failed is carried, not overwritten."""
        def write() -> list[Any]:
            pipe = self.redis.pipeline(transaction=True)
            for name, value in (("loads", 1), ("added", added), ("scoring_days", scoring_days)):
                pipe.hincrby(self.keys.launch, name, value)
            return pipe.execute()

        self._retrying("request_launch", write)

    def launch_request(self) -> LaunchRequest:
        """What the loads recorded and no launcher has acted on (read only: ``launch_done`` takes it away)."""
        raw = self._retrying("launch_request", lambda: self.redis.hmget(self.keys.launch, *LaunchRequest.FIELDS))
        return LaunchRequest(*(int(v or 0) for v in raw))

    def launch_done(self, acted: LaunchRequest, owe_scoring: bool = False) -> None:
        """The launcher acted on ``acted``: subtract it, keeping what loads recorded meanwhile; ``owe_scoring``: it
        posted a training Job, whose models a scoring Job must score (``rescore``). Called after each Job was
        posted, so a launcher that dies first leaves that part for the next one (a second POST of a fixed name is
        a 409, "exists")."""
        def write() -> list[Any]:
            pipe = self.redis.pipeline(transaction=True)
            for name in LaunchRequest.FIELDS:
                pipe.hincrby(self.keys.launch, name, -getattr(acted, name) + (name == "rescore" and owe_scoring))
            return pipe.execute()

        self._retrying("launch_done", write)

    # -- observers -------------------------------------------------------------------------------
    def known(self) -> tuple[set[str], set[str], int]:
        """(item ids, runs with hyperparameters, token counter), read together: what the queue knows,
        to compare with the share (a Redis restored from an older snapshot knows less)."""
        def read() -> list[Any]:
            pipe = self.redis.pipeline(transaction=True)
            pipe.hkeys(self.keys.items).hkeys(self.keys.specs).get(self.keys.token)
            return pipe.execute()

        ids, specs, token = self._retrying("known", read)
        return ({i.decode(errors="replace") for i in ids}, {r.decode(errors="replace") for r in specs},
                int(token or 0))

    def pending_in_run(self, run: str) -> int:
        return int(self._retrying("pending_in_run", lambda: self.redis.zcard(self.keys.pending(run))))

    def counts(self) -> Counts:
        pending, leased = self._retrying("counts", lambda: self._counts())

        def read() -> list[Any]:
            # The pipeline is built inside the retried call: redis-py empties a pipeline whose execute failed, so
            # retrying the same pipeline's execute after a Redis restart sent nothing and returned [].
            pipe = self.redis.pipeline(transaction=True)
            pipe.scard(self.keys.done).hlen(self.keys.dead).hlen(self.keys.items)
            return pipe.execute()

        done, dead, total = self._retrying("counts", read)
        return Counts(pending=int(pending), leased=int(leased), done=int(done), dead=int(dead),
                      total=int(total))

    def snapshot(self) -> dict[str, Any]:
        """Everything `status` shows, read in one transaction."""
        def read() -> dict[str, Any]:
            runs = sorted(r.decode() for r in self.redis.smembers(self.keys.runs))
            pipe = self.redis.pipeline(transaction=True)
            pipe.hgetall(self.keys.items).smembers(self.keys.done).hgetall(self.keys.dead)
            pipe.hgetall(self.keys.attempts).hgetall(self.keys.errors)
            pipe.time()
            for run in runs:
                pipe.zrange(self.keys.pending(run), 0, -1).hgetall(self.keys.lease(run))
            res = pipe.execute()
            return {"runs": runs, "res": res}

        got = self._retrying("snapshot", read)
        runs, res = got["runs"], got["res"]
        items = {k.decode(errors="replace"): _run_of(k, v, runs) for k, v in res[0].items()}
        done = {d.decode() for d in res[1]}
        dead = {k.decode(errors="replace"): json.loads(v) for k, v in res[2].items()}
        attempts = {k.decode(errors="replace"): int(v) for k, v in res[3].items()}
        errors = {k.decode(errors="replace"): v.decode(errors="replace") for k, v in res[4].items()}
        secs, micros = res[5]
        now_ms = int(secs) * 1000 + int(micros) // 1000
        out: dict[str, Any] = {"now_ms": now_ms, "runs": {}}
        for i, run in enumerate(runs):
            pending = [p.decode(errors="replace") for p in res[6 + 2 * i]]
            lease = {k.decode(): v.decode(errors="replace") for k, v in res[7 + 2 * i].items()}
            run_items = [i for i, r in items.items() if r == run]
            out["runs"][run] = {
                "total": len(run_items),
                "done": sum(1 for i in run_items if i in done),
                "dead": {i: dead[i] for i in dead if items.get(i) == run},
                "pending": pending,
                "lease": lease or None,
                "attempts": {i: attempts[i] for i in attempts if items.get(i) == run},
                "errors": {i: errors[i] for i in errors if items.get(i) == run},
            }
        return out


def _run_of(item_id: bytes, raw: bytes, runs: list[str]) -> str:
    """The run an item is shown under by `status`: its JSON's when that run has a queue, else the
    queue its id belongs to (a malformed item), so every dead letter shows up somewhere."""
    try:
        run = json.loads(raw)["run"]
        if isinstance(run, str) and run in runs:
            return run
    except (ValueError, KeyError, TypeError, UnicodeDecodeError):
        pass
    text = item_id.decode(errors="replace")
    owners = [r for r in runs if text.startswith(r + "/")]
    return max(owners, key=len) if owners else text.split("/", 1)[0]
