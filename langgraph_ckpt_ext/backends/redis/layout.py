"""The key layout: every key of one thread (eight) carries the same hash tag, so a thread lives in one
hash slot (one node of a Redis Cluster) and each of its operations is one atomic script.

    <prefix>:{<thread>}:ix    zset  ns\\0checkpoint_id          per-namespace order, newest last
    <prefix>:{<thread>}:ord   zset  checkpoint_id\\0ns          the thread's order across namespaces
    <prefix>:{<thread>}:cp    hash  ns\\0checkpoint_id -> checkpoint row
    <prefix>:{<thread>}:bl    hash  ns\\0channel\\0version -> blob (a value, or an append-delta)
    <prefix>:{<thread>}:wr    hash  ns\\0checkpoint_id\\0task_id\\0idx -> pending write
    <prefix>:{<thread>}:wx    zset  the fields of wr, so that one checkpoint's writes are a range
    <prefix>:{<thread>}:meta  hash  gen (a write counter), pinned, exp (the keys have a TTL),
                                    and the rest of the thread's lifecycle row: created (first
                                    write), written (last write), read, policy, swept (times
                                    are repr of the float; set by the write scripts)
    <prefix>:{<thread>}:mig   hash  ns\\0checkpoint_id\\0to_version -> from_version\\0migrated_at
                                    (the state-schema migration log; repr of the float)
    <prefix>:threads          zset  thread_id, scored by a deadline hint (ms; +inf: no TTL)
    <prefix>:runs             zset  run_id\\0thread_id (all scored 0: read by lexical range)
    <prefix>:layout           the layout's version
    <prefix>:audit            list  enabled\\0repr(at)\\0reason: the store's audit log, newest last
                                    (the newest entry is the store's audit setting)
    <prefix>:lifecycle        list  repr(at)\\0action\\0thread digest\\0checkpoints\\0reason: the
                                    deletions recorded (erasures, sweeps), oldest first
    <prefix>:sweep-lock       string  the token of the sweeper holding the lock (with a lease)

One writer per thread (`core.guard`): two keys of the thread's slot that no TTL of the
thread touches and `delete_thread` treats apart, and three of the store:

    <prefix>:{<thread>}:tomb  string  repr(clock) of the thread's deletion: its tombstone
                                      (outlives the thread; a native TTL of `tombstone_ttl`)
    <prefix>:{<thread>}:lease string  token \0 repr(expiry): the thread's lease row
    <prefix>:tombstones       zset  thread_id, scored by its tombstone's time (for the sweep)
    <prefix>:leases           zset  thread_id, scored by its lease's expiry (for the sweep)
    <prefix>:epoch            the store's writer epoch (absent: 0)

`<thread>` is the thread id with every byte outside [A-Za-z0-9_.-] percent-encoded, so no
thread id can close the hash tag early, reach another thread's keys, or be empty.
"""

from __future__ import annotations

import functools
import re

from ...core.errors import InvalidConfigError

# `mig` (the migration log) and `audit` came after version 1 without a version bump: each is a
# key of its own, which older data simply lacks (no log yet), and no older key changed its
# encoding. So did `lifecycle`, `sweep-lock` and meta's lifecycle fields: a meta hash without
# `created`/`written` gets them (= now) when a sweep first reads it, so that an older thread's
# age counts from then, never from a guess. So did the one-writer keys (tomb, lease, the
# tombstones and leases indexes, epoch) and meta's `ep`: older code reads every key it knows as
# before and simply checks nothing (as `writers="last_wins"` with no tombstones would).
LAYOUT_VERSION = 1
# Scripts address the keys by position (KEYS[1] ix ... KEYS[7] meta, KEYS[8] mig): a new key
# goes at the end, so that no script's index moves.
THREAD_KEYS = ("ix", "ord", "cp", "bl", "wr", "wx", "meta", "mig")

_PREFIX = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
_SAFE = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_.-")


def check_prefix(prefix: str) -> str:
    if not isinstance(prefix, str) or not _PREFIX.match(prefix):
        raise InvalidConfigError(
            f"invalid key_prefix {prefix!r}: use 1-64 letters, digits, '_', '.', ':' or '-'"
        )
    return prefix


def tag(thread_id: str) -> str:
    """The hash-tag body for a thread id (injective, never empty, never holding braces)."""
    raw = thread_id.encode("utf-8", "surrogatepass")
    return "".join(chr(b) if b in _SAFE else f"%{b:02X}" for b in raw) or "%"


@functools.lru_cache(maxsize=8192)
def thread_keys(prefix: str, thread_id: str) -> tuple[str, ...]:
    t = tag(thread_id)
    return tuple(f"{prefix}:{{{t}}}:{suffix}" for suffix in THREAD_KEYS)


@functools.lru_cache(maxsize=8192)
def guard_keys(prefix: str, thread_id: str) -> tuple[str, str]:
    """The thread's tombstone and lease keys (KEYS[9] and KEYS[10] of the guarded scripts)."""
    t = tag(thread_id)
    return f"{prefix}:{{{t}}}:tomb", f"{prefix}:{{{t}}}:lease"


def check_parts(*parts: str) -> None:
    """Namespaces, checkpoint ids, task ids, channels and versions are joined with NUL in
    members and fields: refuse a NUL inside one (PostgreSQL refuses it in text too)."""
    for part in parts:
        if "\0" in part:
            raise InvalidConfigError(f"{part!r} contains a NUL character, which cannot be stored")
