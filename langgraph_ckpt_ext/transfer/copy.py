"""`copy_threads`: threads from one saver to another, resumable and verified."""

from __future__ import annotations

import asyncio
import hashlib
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TypeVar

from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.errors import InvalidConfigError, ThreadExistsError
from ..core.saver import strict_serde
from ._blocked import blocked_types
from .threads import (
    BATCH_SIZE,
    Saver,
    checkpoint_hash,
    checkpoint_key,
    diff_thread,
    named_threads,
    put_thread,
    thread_tuples,
    writes_hashes,
)
from .threads import thread_ids as _list_threads

T = TypeVar("T")
Progress = Callable[[int, int], None]
"""`progress(done, total)`: threads handled so far, out of how many."""


@dataclass(frozen=True, slots=True)
class CopyReport:
    """What `copy_threads` (or `import_jsonl`) did."""

    threads_copied: int
    """Threads written (whole, completed, or replaced with `overwrite`)."""
    threads_skipped: int
    """Threads the target already held, equal to the source."""
    threads_verified: int
    """Threads found equal to the source at the end (read back from the target)."""
    checkpoints: int
    writes: int
    seconds: float
    failed: tuple[tuple[str, str], ...] = ()
    """(thread id, what differs) of threads that read back different from the source."""
    blocked_types: tuple[str, ...] = ()
    """Types the source's serializer refused to construct while the copy ran (their values
    were read, and copied, as plain data): allow them in its serde to keep them."""

    @property
    def ok(self) -> bool:
        """Every thread read back equal to the source."""
        return not self.failed

    @property
    def threads_per_second(self) -> float:
        done = self.threads_copied + self.threads_skipped
        return done / self.seconds if self.seconds > 0 else float(done)

    def summary(self) -> str:
        text = (
            f"{self.threads_copied} threads copied ({self.checkpoints} checkpoints, "
            f"{self.writes} writes), {self.threads_skipped} already there, "
            f"{self.threads_verified} verified in {self.seconds:.2f} s "
            f"({self.threads_per_second:.0f} threads/s)"
        )
        if self.failed:
            tid, why = self.failed[0]
            text += f"; {len(self.failed)} differ after the copy (e.g. {tid!r}: {why})"
        if self.blocked_types:
            text += f"; read as plain data: {', '.join(self.blocked_types)}"
        return text


_Digest = dict[tuple[str, str], tuple[str, Counter[tuple[str, str]]]]


def _thread_digest(serde: SerializerProtocol, tuples: Iterable[CheckpointTuple]) -> _Digest:
    return {checkpoint_key(t): (checkpoint_hash(serde, t), writes_hashes(serde, t))
            for t in tuples}


@dataclass(frozen=True, slots=True)
class _Summary:
    """What a copied thread must read back as, kept small until the check at the end."""

    checkpoints: int
    writes: int
    sha: bytes
    """Over every checkpoint's key, content hash and pending writes' hashes."""


def _summary(digest: _Digest) -> _Summary:
    h = hashlib.sha256()
    for key, (header, writes) in sorted(digest.items()):
        h.update(repr((key, header, sorted(writes.items()))).encode())
    return _Summary(len(digest), sum(sum(w.values()) for _, w in digest.values()), h.digest())


def _mismatch(expected: _Digest, found: _Digest) -> str | None:
    if len(found) != len(expected):
        return f"{len(found)} checkpoints instead of {len(expected)}"
    for key, (header, writes) in expected.items():
        held = found.get(key)
        if held is None:
            return f"checkpoint {key[1]!r} is missing"
        if held[0] != header:
            return f"checkpoint {key[1]!r} differs"
        if held[1] != writes:
            return f"pending writes of checkpoint {key[1]!r} differ"
    return None


@dataclass
class _Run:
    """One `copy_threads` call's state, shared by its worker threads."""

    source: Saver
    target: Saver
    serde: SerializerProtocol
    batch_size: int
    plans: dict[str, tuple[bool, str | None]] = field(default_factory=dict)
    """Threads the target held when the copy began: (equal, conflict)."""
    summaries: dict[str, _Summary] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    copied: int = 0
    skipped: int = 0
    checkpoints: int = 0
    writes: int = 0

    def plan(self, thread_id: str) -> None:
        """Compare a thread the target holds already."""
        target = thread_tuples(self.target, thread_id)
        if not target:  # listed, but empty (expired, or cut short before its first write)
            return
        source = thread_tuples(self.source, thread_id)
        diff = diff_thread(self.serde, thread_id, source, target)
        with self.lock:
            self.plans[thread_id] = (diff.equal, diff.conflict)

    def copy(self, thread_id: str) -> None:
        equal, conflict = self.plans.get(thread_id, (False, None))
        if equal:
            with self.lock:
                self.skipped += 1
            return
        source = thread_tuples(self.source, thread_id)
        if not source:  # gone from the source since it was listed (deleted, expired)
            return
        missing = None
        if conflict is not None:  # overwrite (else refused before any write)
            self.target.delete_thread(thread_id)
        elif thread_id in self.plans:  # a part is there: compare again, it may have grown
            diff = diff_thread(self.serde, thread_id, source, thread_tuples(self.target, thread_id))
            if diff.conflict is not None:
                raise ThreadExistsError(f"thread {thread_id!r} changed in the target during the "
                                        f"copy ({diff.conflict}): copy it again")
            missing = diff.missing
        n_cp, n_w = put_thread(self.target, thread_id, source, missing,
                               batch_size=self.batch_size)
        summary = _summary(_thread_digest(self.serde, source))
        with self.lock:
            self.copied += 1
            self.checkpoints += n_cp
            self.writes += n_w
            self.summaries[thread_id] = summary

    def verify(self, thread_id: str) -> str | None:
        found = _thread_digest(self.serde, thread_tuples(self.target, thread_id))
        if _summary(found) == self.summaries[thread_id]:
            return None
        expected = _thread_digest(self.serde, thread_tuples(self.source, thread_id))
        return _mismatch(expected, found) or "the source changed during the copy"


