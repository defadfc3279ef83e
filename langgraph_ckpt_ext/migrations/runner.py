"""Eager state-schema migration: rewrite stored checkpoints to the chain's current version.

Each checkpoint is rewritten in place (same id, parent and order) by one atomic store operation
that also logs it; the log's key (thread, namespace, checkpoint, target version) makes a second
rewrite of the same checkpoint a no-op. A run that was killed therefore resumes where it stopped
when started again: what is done is stamped with the current version and skipped, and nothing
is migrated twice.

A run rewrites only the threads its chain owns (see `migrate_threads`); the others are
counted and listed as skipped, by reason.
"""

from __future__ import annotations

import time
from collections import defaultdict
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from langgraph.checkpoint.base import WRITES_IDX_MAP

from ..core import codec
from ..core.appendlog import AppendLog
from ..core.base import PAGE
from ..core.bridge import run_workers
from ..core.errors import InvalidConfigError
from ..core.graph import is_reserved
from ..core.rows import CheckpointRow, ListQuery, MigrationEntry, WriteRow
from ..core.schema import SchemaChain, compare, stored_schema_name, stored_schema_version
from ..core.versions import Version, next_version

if TYPE_CHECKING:
    from ..core.saver import StoreCheckpointer



@dataclass(frozen=True)
class CheckpointChange:
    """What migrating one checkpoint changes (or, in a dry run, would change)."""

    thread_id: str
    checkpoint_ns: str
    checkpoint_id: str
    from_version: int
    to_version: int
    added: tuple[str, ...]
    removed: tuple[str, ...]
    changed: tuple[str, ...]
    writes: int
    """Pending writes of the checkpoint that were upgraded."""


@dataclass(frozen=True)
class MigrationProgress:
    """Reported after each thread: how far the run is."""

    threads_done: int
    threads_total: int
    checkpoints_done: int
    thread_id: str


OTHER_CHAIN = "other chain"
UNSTAMPED = "unstamped"


@dataclass(frozen=True)
class SkippedThread:
    """A thread a migration left alone: `reason` is "other chain" (stamped with another
    chain's name, `schema_name`) or "unstamped" (no name; see `include_unstamped`)."""

    thread_id: str
    reason: str
    schema_name: str | None


@dataclass
class MigrationReport:
    """The outcome of `migrate_threads`."""

    dry_run: bool
    to_version: int
    chain_name: str | None = None
    threads_seen: int = 0
    """Threads looked at (with at least one checkpoint), skipped ones included."""
    threads_migrated: int = 0
    """Threads with a checkpoint rewritten (or, in a dry run, to rewrite)."""
    threads: list[str] = field(default_factory=list)
    """Their ids, sorted."""
    threads_skipped_other: int = 0
    """Threads of another chain's name: never touched."""
    threads_skipped_unstamped: int = 0
    """Threads with no chain name, left alone without `include_unstamped`."""
    skipped: list[SkippedThread] = field(default_factory=list)
    checkpoints_migrated: int = 0
    checkpoints_current: int = 0
    """Checkpoints already at the current version, left alone."""
    writes_migrated: int = 0
    already_logged: int = 0
    """Checkpoints another run migrated while this one was reading them."""
    seconds: float = 0.0
    changes: list[CheckpointChange] = field(default_factory=list)

    def skip(self, thread_id: str, schema_name: str | None) -> None:
        """Count a thread left alone: of chain `schema_name`, or unstamped (None)."""
        reason = UNSTAMPED if schema_name is None else OTHER_CHAIN
        self.skipped.append(SkippedThread(thread_id, reason, schema_name))
        if schema_name is None:
            self.threads_skipped_unstamped += 1
        else:
            self.threads_skipped_other += 1

    def summary(self) -> str:
        verb = "would migrate" if self.dry_run else "migrated"
        of_chain = "" if self.chain_name is None else f" of chain {self.chain_name!r}"
        lines = [
            f"{verb} {self.checkpoints_migrated} checkpoint(s) of {self.threads_migrated} "
            f"thread(s) to schema version {self.to_version}{of_chain} ({self.threads_seen} "
            f"thread(s) seen, {self.checkpoints_current} checkpoint(s) already current, "
            f"{self.writes_migrated} pending write(s) upgraded) in {self.seconds:.2f} s"
        ]
        if self.threads:
            lines.append(f"  threads: {_some(self.threads)}")
        other = sorted(f"{s.thread_id} ({s.schema_name!r})" for s in self.skipped
                       if s.reason == OTHER_CHAIN)
        if other:
            lines.append(f"  skipped {len(other)} thread(s) of other chains: {_some(other)}")
        bare = sorted(s.thread_id for s in self.skipped if s.reason == UNSTAMPED)
        if bare:
            lines.append(f"  skipped {len(bare)} unstamped thread(s) (include_unstamped=True, "
                         f"--include-unstamped, migrates them): {_some(bare)}")
        for c in self.changes[:20]:
            parts = [f"+{', +'.join(c.added)}" if c.added else "",
                     f"-{', -'.join(c.removed)}" if c.removed else "",
                     f"~{', ~'.join(c.changed)}" if c.changed else ""]
            what = "; ".join(p for p in parts if p) or "no value changes"
            ns = f" [{c.checkpoint_ns}]" if c.checkpoint_ns else ""
            lines.append(f"  {c.thread_id}{ns} {c.checkpoint_id} v{c.from_version}->v"
                         f"{c.to_version}: {what}")
        if len(self.changes) > 20:
            lines.append(f"  ... and {len(self.changes) - 20} more")
        return "\n".join(lines)


