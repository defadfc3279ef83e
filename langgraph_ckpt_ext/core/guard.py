"""One writer per thread: what a write must find in the store to be allowed (`Guard`), and the
one decision every backend applies to what it finds there, atomically with the write.

The rule (`writers="single"`), per thread and namespace, whose head is its newest checkpoint:

- a put whose parent is the head chains onto it: allowed;
- else, a put from a run that read the namespace (`get_tuple` stamps the head it saw into the
  config it returns, `HEAD_KEY`, and LangGraph carries that config into every put of the run)
  is allowed only if the head is still the one it saw: nothing was written since, so starting
  from an older checkpoint is a deliberate fork (time travel, `update_state` on an old
  checkpoint); a head written meanwhile means another run got there first: refused;
- a put with no stamp comes from a run that found the namespace empty (`get_tuple` returned
  nothing to stamp) or from a direct `put`: with a parent that is not the head it is refused
  (another run chained onto the namespace meanwhile); with no parent it is allowed, unless
  it is a run's first checkpoint (`source="input"`, `step=-1`) and another run's checkpoint
  is there now: the race of two runs starting a new thread. Direct puts with no parent
  (LangGraph's own conformance suite writes so) are allowed.

A tombstone left by `delete_thread` refuses a late put that has a parent (its run read the
thread before the delete) into an emptied namespace, and late pending writes for a
checkpoint that is gone. A lease refuses writers without its token; an epoch fences off a
demoted primary's writers. `last_wins` skips the head rule only.
"""

from __future__ import annotations

import contextvars
from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from .errors import (
    ConcurrentWriteError,
    FencedError,
    LeaseLostError,
    ThreadDeletedError,
    ThreadLeasedError,
)

HEAD_KEY = "__lgx_head__"
"""`configurable` key `get_tuple` stamps with the namespace's head as it read it."""
LEASE_KEY = "__lgx_lease__"
"""`configurable` key carrying a lease's fencing token (`Lease.config`)."""

WRITERS = ("single", "last_wins")

LeaseRow = tuple[str, float]
"""A thread's lease as stored: (token, expires_at in the store's clock)."""

# thread_id -> token of the leases held by the code running in this context (`Lease`)
held_leases: contextvars.ContextVar[Mapping[str, str]] = contextvars.ContextVar(
    "lgckpt_held_leases", default=MappingProxyType({}))


@dataclass(frozen=True, slots=True)
class Guard:
    """What one write must find in the store (built from the write's config and metadata;
    `None` in place of a guard: no checks, as for replica applies and imports)."""

    single: bool
    """Apply the head rule (`writers="single"`)."""
    read_head: str | None = None
    """The head the writing run read (`HEAD_KEY`); None: the write carries no stamp."""
    fresh: bool = False
    """A run's first checkpoint on a thread it found empty (no parent, input, step -1)."""
    lease: str | None = None
    """The fencing token of the lease the writer holds."""
    epoch: int | None = None
    """The writer's epoch (a replicated primary's); refused where the store's is newer."""
    apply: bool = False
    """A replica applying rows its primary took: only the epoch is checked."""

    @property
    def checks(self) -> bool:
        """Whether the store must read anything for this guard beyond tombstones."""
        return self.single or self.lease is not None or self.epoch is not None


def check_writers(writers: str) -> str:
    if writers not in WRITERS:
        raise ValueError(f"writers must be one of {WRITERS}, not {writers!r}")
    return writers


def lease_token(config: Mapping[str, Any] | None, thread_id: str) -> str | None:
    """The lease token a write carries: the config's (`Lease.config`), else the one held in
    this context for the thread (inside `with checkpointer.lease(...)`)."""
    conf = config.get("configurable") if isinstance(config, Mapping) else None
    token = conf.get(LEASE_KEY) if isinstance(conf, Mapping) else None
    if isinstance(token, str) and token:
        return token
    return held_leases.get().get(thread_id)


def with_held_lease(config: Any) -> Any:
    """`config` carrying the lease token this context holds for its thread, for a write that
    will run where this context's variables are not seen (the sync bridge's loop, a later
    flush from another thread); the config as it is otherwise."""
    conf = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(conf, Mapping) or conf.get("thread_id") is None:
        return config
    token = lease_token(config, str(conf["thread_id"]))
    if token is None or conf.get(LEASE_KEY) == token:
        return config
    return {**config, "configurable": {**conf, LEASE_KEY: token}}


def apply_guard(epoch: int | None) -> Guard | None:
    """A write of rows another store's writer decided (a replica's apply, a copy): the
    writer's epoch alone is checked (None: nothing)."""
    return None if epoch is None else Guard(False, epoch=epoch, apply=True)


