"""One thread of a saver: read it, compare it with another's, write it into another.

These functions use only LangGraph's saver API (`list`, `put`, `put_writes`), plus `put_batch`
where the target has it (our checkpointers), so they work between any two savers.
"""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    CheckpointTuple,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.base import SaverBase
from ..core.config import checkpoint_ns_of, make_config
from ..core.errors import ThreadNotFoundError

Saver = BaseCheckpointSaver[Any]

BATCH_SIZE = 2000
"""Writes of one `put_batch` at most (checkpoints plus tasks' writes): a longer thread is
written in several batches, oldest first, and a copy cut short there is completed by the next
run."""


# -- reading a thread -------------------------------------------------------------------------


def thread_ids(saver: Saver) -> list[str]:
    """Every thread id that holds a checkpoint in `saver`, sorted.

    Asks our checkpointers' `thread_ids()`, LangGraph's SQLite and Postgres savers one query;
    any other saver is listed whole (slow on a large store)."""
    own = getattr(saver, "thread_ids", None)
    if callable(own):
        return sorted({str(t) for t in own()})
    official = _official_thread_ids(saver)
    if official is not None:
        return official
    return sorted({str(t.config["configurable"]["thread_id"]) for t in saver.list(None)})


def named_threads(saver: Saver, names: Sequence[str], where: str = "the source",
                  hint: str = "") -> list[str]:
    """`names` without repeats, each checked to hold a checkpoint in `saver` (one short
    listing per name, on any saver: ours, LangGraph's, an export file); else
    `ThreadNotFoundError` naming the first missing one, `where` and `hint`."""
    wanted = [str(t) for t in dict.fromkeys(names)]
    absent = [t for t in wanted
              if next(iter(saver.list({"configurable": {"thread_id": t}}, limit=1)), None) is None]
    if absent:
        more = f" (nor {len(absent) - 1} more)" if len(absent) > 1 else ""
        raise ThreadNotFoundError(
            f"thread {absent[0]!r} is not in {where}{more}: check the thread ids{hint}")
    return wanted


def thread_tuples(saver: Saver, thread_id: str) -> list[CheckpointTuple]:
    """Every checkpoint of a thread, of every namespace, with its pending writes: oldest first,
    a parent always before its children. Empty if the thread holds none."""
    config: RunnableConfig = {"configurable": {"thread_id": str(thread_id)}}
    return _oldest_first(saver.list(config))


def checkpoint_key(tup: CheckpointTuple) -> tuple[str, str]:
    """`(checkpoint_ns, checkpoint_id)`: what identifies a checkpoint within its thread."""
    return (checkpoint_ns_of(tup.config), str(tup.checkpoint["id"]))


def _parent_id(tup: CheckpointTuple) -> str | None:
    if tup.parent_config is None:
        return None
    parent = tup.parent_config["configurable"].get("checkpoint_id")
    return None if parent in (None, "") else str(parent)


def _oldest_first(tuples: Iterable[CheckpointTuple]) -> list[CheckpointTuple]:
    # Checkpoint ids grow with time, so sorting by them nearly always puts parents first; the
    # walk below makes sure of it (a parent with a larger id: imported, or hand-made).
    ordered = sorted(tuples, key=lambda t: (str(t.checkpoint["id"]), checkpoint_ns_of(t.config)))
    by_key = {checkpoint_key(t): t for t in ordered}
    out: list[CheckpointTuple] = []
    done: set[tuple[str, str]] = set()
    for tup in ordered:
        chain = []
        cur: CheckpointTuple | None = tup
        while cur is not None and checkpoint_key(cur) not in done:
            done.add(checkpoint_key(cur))
            chain.append(cur)
            parent = _parent_id(cur)
            cur = by_key.get((checkpoint_key(cur)[0], parent)) if parent else None
        out.extend(reversed(chain))
    return out