def _each(fn: Callable[[str], T], items: Sequence[str], concurrency: int,
          done: Callable[[str, T], None] | None = None) -> None:
    """`fn` over `items` on up to `concurrency` threads; `done(item, result)` on the calling
    thread as each ends. The first error stops the rest and is raised."""
    if concurrency <= 1:
        for item in items:
            result = fn(item)
            if done is not None:
                done(item, result)
        return
    with ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="lgckpt-copy") as pool:
        pending: dict[Future[T], str] = {}
        it = iter(items)
        try:
            while True:
                while len(pending) < concurrency * 2:  # a window, not one future per thread
                    nxt = next(it, None)
                    if nxt is None:
                        break
                    pending[pool.submit(fn, nxt)] = nxt
                if not pending:
                    return
                finished, _ = wait(pending, return_when=FIRST_COMPLETED)
                for fut in finished:
                    item = pending.pop(fut)
                    result = fut.result()
                    if done is not None:
                        done(item, result)
        except BaseException:
            for fut in pending:
                fut.cancel()
            raise


def _wanted(source: Saver, only: Sequence[str] | None) -> list[str]:
    if isinstance(only, str):
        raise InvalidConfigError("thread_ids is a list of thread ids, not one string")
    if only is None:
        return _list_threads(source)
    return named_threads(source, only, hint=", or leave them out to copy every thread")


def copy_threads(
    source: Saver,
    target: Saver,
    thread_ids: Sequence[str] | None = None,
    *,
    overwrite: bool = False,
    concurrency: int = 8,
    progress: Progress | None = None,
    batch_size: int = BATCH_SIZE,
) -> CopyReport:
    """Copy threads (all of them, or `thread_ids`) from `source` to `target`: every checkpoint
    of every namespace, pending writes, and forks (a fork is a thread of its own).

    Resumable: a thread the target already holds equal to the source is skipped, one that
    holds part of it (a copy cut short) is completed. A thread the target holds with other
    content is a conflict: before anything is written, `ThreadExistsError` names it, unless
    `overwrite`, which replaces it. At the end every thread copied is read back from the
    target and compared by checkpoint count and content hashes: `CopyReport.failed` lists
    those that differ.

    Args:
        thread_ids: the threads to copy; `ThreadNotFoundError` (before anything is written)
            if one is not in the source.
        concurrency: threads copied at once.
        progress: `progress(done, total)` after each thread, on the calling thread.
        batch_size: see `put_thread`.

    Example:
        >>> source, target = connect("sqlite:///a.db"), connect("redis://localhost")  # doctest: +SKIP
        >>> report = copy_threads(source, target)  # doctest: +SKIP
        >>> report.ok, report.threads_per_second  # doctest: +SKIP
    """
    started = time.monotonic()
    run = _Run(source, target, getattr(target, "serde", None) or strict_serde(), batch_size)
    concurrency = max(1, int(concurrency))
    with blocked_types() as blocked:
        wanted = _wanted(source, thread_ids)
        held = set(_list_threads(target))
        _each(run.plan, [t for t in wanted if t in held], concurrency)
        conflicts = sorted(t for t, (_, why) in run.plans.items() if why is not None)
        if conflicts and not overwrite:
            raise ThreadExistsError(
                f"{len(conflicts)} of the threads are in the target already with other content "
                f"(thread {conflicts[0]!r}: {run.plans[conflicts[0]][1]}): pass overwrite=True "
                "(--overwrite) to replace them, or name the other threads"
            )
        counter = [0]

        def tick(_: str, __: None) -> None:
            counter[0] += 1
            if progress is not None:
                progress(counter[0], len(wanted))

        _each(run.copy, wanted, concurrency, tick)
        failed: list[tuple[str, str]] = []

        def check(tid: str, why: str | None) -> None:
            if why is not None:
                failed.append((tid, why))

        _each(run.verify, sorted(run.summaries), concurrency, check)
    return CopyReport(
        threads_copied=run.copied,
        threads_skipped=run.skipped,
        threads_verified=run.skipped + run.copied - len(failed),
        checkpoints=run.checkpoints,
        writes=run.writes,
        seconds=time.monotonic() - started,
        failed=tuple(sorted(failed)),
        blocked_types=tuple(sorted(blocked)),
    )


async def acopy_threads(
    source: Saver,
    target: Saver,
    thread_ids: Sequence[str] | None = None,
    *,
    overwrite: bool = False,
    concurrency: int = 8,
    progress: Progress | None = None,
    batch_size: int = BATCH_SIZE,
) -> CopyReport:
    """`copy_threads` off the event loop (the savers' sync methods, on worker threads)."""
    return await asyncio.to_thread(
        copy_threads, source, target, thread_ids, overwrite=overwrite,
        concurrency=concurrency, progress=progress, batch_size=batch_size,
    )