def _some(ids: list[str], most: int = 20) -> str:
    more = f", ... and {len(ids) - most} more" if len(ids) > most else ""
    return ", ".join(ids[:most]) + more


async def migrate_threads(
    saver: StoreCheckpointer,
    chain: SchemaChain,
    thread_ids: Collection[str] | None = None,
    *,
    dry_run: bool = False,
    progress: Callable[[MigrationProgress], None] | None = None,
    concurrency: int = 4,
    include_unstamped: bool = False,
) -> MigrationReport:
    """See `StoreCheckpointer.migrate_threads`."""
    if not isinstance(include_unstamped, bool):
        raise InvalidConfigError(
            f"include_unstamped is True or False, got {include_unstamped!r}"
        )
    if chain.name is None and not include_unstamped:
        raise InvalidConfigError(
            "this SchemaChain has no name, so no stored thread is stamped as its own: name it "
            "(SchemaChain(..., name='my-graph')) to migrate the threads written under it, or "
            "pass include_unstamped=True (lgckpt: --include-unstamped) to migrate the threads "
            "stamped with no chain name"
        )
    report = MigrationReport(dry_run=dry_run, to_version=chain.current, chain_name=chain.name)
    started = time.perf_counter()
    if thread_ids is None:
        threads = await saver.athread_ids()
    else:
        threads = list(dict.fromkeys(str(t) for t in thread_ids))
    done = 0
    pending = iter(threads)  # shared by the workers: each thread is taken once

    stopped: list[BaseException] = []

    async def worker() -> None:
        nonlocal done
        for thread_id in pending:
            if stopped:
                return
            await _migrate_thread(saver, chain, thread_id, dry_run, include_unstamped, report)
            done += 1
            if progress is not None:
                progress(MigrationProgress(
                    done, len(threads), report.checkpoints_migrated, thread_id
                ))

    if saver.stored.inline or concurrency <= 1:  # an inline store must never suspend
        await worker()
    else:
        await run_workers(worker, concurrency, stopped)
    report.threads.sort()
    report.seconds = time.perf_counter() - started
    return report


def _owner(metadata: Sequence[Mapping[str, Any]], rows: list[CheckpointRow]) -> str | None:
    """The chain name on a thread's newest named checkpoint (rows come newest first): a run
    killed halfway through a thread has stamped its oldest checkpoints, so it still owns it."""
    for md, row in zip(metadata, rows, strict=True):
        name = stored_schema_name(md, row.checkpoint_id)
        if name is not None:
            return name
    return None