def put_guard(config: Mapping[str, Any], metadata: Mapping[str, Any], parent: str | None,
              thread_id: str, *, single: bool, epoch: int | None) -> Guard:
    conf = config.get("configurable") or {}
    stamp = conf.get(HEAD_KEY)
    fresh = parent is None and metadata.get("source") == "input" and metadata.get("step") == -1
    return Guard(single, stamp if isinstance(stamp, str) and stamp else None, fresh,
                 lease_token(config, thread_id), epoch)


def writes_guard(config: Mapping[str, Any], thread_id: str, *, epoch: int | None) -> Guard:
    return Guard(False, None, False, lease_token(config, thread_id), epoch)


def _holder_refusal(
    guard: Guard, thread_id: str, ns: str, lease: LeaseRow | None, epoch: int, now: float
) -> ConcurrentWriteError | None:
    if guard.epoch is not None and epoch > guard.epoch:
        return FencedError(
            f"thread {thread_id!r}: this writer's epoch {guard.epoch} is older than the "
            f"store's {epoch}: it was fenced off by a failover (a demoted primary)",
            thread_id, ns)
    if guard.apply:
        return None
    live = lease is not None and lease[1] > now
    if guard.lease is not None:
        if not live or lease is None or lease[0] != guard.lease:
            return LeaseLostError(
                f"thread {thread_id!r}: this writer's lease expired or was taken over; its "
                "write is refused (take a new lease and read the thread again)", thread_id, ns)
    elif live:
        return ThreadLeasedError(
            f"thread {thread_id!r} is leased by another holder until it releases the lease "
            "or it expires: this write is refused", thread_id, ns)
    return None


def put_refusal(
    guard: Guard,
    thread_id: str,
    ns: str,
    parent: str | None,
    head: str | None,
    tombstoned: bool,
    lease: LeaseRow | None = None,
    epoch: int = 0,
    now: float = 0.0,
    exists: bool = False,
) -> ConcurrentWriteError | None:
    """The error a put must fail with given what the store holds, or None: allowed.

    `head`: the newest checkpoint id of the namespace (None: empty); `tombstoned`: the thread
    was deleted and its tombstone lasts; `lease`: the thread's lease row; `epoch`: the
    store's; `now`: the store's clock; `exists`: this very checkpoint (its id) is stored in
    the namespace already: writing it again is a retry (a commit whose answer was lost, a
    batch written again), allowed as the upsert it is."""
    refused = _holder_refusal(guard, thread_id, ns, lease, epoch, now)
    if refused is not None or guard.apply or exists:
        return refused
    where = f"thread {thread_id!r}" + (f" namespace {ns!r}" if ns else "")
    if head is None:
        if parent is not None and tombstoned:
            return ThreadDeletedError(
                f"{where} was deleted after this run read it: its late checkpoint (parent "
                f"{parent!r}) is refused; a new run on this thread starts afresh",
                thread_id, ns)
        return None
    if not guard.single or head == parent:
        return None
    if guard.read_head is not None:
        if head == guard.read_head:
            return None  # nothing written since the run read: a deliberate fork
        return ConcurrentWriteError(
            f"{where} was written by another run since this run read it (head {head!r}, "
            f"read {guard.read_head!r}, this checkpoint's parent {parent!r}): refused so that "
            "the history does not fork; read the thread again", thread_id, ns)
    if parent is not None:  # a run that started on an empty namespace, overtaken since
        return ConcurrentWriteError(
            f"{where} was written by another run since this run's checkpoint {parent!r} "
            f"(head {head!r}): refused so that the history does not fork", thread_id, ns)
    if guard.fresh:
        return ConcurrentWriteError(
            f"{where} got its first checkpoint from another run while this run started it "
            f"(head {head!r}): refused so that the history does not fork", thread_id, ns)
    return None


def writes_refusal(
    guard: Guard,
    thread_id: str,
    ns: str,
    checkpoint_id: str,
    exists: bool,
    tombstoned: bool,
    lease: LeaseRow | None = None,
    epoch: int = 0,
    now: float = 0.0,
) -> ConcurrentWriteError | None:
    """The error pending writes must fail with, or None. `exists` (only consulted for a
    tombstoned thread): their checkpoint is stored, or is newer than the newest checkpoint
    the delete removed (the tombstone keeps that id). LangGraph does not wait for a
    checkpoint's put before storing pending writes against it, so a new run's writes may
    arrive just before their checkpoint: only writes for a checkpoint the delete removed
    (or older) are late."""
    refused = _holder_refusal(guard, thread_id, ns, lease, epoch, now)
    if refused is not None or guard.apply:
        return refused
    if tombstoned and not exists:
        return ThreadDeletedError(
            f"thread {thread_id!r} was deleted after this run read it: late pending writes "
            f"for checkpoint {checkpoint_id!r} are refused", thread_id, ns)
    return None