def _official_thread_ids(saver: Saver) -> list[str] | None:
    """Thread ids of LangGraph's sync SQLite and Postgres savers, by one query (None: not one
    of those, or its tables are not there yet)."""
    module, name = type(saver).__module__, type(saver).__name__
    conn: Any = getattr(saver, "conn", None)
    lock = getattr(saver, "lock", None)
    if not isinstance(lock, type(threading.Lock())):
        return None  # not the sync savers (theirs is a threading lock)
    query = "SELECT DISTINCT thread_id FROM checkpoints ORDER BY thread_id"
    try:
        if module.startswith("langgraph.checkpoint.sqlite") and name == "SqliteSaver":
            with lock:
                return [str(r[0]) for r in conn.execute(query).fetchall()]
        if module.startswith("langgraph.checkpoint.postgres") and name in (
                "PostgresSaver", "ShallowPostgresSaver"):
            with lock:
                if hasattr(conn, "execute"):
                    rows = conn.execute(query).fetchall()
                else:  # a pool
                    with conn.connection() as c:
                        rows = c.execute(query).fetchall()
            return [str(r["thread_id"] if isinstance(r, dict) else r[0]) for r in rows]
    except Exception:  # no table yet (setup() never ran): their own `list` says what is wrong
        return None
    return None


# -- comparing --------------------------------------------------------------------------------


def _digest(serde: SerializerProtocol, *parts: Any) -> str:
    h = hashlib.sha256()
    for part in parts:
        kind, data = serde.dumps_typed(part)
        h.update(kind.encode() + b"\0" + data + b"\0")
    return h.hexdigest()


def _sorted(d: Mapping[str, Any] | None) -> list[tuple[str, Any]]:
    return sorted((d or {}).items())


def checkpoint_hash(serde: SerializerProtocol, tup: CheckpointTuple) -> str:
    """A hash of a checkpoint's content (parent, time, versions, values, metadata), the same
    whichever backend returns it. Metadata is taken as a saver stores it (LangGraph's
    `get_serializable_checkpoint_metadata`), without our audit record."""
    cp = tup.checkpoint
    metadata = {
        k: v
        for k, v in get_serializable_checkpoint_metadata({}, tup.metadata or {}).items()
        if k != "audit"
    }
    return _digest(
        serde, [_parent_id(tup), cp.get("ts")], _sorted(cp.get("channel_versions")),
        [(ch, _sorted(v)) for ch, v in _sorted(cp.get("versions_seen"))],
        [ch for ch, _ in _sorted(cp.get("channel_values"))],
        *(v for _, v in _sorted(cp.get("channel_values"))), _sorted(metadata),
    )


def writes_hashes(serde: SerializerProtocol, tup: CheckpointTuple) -> Counter[tuple[str, str]]:
    """A checkpoint's pending writes as a multiset of (task id, hash of channel and value)."""
    return Counter((str(t), _digest(serde, c, v)) for t, c, v in tup.pending_writes or [])


@dataclass(frozen=True, slots=True)
class Missing:
    """What a target lacks of one source checkpoint."""

    tuple: CheckpointTuple
    header: bool
    """The checkpoint itself is missing (else it is there, and only some writes are not)."""
    tasks: frozenset[str] | None = None
    """The tasks whose pending writes are missing (None: every task's)."""


@dataclass(frozen=True, slots=True)
class ThreadDiff:
    """How a thread in a target compares with the same thread in a source (`diff_thread`)."""

    thread_id: str
    source_checkpoints: int
    target_checkpoints: int
    conflict: str | None
    """Why the target cannot be completed into the source (it holds a checkpoint or a write
    the source does not, or a different one); None when it can."""
    missing: tuple[Missing, ...]
    """What to write, oldest first: with a conflict, the whole source (to write after
    deleting the target's thread)."""

    @property
    def equal(self) -> bool:
        return self.conflict is None and not self.missing


