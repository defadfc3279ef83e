"""One writer per thread: what a write must find in the store to be allowed (`Guard`), and the
one decision every backend applies to what it finds there, atomically with the write.

The rule (`writers="single"`), per thread and namespace, whose head is its newest checkpoint:

- a put whose parent is the head chains onto it: allowed;
- else, a put from a run that read the namespace is allowed only if the head is still the one
  it saw: nothing was written since, so starting from an older checkpoint is a deliberate fork
  (time travel, a copy fork, a subgraph's replay, `update_state` on an old checkpoint); a head
  written meanwhile means another run got there first: refused. The head a read saw travels
  in the reader's context, never in a config (`note_read`, `read_head`): `get_tuple` and a
  listing of one namespace note it there, and LangGraph runs each put of a run in a copy of
  the context its read ran in (a task, or a background thread given a copy). A wrapper whose
  put is written later, elsewhere, carries it in the config it hands its inner checkpointer
  (`carry_read`, `HEAD_KEY`: between our classes only);
- a put with no read head comes from a run that found the namespace empty or from a direct
  `put` (another thread, no read): with a parent that is not the head it is refused
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
from collections.abc import Awaitable, Iterator, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, TypeVar

from .errors import (
    ConcurrentWriteError,
    FencedError,
    LeaseLostError,
    ThreadDeletedError,
    ThreadLeasedError,
)

HEAD_KEY = "__lgx_head__"
"""`configurable` key a wrapper sets, in the config of a put it hands its inner checkpointer,
to the head its caller read (`carry_read`). Never in a config a user or LangGraph sees."""
LEASE_KEY = "__lgx_lease__"
"""`configurable` key carrying a lease's fencing token (`Lease.config`)."""

WRITERS = ("single", "last_wins")

T = TypeVar("T")

LeaseRow = tuple[str, float]
"""A thread's lease as stored: (token, expires_at in the store's clock)."""

ReadHeads = Mapping[tuple[str, str], str]
"""(thread id, namespace) -> the head the last read of it in this context saw."""
READS_KEPT = 256
"""Namespaces a context remembers reads of, the most recent: a run reads a handful."""

# Copied, never changed in place: a task or thread given a copy of the context keeps the reads
# made before it started, and none that other runs make later.
read_heads: contextvars.ContextVar[ReadHeads] = contextvars.ContextVar(
    "lgckpt_read_heads", default=MappingProxyType({}))
# set by `noted`: where the reads made by the coroutine it runs are collected too
_notes: contextvars.ContextVar[dict[tuple[str, str], str | None] | None] = (
    contextvars.ContextVar("lgckpt_read_notes", default=None))

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


def adopt_reads(notes: Mapping[tuple[str, str], str | None]) -> None:
    """Record reads in this context: each namespace's head as read (None: found empty)."""
    if not notes:
        return
    heads = dict(read_heads.get())
    for key, head in notes.items():
        heads.pop(key, None)  # most recent last
        if head is not None:
            heads[key] = head
    while len(heads) > READS_KEPT:
        del heads[next(iter(heads))]
    read_heads.set(MappingProxyType(heads))


def note_read(thread_id: str, ns: str, head: str | None,
              sink: dict[tuple[str, str], str | None] | None = None) -> None:
    """A read of the namespace saw `head` (None: it is empty): recorded in this context, in
    `sink` if given and in the one `noted` collects into, for a sync entry point to record it
    in its caller's context (the coroutine ran on the bridge's loop, in a copy of it)."""
    notes = {(thread_id, ns): head}
    adopt_reads(notes)
    for target in (sink, _notes.get()):
        if target is not None:
            target.update(notes)


async def noted(coro: Awaitable[T]) -> tuple[T, dict[tuple[str, str], str | None]]:
    """(what `coro` returns, the reads it noted): for `adopt_reads` in the caller's context."""
    sink: dict[tuple[str, str], str | None] = {}
    token = _notes.set(sink)
    try:
        result = await coro
    finally:
        _notes.reset(token)
    return result, sink


def adopting(items: Iterator[T], notes: Mapping[tuple[str, str], str | None]) -> Iterator[T]:
    """A sync listing driven on the bridge's loop, recording the reads its async listing
    noted (in `notes`) in the context that iterates it: before its first item, and at its end.
    """
    first = True
    for item in items:
        if first:
            adopt_reads(notes)
            first = False
        yield item
    adopt_reads(notes)


def read_head(thread_id: str, ns: str) -> str | None:
    """The head this context last read of the namespace, if it did."""
    return read_heads.get().get((thread_id, ns))


def _run_start(metadata: Mapping[str, Any]) -> bool:
    """The metadata of a run's first checkpoint (its input, step -1)."""
    return metadata.get("source") == "input" and metadata.get("step") == -1


def _counts_read(parent: object, metadata: Mapping[str, Any]) -> bool:
    """Whether a read in the writer's context counts for a put: one that continues from a
    checkpoint, or a run's first one. A direct put with no parent is no run's, whatever its
    context read before."""
    return parent is not None or _run_start(metadata)


def carry_read(config: Any, metadata: Mapping[str, Any]) -> Any:
    """`config` carrying the head this context read of its namespace (`HEAD_KEY`), for the
    put of `metadata` written where this context is not seen (the sync bridge's loop, a later
    flush); the config as it is otherwise. Only ever handed to an inner checkpointer."""
    conf = config.get("configurable") if isinstance(config, Mapping) else None
    if not isinstance(conf, Mapping) or conf.get("thread_id") is None or conf.get(HEAD_KEY):
        return config
    if not _counts_read(conf.get("checkpoint_id"), metadata):
        return config
    head = read_head(str(conf["thread_id"]), str(conf.get("checkpoint_ns") or ""))
    if head is None:
        return config
    return {**config, "configurable": {**conf, HEAD_KEY: head}}


def put_guard(config: Mapping[str, Any], metadata: Mapping[str, Any], parent: str | None,
              thread_id: str, *, single: bool, epoch: int | None) -> Guard:
    conf = config.get("configurable") or {}
    fresh = parent is None and _run_start(metadata)
    stamp = conf.get(HEAD_KEY)
    if not stamp and (parent is not None or fresh):
        stamp = read_head(thread_id, str(conf.get("checkpoint_ns") or ""))
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
