"""What a command names and how it pages: thread and checkpoint references, the threads a
command acts on, paging, and the helpers the `lgckpt` commands share."""

from __future__ import annotations

import argparse
import dataclasses
import re
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import ThreadNotFoundError
from ..transfer.threads import named_threads
from .common import USAGE, CliError, shown_url
from .damage import DAMAGE
from .output import Output, printable

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ..backends.checkpointer import Checkpointer
    from ..core.rows import StoredSize
    from ..timetravel.history import Inspection
    from ..timetravel.statediff import StateDiff

# LangGraph's checkpoint ids are UUIDs; a thread id may hold ':' (`user:42`).
CHECKPOINT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
PAUSED = "awaiting_human"

REF_HELP = ("THREAD or THREAD:CHECKPOINT_ID; a thread id holding ':' is read whole unless "
            "what follows its last ':' is a checkpoint of the thread before it (write THREAD: "
            "to mean the whole id)")



def thread_config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def latest(saver: Checkpointer, thread_id: str) -> Inspection | None:
    """The state at a thread's newest checkpoint (root graph), or None if it has none."""
    try:
        return saver.inspect(thread_config(thread_id))
    except ThreadNotFoundError:
        return None


def not_found(thread_id: str) -> ThreadNotFoundError:
    return ThreadNotFoundError(
        f"thread {thread_id!r} has no checkpoint: is the thread id right? (`lgckpt threads` "
        "lists them)"
    )


def page_of(ids: Sequence[str], after: str | None, limit: int) -> tuple[list[str], bool]:
    """Thread ids after `after`, at most `limit`, and whether more follow."""
    rest = [t for t in ids if after is None or t > after]
    return rest[:limit], len(rest) > limit


def positive(text: str) -> int:
    n = int(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return n


def add_paging(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument("--limit", type=positive, default=default, metavar="N",
                   help=f"at most N threads (default {default})")
    p.add_argument("--after", metavar="THREAD_ID",
                   help="start after this thread id (threads are listed in id order)")


def say_more(out: Output, more: bool, page: list[str]) -> None:
    if more and page and not out.json_mode:
        out.line(f"(more threads follow: --after {page[-1]})")


def size_totals(sizes: Iterable[StoredSize]) -> dict[str, int]:
    out = {"checkpoints": 0, "blobs": 0, "writes": 0, "bytes": 0}
    for s in sizes:
        out[f"{s.kind}s"] += s.rows
        out["bytes"] += s.bytes
    return out


LISTS_HINT = " (`lgckpt threads` lists a store's)"


def threads_of(saver: Checkpointer, names: Sequence[str], every: bool,
                url: str | None) -> list[str]:
    """The threads a command acts on: those named (each must exist), or every one (`--all`)."""
    if bool(names) == every:
        raise CliError("name one or more threads, or pass --all (not both)", USAGE)
    if every:
        return saver.thread_ids()
    return named_threads(saver, names, shown_url(url or ""), LISTS_HINT)


def checkpoint_ref(text: str) -> tuple[str, str | None]:
    """`THREAD[:CHECKPOINT_ID]` as (thread id, checkpoint id or None): split at the last ':'
    when what follows is a checkpoint id (a UUID) or nothing; otherwise all of it is the
    thread id."""
    thread, sep, tail = text.rpartition(":")
    if sep and (not tail or CHECKPOINT_ID.match(tail)):
        if not thread:
            raise CliError(f"{text!r} names no thread: write THREAD or THREAD:CHECKPOINT_ID",
                           USAGE)
        return thread, tail or None
    return text, None


def resolve_ref(saver: Checkpointer, text: str, checkpoint: str | None = None,
                ns: str = "") -> tuple[str, str | None]:
    """The (thread id, checkpoint id or None) that a command's THREAD argument names, with
    `checkpoint` given apart (THREAD CHECKPOINT) or not. `THREAD:CHECKPOINT_ID` is split at
    the last ':' when the checkpoint is stored in that thread, or when no thread has the whole
    text as its id (the command then reports what is missing); `THREAD:` is THREAD's newest."""
    if checkpoint is not None:
        return text, checkpoint
    thread, cid = checkpoint_ref(text)
    if cid is None or is_stored(saver, thread, ns, cid) or not saver.sizes(text):
        return thread, cid
    return text, None


def is_stored(saver: Checkpointer, thread: str, ns: str, checkpoint_id: str) -> bool:
    try:
        return saver.get_tuple(thread_config(thread, ns, checkpoint_id)) is not None
    except DAMAGE:
        return True  # stored, and the command says it cannot be read


def printable_diff(diff: StateDiff) -> StateDiff:
    """`diff` with the thread ids and keys its text shows raw escaped: one may hold a
    newline, which would start a line of its own."""
    def key(k: Any) -> Any:
        return printable(k) if isinstance(k, str) else k

    return dataclasses.replace(
        diff, labels=(printable(diff.labels[0]), printable(diff.labels[1])) if diff.labels
        else None, changes=[dataclasses.replace(c, path=tuple(map(key, c.path)))
                            for c in diff.changes])