async def _migrate_thread(
    saver: StoreCheckpointer,
    chain: SchemaChain,
    thread_id: str,
    dry_run: bool,
    include_unstamped: bool,
    report: MigrationReport,
) -> None:
    """Rewrite a thread's old checkpoints, oldest first, so that a list value growing along the
    thread is stored as append-deltas on the one rewritten before it, as `put` stores it."""
    stored_rows = saver.stored
    rows = [r async for r in stored_rows.iter(ListQuery(thread_id=thread_id))]
    if not rows:
        return
    report.threads_seen += 1
    metadata = [stored_rows.metadata(r) for r in rows]
    owner = _owner(metadata, rows)
    if not (include_unstamped if owner is None else owner == chain.name):
        report.skip(thread_id, owner)
        return
    todo: list[tuple[CheckpointRow, int]] = []
    for row, meta in zip(reversed(rows), reversed(metadata), strict=True):
        if not chain.owns(stored_schema_name(meta, row.checkpoint_id)):
            continue  # another chain's checkpoint in a thread this one took over: not ours
        stored = stored_schema_version(meta, chain, row.checkpoint_id)
        if chain.needs(stored):
            todo.append((row, stored))
        else:
            report.checkpoints_current += 1
    if not todo:
        return
    log = AppendLog(stored_rows.snapshot_every)
    last: dict[tuple[str, str], tuple[Version, Any]] = {}  # (ns, channel) -> last written
    migrated = 0
    for start in range(0, len(todo), PAGE):
        page = todo[start : start + PAGE]
        raw_writes: dict[tuple[str, str], list[WriteRow]] = {}
        tuples = await stored_rows.load([r for r, _ in page], upgrade=False,
                                        raw_writes=raw_writes)
        for (row, stored), tup in zip(page, tuples, strict=True):
            ns, cid = row.checkpoint_ns, row.checkpoint_id
            old = tup.checkpoint["channel_values"]
            values = chain.upgrade(old, stored)
            header = {k: v for k, v in tup.checkpoint.items() if k != "channel_values"}
            old_versions: Mapping[str, Version] = tup.checkpoint["channel_versions"]
            added, removed, changed = compare(old, values)
            versions: dict[str, Version] = {
                ch: v for ch, v in old_versions.items() if ch not in removed
            }
            to_store: dict[str, Version] = {}
            bump: Version | None = None
            for ch in (*added, *changed):
                prev = last.get((ns, ch))
                if prev is not None and prev[1] == values[ch]:
                    versions[ch] = prev[0]  # the same value as the last one rewritten: share it
                    continue
                if bump is None:
                    bump = next_version(max(old_versions.values(), default=None))
                versions[ch] = to_store[ch] = bump
            writes, n_writes = _upgraded_writes(saver, chain, raw_writes.get((ns, cid), []), stored)
            report.changes.append(CheckpointChange(
                thread_id, ns, cid, stored, chain.current, added, removed, changed, n_writes
            ))
            if dry_run:
                migrated += 1
                report.checkpoints_migrated += 1
                report.writes_migrated += n_writes
                continue
            blobs, plans = codec.encode_blobs(saver.serde, log, thread_id, ns, values, to_store)
            md = {**tup.metadata, **chain.stamp()}
            new_row = stored_rows.encode(row, {**header, "channel_versions": versions}, md)
            entry = MigrationEntry(thread_id, ns, cid, stored, chain.current, time.time())
            if await stored_rows.rewrite(new_row, blobs, writes, entry):
                for ch, plan in plans.items():
                    log.commit(thread_id, ns, ch, plan)
                for ch in to_store:
                    last[(ns, ch)] = (to_store[ch], values[ch])
                migrated += 1
                report.checkpoints_migrated += 1
                report.writes_migrated += n_writes
            else:  # migrated meanwhile by another run: build on nothing this run did not write
                report.changes.pop()
                report.already_logged += 1
                log.forget(thread_id)
                last.clear()
    if migrated:
        report.threads_migrated += 1
        report.threads.append(thread_id)
    if migrated and not dry_run:
        # Values the rewrite replaced are read by no checkpoint any more.
        await stored_rows.collect_garbage(thread_id)


def _upgraded_writes(
    saver: StoreCheckpointer, chain: SchemaChain, rows: list[WriteRow], stored: int
) -> tuple[list[WriteRow] | None, int]:
    """A checkpoint's pending writes at the current version (None: nothing to change), and how
    many of them were upgraded."""
    if not any(not is_reserved(w.channel) for w in rows):
        return None, 0
    # Rows come in the order LangGraph applies them; a task's writes are renumbered in that
    # order (an upgrade may turn one write into several), the special ones keep their index.
    out: list[WriteRow] = []
    per_task: dict[str, int] = defaultdict(int)
    upgraded = 0
    for w in rows:
        if is_reserved(w.channel):
            pairs = [(w.channel, None)]
        else:
            upgraded += 1
            value = codec.loads(saver.serde, (w.type, w.data), f"write to channel {w.channel!r}")
            pairs = chain.upgrade_write(w.channel, value, stored)
        for ch, v in pairs:
            if ch in WRITES_IDX_MAP:
                idx = WRITES_IDX_MAP[ch]
            else:
                idx = per_task[w.task_id]
                per_task[w.task_id] += 1
            if is_reserved(w.channel):
                out.append(replace(w, idx=idx))
            else:
                type_, data = codec.dumps(saver.serde, v, f"write to channel {ch!r}")
                out.append(replace(w, idx=idx, channel=ch, type=type_, data=data))
    return out, upgraded


__all__ = [
    "CheckpointChange", "MigrationProgress", "MigrationReport", "SkippedThread", "migrate_threads",
]
