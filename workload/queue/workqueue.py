"""The work queue: items are (run, shard); a run is leased to one worker at a time.

Every state transition is one Lua script, so each is atomic on the Redis server:

    pending --claim--> leased --ack--> done
                       leased --release(preempted)--> pending           (attempts unchanged)
                       leased --release(error) / lease expiry--> pending (attempts + 1)
                                                  ... or dead         (attempts >= max_attempts)
                       leased --dead_letter(permanent error)--> dead

Leases carry a fencing token (a global counter): only the holder of the current token can
heartbeat, ack or release. The token is also written into what the holder puts on the share (see
workload.share.checkpoint), so the share itself refuses a stale holder; `raise_token` keeps the counter
above every token on the share when Redis lost its data.

Every item is validated when it is claimed: an item that is not valid JSON, lacks a field, has a
wrong type, names another run than the list it sits in, or names a run or dataset that is not a
plain folder name is dead-lettered at once with an error naming what is wrong.

Time comes from the Redis server (``TIME``), so workers with skewed clocks agree on when a lease
expired. The scripts take the key prefix as an argument, so this targets a single Redis instance
(not Redis Cluster), which is what the stack deploys.
"""

from __future__ import annotations

import json
import logging
import threading
import time
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
    """Redis key names, built in one spot."""

    def __init__(self, prefix: str) -> None:
        self.prefix = prefix
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

    def pending(self, run: str) -> str:
        return f"{self.prefix}:pending:{run}"  # zset item id -> chronological seq

    def lease(self, run: str) -> str:
        return f"{self.prefix}:lease:{run}"  # hash item, owner, token, deadline, claimed_at, seq


# Shared Lua prelude: server time in ms, and the one place an item fails (back to pending or dead).
_PRELUDE = """
local p = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function fail(run, id, seq, owner, err, max_attempts, now)
  local n = redis.call('HINCRBY', p..':attempts', id, 1)
  redis.call('HSET', p..':errors', id, err)
  if n >= max_attempts then
    redis.call('HSET', p..':dead', id, cjson.encode({error=err, attempts=n, owner=owner, at=now}))
    return 'dead'
  end
  redis.call('ZADD', p..':pending:'..run, seq, id)
  return 'pending'
end
local function drop_lease(run)
  redis.call('DEL', p..':lease:'..run)
  redis.call('ZREM', p..':leases', run)
end
local function reap(now, max_attempts)
  local expired = redis.call('ZRANGEBYSCORE', p..':leases', '-inf', now)
  for _, run in ipairs(expired) do
    local l = redis.call('HMGET', p..':lease:'..run, 'item', 'owner', 'seq')
    drop_lease(run)
    if l[1] then
      fail(run, l[1], tonumber(l[3]), l[2], 'lease expired: owner '..tostring(l[2])..' stopped heartbeating',
           max_attempts, now)
    end
  end
  return #expired
end
"""

# ARGV: prefix, item id, run, seq, item JSON
_ENQUEUE = """
local p = ARGV[1]
if redis.call('HSETNX', p..':items', ARGV[2], ARGV[5]) == 0 then return 0 end
redis.call('SADD', p..':runs', ARGV[3])
redis.call('ZADD', p..':pending:'..ARGV[3], tonumber(ARGV[4]), ARGV[2])
return 1
"""

# ARGV: prefix, owner, ttl_ms, max_attempts
_CLAIM = _PRELUDE + """
local now = now_ms()
reap(now, tonumber(ARGV[4]))
local runs = redis.call('SMEMBERS', p..':runs')
table.sort(runs)
for _, run in ipairs(runs) do
  if redis.call('EXISTS', p..':lease:'..run) == 0 then
    local first = redis.call('ZRANGE', p..':pending:'..run, 0, 0, 'WITHSCORES')
    if #first > 0 then
      local id, seq = first[1], first[2]
      redis.call('ZREM', p..':pending:'..run, id)
      local token = redis.call('INCR', p..':token')
      local deadline = now + tonumber(ARGV[3])
      redis.call('HSET', p..':lease:'..run, 'item', id, 'owner', ARGV[2], 'token', token,
                 'deadline', deadline, 'claimed_at', now, 'seq', seq)
      redis.call('ZADD', p..':leases', deadline, run)
      local attempts = tonumber(redis.call('HGET', p..':attempts', id) or '0')
      return {redis.call('HGET', p..':items', id) or '', token, deadline, attempts, id, run}
    end
  end
end
return false
"""

# Fencing compares the (token, owner) pair: even if a restored Redis handed a token out twice,
# it would not be to the same worker.
_OWNS = """
local function owns(run, token, owner)
  local l = redis.call('HMGET', p..':lease:'..run, 'token', 'owner')
  return l[1] == token and l[2] == owner
end
"""