def diff_thread(
    serde: SerializerProtocol,
    thread_id: str,
    source: Sequence[CheckpointTuple],
    target: Sequence[CheckpointTuple],
) -> ThreadDiff:
    """Compare one thread's checkpoints in a source and a target (as `thread_tuples` returns
    them) by checkpoint ids and content hashes, hashing values with `serde`.

    Example:
        >>> a, b = thread_tuples(source, "t1"), thread_tuples(target, "t1")  # doctest: +SKIP
        >>> d = diff_thread(target.serde, "t1", a, b)  # doctest: +SKIP
        >>> d.equal, d.conflict, len(d.missing)  # doctest: +SKIP
    """
    src = _oldest_first(source)
    held = {checkpoint_key(t): t for t in target}
    wanted = {checkpoint_key(t) for t in src}
    conflict = next(
        (f"the target holds checkpoint {cid!r} (namespace {ns!r}), which the source does not"
         for ns, cid in held if (ns, cid) not in wanted),
        None,
    )
    missing: list[Missing] = []
    for tup in src if conflict is None else ():
        have = held.get(checkpoint_key(tup))
        if have is None:
            missing.append(Missing(tup, True))
            continue
        cid = tup.checkpoint["id"]
        if checkpoint_hash(serde, tup) != checkpoint_hash(serde, have):
            conflict = f"checkpoint {cid!r} differs"
            break
        mine, theirs = writes_hashes(serde, tup), writes_hashes(serde, have)
        if theirs - mine:
            conflict = f"the target holds pending writes of checkpoint {cid!r} the source does not"
            break
        if mine - theirs:
            missing.append(Missing(tup, False, frozenset(t for t, _ in mine - theirs)))
    if conflict is not None:
        missing = [Missing(t, True) for t in src]
    return ThreadDiff(str(thread_id), len(src), len(held), conflict, tuple(missing))


# -- writing ----------------------------------------------------------------------------------


def _thread_ops(thread_id: str, source: Sequence[CheckpointTuple], missing: Sequence[Missing]
                ) -> list[tuple[Any, ...]]:
    """`put_batch` ops that write `missing`: each checkpoint with the channel versions that
    changed since its parent (the target holds the parent's values already), then the tasks'
    writes, in the order of the source's pending writes."""
    by_key = {checkpoint_key(t): t for t in source}
    ops: list[tuple[Any, ...]] = []
    for m in missing:
        tup = m.tuple
        ns, checkpoint_id = checkpoint_key(tup)
        if m.header:
            parent_id = _parent_id(tup)
            parent = by_key.get((ns, parent_id)) if parent_id else None
            versions = tup.checkpoint.get("channel_versions") or {}
            before = (parent.checkpoint.get("channel_versions") or {}) if parent else {}
            new_versions = {ch: v for ch, v in versions.items() if before.get(ch) != v}
            config: RunnableConfig = {"configurable": {
                "thread_id": thread_id, "checkpoint_ns": ns,
                **({"checkpoint_id": parent_id} if parent_id else {}),
            }}
            ops.append(("put", config, tup.checkpoint, tup.metadata, new_versions))
        tasks: dict[str, list[tuple[str, Any]]] = {}
        for task_id, channel, value in tup.pending_writes or []:
            if m.tasks is None or str(task_id) in m.tasks:
                tasks.setdefault(str(task_id), []).append((channel, value))
        at = make_config(thread_id, ns, checkpoint_id)
        ops.extend(("writes", at, writes, task_id, "") for task_id, writes in tasks.items())
    return ops


def put_thread(
    target: Saver,
    thread_id: str,
    source: Sequence[CheckpointTuple],
    missing: Sequence[Missing] | None = None,
    *,
    batch_size: int = BATCH_SIZE,
) -> tuple[int, int]:
    """Write a thread's checkpoints and pending writes into `target`; returns (checkpoints,
    writes) written.

    `source` is the whole thread, oldest first (`thread_tuples`); `missing` what of it to
    write (default: all of it; see `diff_thread`). A target with `put_batch` (our
    checkpointers) gets the thread in one batch, so it lands whole or not at all; a thread
    of more than `batch_size` writes in several, oldest first. Pending writes lose their
    `task_path`, which LangGraph's read API does not return: they are stored in the order of
    their task ids.
    """
    todo = list(missing) if missing is not None else [Missing(t, True) for t in source]
    ops = _thread_ops(str(thread_id), source, todo)
    batch = getattr(target, "put_batch", None)
    batch_size = max(1, batch_size)
    if callable(batch):
        # a history decided elsewhere, forks included: no one-writer check (`core.guard`)
        copying = isinstance(target, SaverBase)
        for i in range(0, len(ops), batch_size):
            if copying:
                batch(ops[i : i + batch_size], copy=True)
            else:
                batch(ops[i : i + batch_size])
    else:
        for op in ops:
            if op[0] == "put":
                target.put(*op[1:])
            else:
                target.put_writes(*op[1:])
    return (sum(1 for op in ops if op[0] == "put"),
            sum(len(op[2]) for op in ops if op[0] == "writes"))