# ARGV: prefix, run, token, ttl_ms, owner  -> new deadline, or 0 when the lease is not ours any more
_HEARTBEAT = _PRELUDE + _OWNS + """
local key = p..':lease:'..ARGV[2]
if not owns(ARGV[2], ARGV[3], ARGV[5]) then return 0 end
local deadline = now_ms() + tonumber(ARGV[4])
redis.call('HSET', key, 'deadline', deadline)
redis.call('ZADD', p..':leases', deadline, ARGV[2])
return deadline
"""

# ARGV: prefix, run, token, item id, owner
# -> {1, owner} acked, {2, who acked it} already done (a retried ack, or a peer's), {0, ''} refused
_ACK = _PRELUDE + _OWNS + """
local key = p..':lease:'..ARGV[2]
if owns(ARGV[2], ARGV[3], ARGV[5]) and redis.call('HGET', key, 'item') == ARGV[4] then
  drop_lease(ARGV[2])
  redis.call('SADD', p..':done', ARGV[4])
  redis.call('HDEL', p..':errors', ARGV[4])
  redis.call('HSET', p..':acked_by', ARGV[4], ARGV[5])
  return {1, ARGV[5]}
end
if redis.call('SISMEMBER', p..':done', ARGV[4]) == 1 then
  return {2, redis.call('HGET', p..':acked_by', ARGV[4]) or '?'}
end
return {0, ''}
"""

# ARGV: prefix, floor -> the counter after: never below `floor` (the highest token seen on the share)
_RAISE_TOKEN = """
local p = ARGV[1]
local cur = tonumber(redis.call('GET', p..':token') or '0')
if cur < tonumber(ARGV[2]) then redis.call('SET', p..':token', ARGV[2]) return tonumber(ARGV[2]) end
return cur
"""

# ARGV: prefix, run ('' = all), item id ('' = all) -> ids put back to pending (attempts reset)
_REQUEUE = """
local p = ARGV[1]
local out = {}
for _, id in ipairs(redis.call('HKEYS', p..':dead')) do
  local raw = redis.call('HGET', p..':items', id)
  local ok, item = pcall(cjson.decode, raw or '')
  if ok and type(item) == 'table' and type(item.run) == 'string' and tonumber(item.seq)
     and (ARGV[2] == '' or item.run == ARGV[2]) and (ARGV[3] == '' or id == ARGV[3]) then
    redis.call('HDEL', p..':dead', id)
    redis.call('HDEL', p..':attempts', id)
    redis.call('HDEL', p..':errors', id)
    redis.call('SADD', p..':runs', item.run)
    redis.call('ZADD', p..':pending:'..item.run, tonumber(item.seq), id)
    table.insert(out, id)
  end
end
return out
"""

# ARGV: prefix, then (run, item id) pairs -> how many pending items were marked done (restore: the
# share's checkpoints already record them)
_MARK_DONE = """
local p = ARGV[1]
local n = 0
for i = 2, #ARGV, 2 do
  if redis.call('ZREM', p..':pending:'..ARGV[i], ARGV[i + 1]) == 1 then
    redis.call('SADD', p..':done', ARGV[i + 1])
    redis.call('HSET', p..':acked_by', ARGV[i + 1], 'restore from the share')
    n = n + 1
  end
end
return n
"""

# ARGV: prefix, run, token, mode ('preempted' | 'error' | 'dead'), error text, max_attempts, owner
# -> 'pending' | 'dead' | '' (refused: not the lease owner)
_RELEASE = _PRELUDE + _OWNS + """
local key = p..':lease:'..ARGV[2]
if not owns(ARGV[2], ARGV[3], ARGV[7]) then return '' end
local l = redis.call('HMGET', key, 'item', 'owner', 'seq')
drop_lease(ARGV[2])
local now = now_ms()
if ARGV[4] == 'preempted' then
  redis.call('ZADD', p..':pending:'..ARGV[2], tonumber(l[3]), l[1])
  return 'pending'
end
local max_attempts = tonumber(ARGV[6])
if ARGV[4] == 'dead' then max_attempts = 1 end
return fail(ARGV[2], l[1], tonumber(l[3]), l[2], ARGV[5], max_attempts, now)
"""

# ARGV: prefix, max_attempts -> number of expired leases returned to the queue
_REAP = _PRELUDE + """
return reap(now_ms(), tonumber(ARGV[2]))
"""

# ARGV: prefix -> {pending, leased}: read together so "drained" is never a torn view
_COUNTS = """
local p = ARGV[1]
local pending = 0
for _, run in ipairs(redis.call('SMEMBERS', p..':runs')) do
  pending = pending + redis.call('ZCARD', p..':pending:'..run)
end
return {pending, redis.call('ZCARD', p..':leases')}
"""


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
    """What an ack did: 'acked' (by us), 'already-done' (by `by`: a retry, or a peer), 'refused'."""

    state: str
    by: str = ""

    def __bool__(self) -> bool:
        return self.state != "refused"


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
        self._enqueue = client.register_script(_ENQUEUE)
        self._claim = client.register_script(_CLAIM)
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._ack = client.register_script(_ACK)
        self._release = client.register_script(_RELEASE)
        self._reap = client.register_script(_REAP)
        self._counts = client.register_script(_COUNTS)
        self._raise_token = client.register_script(_RAISE_TOKEN)
        self._requeue = client.register_script(_REQUEUE)
        self._mark_done = client.register_script(_MARK_DONE)

    # -- connection loss -------------------------------------------------------------------------
    def _retrying(self, what: str, call: Callable[[], T]) -> T:
        """Retry `call` with capped exponential backoff while Redis is unreachable (e.g. restarting)."""
        deadline = time.monotonic() + self.retry_for_s
        delay = 0.2
        while True:
            try:
                return call()
            except redis.AuthenticationError:
                raise  # a ConnectionError subclass, but waiting will not fix a wrong password
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                if time.monotonic() + delay > deadline:
                    raise QueueUnavailable(
                        f"Redis unreachable for {self.retry_for_s:.0f}s during {what}: {exc}") from exc
                log.warning("Redis unreachable during %s (%s); retrying in %.1fs", what, exc, delay)
                if self.interrupt.wait(delay):
                    raise QueueInterrupted(f"stopped while Redis was unreachable (during {what}): {exc}") from exc
                delay = min(delay * 2, 5.0)

    def _p(self) -> str:
        return self.keys.prefix

    # -- producers -------------------------------------------------------------------------------
    def enqueue(self, items: Iterable[Item]) -> int:
        """Add items not seen before (done and dead items included). Returns how many were new."""
        added = 0
        for item in items:
            added += int(self._retrying("enqueue", lambda it=item: self._enqueue(
                args=[self._p(), it.id, it.run, it.seq, it.to_json()])))
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

        A malformed item is dead-lettered here, on its first claim, and the next one is claimed."""
        while True:
            got = self._retrying("claim", lambda: self._claim(
                args=[self._p(), owner, int(ttl_s * 1000), self.max_attempts]))
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

    def _release_raw(self, run: str, token: int, owner: str, mode: str, error: str) -> str:
        res = self._retrying("release", lambda: self._release(
            args=[self._p(), run, token, mode, error, self.max_attempts, owner]))
        return res.decode() if isinstance(res, bytes) else str(res)

    def heartbeat(self, lease: Lease, ttl_s: float) -> int | None:
        """Extend the lease; None means it is no longer ours (expired and reaped, or taken over)."""
        deadline = self._heartbeat(args=[self._p(), lease.item.run, lease.token, int(ttl_s * 1000), lease.owner])
        return int(deadline) or None

    def holds(self, lease: Lease) -> bool:
        """Whether `lease` is still the current lease of its run (the fencing check)."""
        token, owner = self._retrying("holds", lambda: self.redis.hmget(self.keys.lease(lease.item.run),
                                                                         "token", "owner"))
        return token is not None and int(token) == lease.token and owner.decode() == lease.owner

    def ack(self, lease: Lease) -> AckResult:
        """Mark done. 'already-done' names who acked it; 'refused' (falsy) when the lease is not ours."""
        code, by = self._retrying("ack", lambda: self._ack(
            args=[self._p(), lease.item.run, lease.token, lease.item.id, lease.owner]))
        by = by.decode() if isinstance(by, bytes) else str(by)
        return AckResult({1: "acked", 2: "already-done"}.get(int(code), "refused"), by)

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
        return int(self._retrying("reap", lambda: self._reap(args=[self._p(), self.max_attempts])))

    # -- repair ----------------------------------------------------------------------------------
    def raise_token(self, floor: int) -> int:
        """Keep the token counter at or above `floor` (the highest token on the share); returns it."""
        return int(self._retrying("raise_token", lambda: self._raise_token(args=[self._p(), int(floor)])))

    def requeue(self, run: str | None = None, item_id: str | None = None) -> list[str]:
        """Put dead-lettered items (all, one run's, or one) back to pending with attempts reset."""
        res = self._retrying("requeue", lambda: self._requeue(args=[self._p(), run or "", item_id or ""]))
        return sorted(r.decode() for r in res)

    def mark_done(self, items: Iterable[Item]) -> int:
        """Mark pending items done without training them (the share records them as applied)."""
        args: list[str] = [self._p()]
        for it in items:
            args += [it.run, it.id]
        return int(self._retrying("mark_done", lambda: self._mark_done(args=args))) if len(args) > 1 else 0

    def mark_seeded(self) -> None:
        """Record that the queue was filled from the share: an empty queue without it was wiped."""
        self._retrying("mark_seeded", lambda: self.redis.set(self.keys.seeded, "1"))

    def seeded(self) -> bool:
        return bool(self._retrying("seeded", lambda: self.redis.exists(self.keys.seeded)))

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
        pending, leased = self._retrying("counts", lambda: self._counts(args=[self._p()]))
        pipe = self.redis.pipeline(transaction=True)
        pipe.scard(self.keys.done).hlen(self.keys.dead).hlen(self.keys.items)
        done, dead, total = self._retrying("counts", pipe.execute)
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
