"""The commands that look into a store and act on its threads: `threads`, `history`, `show`,
`diff`, `fork`, `prune`, `migrate`, `verify`, `stats`. Each is a few calls of the checkpointer's
public methods; what they print is built here."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import re
from collections.abc import Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import ThreadNotFoundError
from ..transfer.threads import named_threads
from .common import (
    OK,
    USAGE,
    VERIFY_FAILED,
    CliError,
    add_command,
    add_strict,
    import_object,
    open_saver,
    quoted_names,
    serde_options,
    shown_url,
)
from .damage import DAMAGE, DamageLog
from .output import Output, human_bytes, printable

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig

    from ..core.rows import StoredSize
    from ..core.saver import StoreCheckpointer
    from ..migrations import SchemaChain
    from ..migrations.runner import MigrationReport
    from ..timetravel.audit import AuditReport
    from ..timetravel.diff import StateDiff
    from ..timetravel.history import HistoryEntry, Inspection

# LangGraph's checkpoint ids are UUIDs; a thread id may hold ':' (`user:42`).
_CHECKPOINT_ID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$", re.I)
_PAUSED = "awaiting_human"

_REF_HELP = ("THREAD or THREAD:CHECKPOINT_ID; a thread id holding ':' is read whole unless "
             "what follows its last ':' is a checkpoint of the thread before it (write THREAD: "
             "to mean the whole id)")


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for add in (_threads, _history, _show, _diff, _fork, _prune, _migrate, _verify, _stats):
        add(sub)


# -- helpers --------------------------------------------------------------------------------------


def _config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def _latest(saver: StoreCheckpointer, thread_id: str) -> Inspection | None:
    """The state at a thread's newest checkpoint (root graph), or None if it has none."""
    try:
        return saver.inspect(_config(thread_id))
    except ThreadNotFoundError:
        return None


def _not_found(thread_id: str) -> ThreadNotFoundError:
    return ThreadNotFoundError(
        f"thread {thread_id!r} has no checkpoint: is the thread id right? (`lgckpt threads` "
        "lists them)"
    )


def _page(ids: Sequence[str], after: str | None, limit: int) -> tuple[list[str], bool]:
    """Thread ids after `after`, at most `limit`, and whether more follow."""
    rest = [t for t in ids if after is None or t > after]
    return rest[:limit], len(rest) > limit


def _positive(text: str) -> int:
    n = int(text)
    if n <= 0:
        raise argparse.ArgumentTypeError(f"{text} is not a positive number")
    return n


def _add_paging(p: argparse.ArgumentParser, default: int) -> None:
    p.add_argument("--limit", type=_positive, default=default, metavar="N",
                   help=f"at most N threads (default {default})")
    p.add_argument("--after", metavar="THREAD_ID",
                   help="start after this thread id (threads are listed in id order)")


def _more(out: Output, more: bool, page: list[str]) -> None:
    if more and page and not out.json_mode:
        out.line(f"(more threads follow: --after {page[-1]})")


def _totals(sizes: Iterable[StoredSize]) -> dict[str, int]:
    out = {"checkpoints": 0, "blobs": 0, "writes": 0, "bytes": 0}
    for s in sizes:
        out[f"{s.kind}s"] += s.rows
        out["bytes"] += s.bytes
    return out


_LISTS = " (`lgckpt threads` lists a store's)"


def _threads_of(saver: StoreCheckpointer, names: Sequence[str], every: bool,
                url: str | None) -> list[str]:
    """The threads a command acts on: those named (each must exist), or every one (`--all`)."""
    if bool(names) == every:
        raise CliError("name one or more threads, or pass --all (not both)", USAGE)
    if every:
        return saver.thread_ids()
    return named_threads(saver, names, shown_url(url or ""), _LISTS)


def _brief(value: Any, width: int = 120) -> str:
    """A value on one line, shortened: JSON-like text (`null`, `"text"`, ISO dates, a model's
    fields), a message as its type and content."""
    from langchain_core.messages import BaseMessage

    from ..timetravel import render

    if isinstance(value, BaseMessage):
        content = value.content if isinstance(value.content, str) else render.text(value.content)
        text = f"{value.type}: {content}"
        calls = getattr(value, "tool_calls", None)
        if calls:
            text += f" [tool calls: {', '.join(str(c.get('name')) for c in calls)}]"
    elif _is_messages(value):
        more = ", ..." if len(value) > 3 else ""
        text = f"[{', '.join(_brief(m, width) for m in value[:3])}{more}]"
    else:
        return render.brief(value, width)
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 3] + "..."


def _is_messages(value: Any) -> bool:
    from langchain_core.messages import BaseMessage

    return isinstance(value, list) and bool(value) and all(
        isinstance(m, BaseMessage) for m in value)


# -- threads --------------------------------------------------------------------------------------


def _threads(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "threads", help="list threads: checkpoints, size, last update, status",
        description="List the store's threads in id order, a page at a time: checkpoints "
        "stored (every namespace), bytes stored, the time of the newest checkpoint, and the "
        "status at it (awaiting human: paused at interrupt(); error: a task failed; done: "
        "nothing left to run; running: nodes are due; damaged: it cannot be decoded, see "
        "stderr and the exit code 8).",
        example="lgckpt threads --url sqlite:///agent.db --limit 20\n"
                "lgckpt threads --after t-0420 --json",
    )
    _add_paging(p, 100)
    add_strict(p)
    p.set_defaults(run=run_threads)


def thread_summary(saver: StoreCheckpointer, thread_id: str, damage: DamageLog | None = None
                   ) -> dict[str, Any] | None:
    """A row of `threads`: the thread's totals and its status (None: nothing stored). A
    thread that cannot be decoded is reported to `damage` (if given) and listed as `damaged`,
    with the row and error."""
    totals = _totals(saver.sizes(thread_id))  # read natively: no value decoded
    try:
        state = _latest(saver, thread_id)
    except DAMAGE as exc:
        if damage is None:
            raise
        found = damage.record(thread_id, exc)
        return {"thread_id": thread_id, "checkpoints": totals["checkpoints"],
                "bytes": totals["bytes"], "last_update": None, "status": "damaged",
                "checkpoint_id": None, "next": [], "row": found.row, "error": found.error}
    if state is None and not totals["checkpoints"]:
        return None  # gone since it was listed (deleted, expired)
    return {
        "thread_id": thread_id,
        "checkpoints": totals["checkpoints"],
        "bytes": totals["bytes"],
        "last_update": state.created_at if state else None,
        "status": state.status if state else None,
        "checkpoint_id": state.config["configurable"]["checkpoint_id"] if state else None,
        "next": list(state.next) if state else [],
    }


def run_threads(args: argparse.Namespace, out: Output) -> int:
    damage = DamageLog(out, args.strict)
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        page, more = _page(saver.thread_ids(), args.after, args.limit)
        rows = []
        with out.progress(len(page), "reading threads") as bar:
            for thread_id in page:
                row = thread_summary(saver, thread_id, damage)
                if row is not None:
                    rows.append(row)
                bar.update()
    out.table(rows, ["thread_id", "checkpoints", "bytes", "last_update", "status"])
    _more(out, more, page)
    return damage.finish(OK)


# -- history --------------------------------------------------------------------------------------


def _history(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "history", help="a thread's checkpoints, newest first",
        description="A thread's checkpoints, newest first: id, step, source, the nodes due "
        "next, time, and the channels of the pending writes stored with each (the writes of "
        "the step that ran from it). A checkpoint whose values cannot be decoded is listed as "
        "damaged (reported on stderr; exit code 8).",
        example="lgckpt history t-1 --limit 10\n"
                "lgckpt history t-1:1f0c2a3e-8d4b-6a2c-8001-5e0f3c9a7b21 --limit 5\n"
                "lgckpt history t-1 --subgraphs --json",
    )
    p.add_argument("thread", metavar="THREAD", help=f"{_REF_HELP}; with a checkpoint, the "
                   "listing starts at it")
    p.add_argument("--limit", type=_positive, default=50, metavar="N",
                   help="at most N checkpoints (default 50)")
    p.add_argument("--before", metavar="CHECKPOINT", help="start after this checkpoint id")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--ns", default=None, metavar="NS",
                       help="a subgraph's namespace (default: the root graph's)")
    where.add_argument("--subgraphs", action="store_true",
                       help="every namespace: the root graph's and its subgraphs'")
    add_strict(p)
    p.set_defaults(run=run_history)


def run_history(args: argparse.Namespace, out: Output) -> int:
    damage = DamageLog(out, args.strict, noun="checkpoint", done="listed without its values")
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        first = _history_start(saver, args, damage)
        try:
            rows = [_history_row(e) for e in _entries(saver, args, metadata_only=False)]
        except DAMAGE as exc:
            if args.strict:
                damage.record(args.thread, exc)
            rows = _history_one_by_one(saver, args, damage)
        rows = (first + rows)[:args.limit]
        if not rows and args.before is None:
            if args.ns and _latest(saver, args.thread) is not None:
                raise ThreadNotFoundError(
                    f"thread {args.thread!r} has no checkpoint in namespace {args.ns!r}: "
                    "`lgckpt history THREAD --subgraphs` lists the namespaces")
            raise _not_found(args.thread)
    columns = ["checkpoint_id", "step", "source", "next", "time", "writes"]
    if args.subgraphs:
        columns.insert(1, "checkpoint_ns")
    if damage.found:
        columns.append("status")
    out.table(rows, columns)
    return damage.finish(OK)


def _history_start(saver: StoreCheckpointer, args: argparse.Namespace, damage: DamageLog
                   ) -> list[dict[str, Any]]:
    """Resolve `args.thread`; for THREAD:CHECKPOINT, the row of that checkpoint, with
    `args.before` set to list the older ones after it."""
    ns = args.ns or ""
    args.thread, start = resolve_ref(saver, args.thread, None, ns)
    if start is None:
        return []
    if args.before is not None:
        raise CliError("give where the listing starts once: THREAD:CHECKPOINT (from it) or "
                       "--before CHECKPOINT (after it)", USAGE)
    args.before = start
    try:
        state = saver.inspect(_config(args.thread, ns, start))
    except DAMAGE as exc:
        found = damage.record(args.thread, exc, start)
        return [{"checkpoint_id": start, "checkpoint_ns": ns, "next": None, "writes": None,
                 "status": "damaged", "row": found.row, "error": found.error}]
    doc = inspection_dict(state)
    return [{
        "checkpoint_id": start,
        "checkpoint_ns": doc["checkpoint_ns"],
        "parent_checkpoint_id": doc["parent_checkpoint_id"],
        "step": doc["metadata"].get("step"),
        "source": doc["metadata"].get("source"),
        "next": doc["next"],
        "time": doc["created_at"],
        "writes": list(dict.fromkeys(w["channel"] for w in doc["pending_writes"])),
        "metadata": doc["metadata"],
    }]


def _entries(saver: StoreCheckpointer, args: argparse.Namespace, *, metadata_only: bool
             ) -> Iterator[HistoryEntry]:
    return saver.history(args.thread, limit=args.limit, before=args.before,
                         checkpoint_ns=args.ns, subgraphs=args.subgraphs,
                         metadata_only=metadata_only)


def _history_row(e: HistoryEntry) -> dict[str, Any]:
    return {
        "checkpoint_id": e.checkpoint_id,
        "checkpoint_ns": e.checkpoint_ns,
        "parent_checkpoint_id": e.parent_checkpoint_id,
        "step": e.step,
        "source": e.source,
        "next": list(e.next or ()),
        "time": e.created_at,
        "writes": list(dict.fromkeys(ch for _, ch, _ in e.pending_writes or ())),
        "metadata": e.metadata,
    }


def _history_one_by_one(saver: StoreCheckpointer, args: argparse.Namespace,
                        damage: DamageLog) -> list[dict[str, Any]]:
    """The history of a damaged thread: its checkpoints listed from their records (no value
    decoded), each then read alone; one that cannot be is listed as damaged."""
    from ..timetravel.history import next_nodes

    rows: list[dict[str, Any]] = []
    entries = iter(_entries(saver, args, metadata_only=True))
    while True:
        try:
            entry = next(entries, None)
        except DAMAGE as exc:  # a checkpoint record itself: the listing cannot go past it
            damage.record(args.thread, exc)
            return rows
        if entry is None:
            return rows
        row = _history_row(entry)
        try:
            tup = saver.get_tuple(entry.config)
        except DAMAGE as exc:
            found = damage.record(args.thread, exc, entry.checkpoint_id)
            rows.append({**row, "next": None, "writes": None, "status": "damaged",
                         "row": found.row, "error": found.error})
            continue
        if tup is not None:
            row["next"] = list(next_nodes(tup.checkpoint))
            row["writes"] = list(dict.fromkeys(ch for _, ch, _ in tup.pending_writes or ()))
        rows.append(row)


# -- show -----------------------------------------------------------------------------------------


def _show(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "show", help="the state at a checkpoint (the latest by default)",
        description="The state at one checkpoint of a thread (its newest by default): channel "
        "values, metadata, next nodes, status, pending writes and interrupts. Values are "
        "shortened in text; --json prints them whole.",
        example="lgckpt show t-1\n"
                "lgckpt show t-1:1f0c2a3e-8d4b-6a2c-8001-5e0f3c9a7b21 --json\n"
                "lgckpt show t-1 1f0c2a3e-8d4b-6a2c-8001-5e0f3c9a7b21",
    )
    p.add_argument("thread", metavar="THREAD", help=_REF_HELP)
    p.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?", help="a checkpoint id "
                   "(default: the newest)")
    p.add_argument("--ns", default="", metavar="NS",
                   help="a subgraph's namespace (default: the root graph's)")
    p.set_defaults(run=run_show)


def inspection_dict(state: Inspection) -> dict[str, Any]:
    conf = state.config["configurable"]
    parent = (state.parent_config or {}).get("configurable", {}).get("checkpoint_id")
    return {
        "thread_id": conf["thread_id"],
        "checkpoint_ns": conf.get("checkpoint_ns", ""),
        "checkpoint_id": conf["checkpoint_id"],
        "parent_checkpoint_id": parent,
        "created_at": state.created_at,
        "status": state.status,
        "next": list(state.next),
        "values": state.values,
        "metadata": state.metadata,
        "pending_writes": [
            {"task_id": task, "channel": channel, "value": value}
            for task, channel, value in state.pending_writes
        ],
        "interrupts": list(state.interrupts),
    }


def run_show(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        thread, checkpoint = resolve_ref(saver, args.thread, args.checkpoint, args.ns)
        state = saver.inspect(_config(thread, args.ns, checkpoint))
    doc = inspection_dict(state)
    if out.json_mode:
        out.json(doc)
        return OK
    for line in _show_lines(doc):
        out.line(line)
    return OK


def _show_lines(doc: dict[str, Any]) -> list[str]:
    step = doc["metadata"].get("step")
    head = [
        ("thread", doc["thread_id"]),
        ("namespace", doc["checkpoint_ns"] or None),
        ("checkpoint", doc["checkpoint_id"]),
        ("parent", doc["parent_checkpoint_id"] or "-"),
        ("created", doc["created_at"].isoformat(timespec="seconds") if doc["created_at"] else "-"),
        ("step", f"{step} ({doc['metadata'].get('source', '?')})" if step is not None else None),
        ("status", doc["status"].replace("_", " ")),
        ("next", ", ".join(doc["next"]) or "-"),
    ]
    lines = [f"{k:<11}{v}" for k, v in head if v is not None]
    if doc["interrupts"]:
        lines.append("interrupts")
        lines += [f"  {_brief(v)}" for v in doc["interrupts"]]
    lines.append("values")
    lines += _value_lines(doc["values"]) or ["  (none)"]
    lines.append("metadata")
    lines += [f"  {k}: {_brief(v)}" for k, v in sorted(doc["metadata"].items())]
    if doc["pending_writes"]:
        lines.append("pending writes")
        lines += [f"  {w['task_id'][:8]}  {w['channel']}: {_brief(w['value'])}"
                  for w in doc["pending_writes"]]
    return lines


def _value_lines(values: dict[str, Any], keep: int = 20) -> list[str]:
    width = max((len(k) for k in values), default=0)
    lines = []
    for name, value in values.items():
        if not _is_messages(value):
            lines.append(f"  {name:<{width}}  {_brief(value)}")
            continue
        lines.append(f"  {name:<{width}}  ({len(value)} messages)")
        if len(value) > keep:
            lines.append(f"    ... {len(value) - keep} earlier")
        lines += [f"    {_brief(m, 110)}" for m in value[-keep:]]
    return lines


# -- diff -----------------------------------------------------------------------------------------


def _diff(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "diff", help="what changed between two checkpoints",
        description="What changed from checkpoint A to checkpoint B, per channel (message "
        "lists by message id). A and B are THREAD (its newest checkpoint) or "
        "THREAD:CHECKPOINT_ID, of one thread or of two.",
        example="lgckpt diff t-1:1f0c2a3e-8d4b-6a2c-8001-5e0f3c9a7b21 t-1\n"
                "lgckpt diff t-1 t-1-fork --json",
    )
    p.add_argument("a", metavar="A", help=_REF_HELP)
    p.add_argument("b", metavar="B", help=_REF_HELP)
    p.set_defaults(run=run_diff)


def checkpoint_ref(text: str) -> tuple[str, str | None]:
    """`THREAD[:CHECKPOINT_ID]` as (thread id, checkpoint id or None): split at the last ':'
    when what follows is a checkpoint id (a UUID) or nothing; otherwise all of it is the
    thread id."""
    thread, sep, tail = text.rpartition(":")
    if sep and (not tail or _CHECKPOINT_ID.match(tail)):
        if not thread:
            raise CliError(f"{text!r} names no thread: write THREAD or THREAD:CHECKPOINT_ID",
                           USAGE)
        return thread, tail or None
    return text, None


def resolve_ref(saver: StoreCheckpointer, text: str, checkpoint: str | None = None,
                ns: str = "") -> tuple[str, str | None]:
    """The (thread id, checkpoint id or None) that a command's THREAD argument names, with
    `checkpoint` given apart (THREAD CHECKPOINT) or not. `THREAD:CHECKPOINT_ID` is split at
    the last ':' when the checkpoint is stored in that thread, or when no thread has the whole
    text as its id (the command then reports what is missing); `THREAD:` is THREAD's newest."""
    if checkpoint is not None:
        return text, checkpoint
    thread, cid = checkpoint_ref(text)
    if cid is None or _stored(saver, thread, ns, cid) or not saver.sizes(text):
        return thread, cid
    return text, None


def _stored(saver: StoreCheckpointer, thread: str, ns: str, checkpoint_id: str) -> bool:
    try:
        return saver.get_tuple(_config(thread, ns, checkpoint_id)) is not None
    except DAMAGE:
        return True  # stored, and the command says it cannot be read


def run_diff(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        a, b = resolve_ref(saver, args.a), resolve_ref(saver, args.b)
        diff = saver.diff(_config(a[0], "", a[1]), _config(b[0], "", b[1]))
    if out.json_mode:
        out.json(diff.to_dict())
    else:
        out.lines(_printable_diff(diff).to_text())
    return OK


def _printable_diff(diff: StateDiff) -> StateDiff:
    """`diff` with the thread ids and keys its text shows raw escaped: one may hold a
    newline, which would start a line of its own."""
    def key(k: Any) -> Any:
        return printable(k) if isinstance(k, str) else k

    return dataclasses.replace(
        diff, labels=(printable(diff.labels[0]), printable(diff.labels[1])) if diff.labels
        else None, changes=[dataclasses.replace(c, path=tuple(map(key, c.path)))
                            for c in diff.changes])


# -- fork -----------------------------------------------------------------------------------------


def _fork(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "fork", help="copy a thread's history up to a checkpoint into a new thread",
        description="A new thread holding THREAD's history up to CHECKPOINT (its newest by "
        "default), marked as a fork of it; THREAD is not touched. Fails with exit code 4 if "
        "the new thread already holds checkpoints.",
        example="lgckpt fork t-1:1f0c2a3e-8d4b-6a2c-8001-5e0f3c9a7b21 --to t-1-retry\n"
                "lgckpt fork t-1 1f0c2a3e-8d4b-6a2c-8001-5e0f3c9a7b21",
    )
    p.add_argument("thread", metavar="THREAD", help=f"the thread to fork: {_REF_HELP}")
    p.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?",
                   help="the fork point (default: the newest checkpoint)")
    p.add_argument("--to", metavar="NEW_THREAD",
                   help="the new thread id (default: THREAD~<8 random hex digits>)")
    p.set_defaults(run=run_fork)


def run_fork(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=True, create=False, **serde_options(args)) as saver:
        thread, checkpoint = resolve_ref(saver, args.thread, args.checkpoint)
        head = saver.fork(_config(thread, "", checkpoint), args.to)
    conf = head["configurable"]
    result = {"source_thread_id": thread, "checkpoint_id": conf["checkpoint_id"],
              "thread_id": conf["thread_id"]}
    if out.json_mode:
        out.json(result)
    else:
        out.line(f"forked thread {thread!r} at checkpoint {conf['checkpoint_id']} into "
                 f"thread {conf['thread_id']!r}")
    return OK


# -- prune ----------------------------------------------------------------------------------------


def _prune(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "prune", help="delete old checkpoints, or whole threads",
        description="keep_latest keeps each namespace's newest checkpoint (and what its "
        "values still need); delete removes the threads. A thread paused for a human "
        "(awaiting human) is skipped unless --include-paused is given. --dry-run lists what "
        "would be removed and changes nothing.",
        example="lgckpt prune --all --dry-run\n"
                "lgckpt prune t-1 t-2 --strategy delete",
    )
    p.add_argument("threads", metavar="THREAD", nargs="*", help="the threads to prune")
    p.add_argument("--all", action="store_true", help="every thread of the store")
    p.add_argument("--strategy", choices=("keep_latest", "delete"), default="keep_latest",
                   help="what to remove (default: keep_latest)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, "
                   "change nothing")
    p.add_argument("--include-paused", action="store_true",
                   help="prune threads awaiting a human too")
    p.set_defaults(run=run_prune)


def _prune_row(saver: StoreCheckpointer, thread_id: str, args: argparse.Namespace
               ) -> dict[str, Any] | None:
    """What pruning a thread would do (None: the thread is gone)."""
    stored = _totals(saver.sizes(thread_id))["checkpoints"]
    if not stored:
        return None
    state = _latest(saver, thread_id)
    paused = state is not None and state.status == _PAUSED
    victims = [] if paused and not args.include_paused else saver.prune_plan(
        thread_id, strategy=args.strategy)
    if paused and not args.include_paused:
        action = "skipped: awaiting human"
    elif not victims:
        action = "nothing to remove"
    else:
        action = "would remove" if args.dry_run else "removed"
    return {
        "thread_id": thread_id,
        "status": action,
        "thread_status": state.status if state else None,
        "removed": len(victims),
        "kept": stored - len(victims),
        "checkpoints": [{"checkpoint_ns": ns, "checkpoint_id": cid} for ns, cid in victims],
    }


def run_prune(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=not args.dry_run, create=False, **serde_options(args)) as saver:
        threads = _threads_of(saver, args.threads, args.all, args.url)
        rows = [r for r in (_prune_row(saver, t, args) for t in threads) if r is not None]
        todo = [r["thread_id"] for r in rows if r["removed"]]
        if not args.dry_run and todo:
            with out.progress(len(todo), "pruning") as bar:
                for thread_id in todo:
                    saver.prune([thread_id], strategy=args.strategy)
                    bar.update()
    out.table(rows, ["thread_id", "status", "removed", "kept"])
    if not out.json_mode:
        removed = sum(r["removed"] for r in rows)
        skipped = sum(1 for r in rows if r["status"].startswith("skipped"))
        verb = "would remove" if args.dry_run else "removed"
        text = f"{verb} {removed} checkpoint(s) of {len(todo)} thread(s)"
        if skipped:
            text += f"; {skipped} thread(s) awaiting a human skipped (--include-paused prunes them)"
        out.line(text + ("; nothing changed (dry run)" if args.dry_run else ""))
    return OK


# -- migrate --------------------------------------------------------------------------------------


def _migrate(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "migrate", help="upgrade stored threads to the current state schema",
        description="Rewrite stored checkpoints older than the chain's current state-schema "
        "version (of every thread, or of those named), with their pending writes; each "
        "checkpoint once, logged. A run that was stopped finishes the job when started again. "
        "Only the chain's own threads (stamped with its name) are rewritten; "
        "--include-unstamped adds those with no chain name (written before names, or with no "
        "chain); another chain's threads are skipped, and listed. "
        "--chain names your SchemaChain as MODULE:ATTR, imported from --path (default: the "
        "current directory).",
        example="lgckpt migrate --chain myapp.state:CHAIN --path src --dry-run\n"
                "lgckpt migrate --chain myapp.state:CHAIN --include-unstamped\n"
                "lgckpt migrate --chain myapp.state:CHAIN t-1 t-2",
    )
    p.add_argument("threads", metavar="THREAD", nargs="*",
                   help="the threads to migrate (default: every thread of the chain)")
    p.add_argument("--chain", required=True, metavar="MODULE:ATTR",
                   help="the SchemaChain to apply, e.g. myapp.state:CHAIN")
    p.add_argument("--path", action="append", metavar="DIR",
                   help="a directory to import MODULE from (repeatable; default: .)")
    p.add_argument("--dry-run", action="store_true",
                   help="report what would change and the threads skipped, write nothing")
    p.add_argument("--include-unstamped", action="store_true",
                   help="also migrate threads stamped with no chain name (and stamp them)")
    p.set_defaults(run=run_migrate)


def load_chain(spec: str, dirs: Sequence[str] | None) -> SchemaChain:
    """The `SchemaChain` that `MODULE:ATTR` names, MODULE imported with `dirs` first on the
    path."""
    from ..migrations import SchemaChain

    obj = import_object(spec, "--chain", dirs or ["."], example="myapp.state:CHAIN",
                        hint="add its directory with --path DIR")
    if not isinstance(obj, SchemaChain):
        raise CliError(f"--chain: {spec} is a {type(obj).__name__}, not a SchemaChain", USAGE)
    return obj


def run_migrate(args: argparse.Namespace, out: Output) -> int:
    chain = load_chain(args.chain, args.path)
    with open_saver(args.url, write=not args.dry_run, create=False, **serde_options(args),
                    schema_chain=chain) as saver:
        threads = _threads_of(saver, args.threads, False, args.url) if args.threads else None
        with out.progress(len(threads) if threads else None, "migrating threads") as bar:

            def step(p: Any) -> None:  # called after each thread, from the saver's loop
                bar.total = p.threads_total
                bar.update(p.threads_done - bar.done)

            report = saver.migrate_threads(threads, dry_run=args.dry_run, progress=step,
                                           include_unstamped=args.include_unstamped)
    if out.json_mode:
        out.json(report)
    else:
        out.lines(_printable_migration(report).summary())
    return OK


def _printable_migration(report: MigrationReport) -> MigrationReport:
    """`report` with the ids its summary shows raw escaped (see `_printable_diff`)."""
    return dataclasses.replace(report, changes=[
        dataclasses.replace(c, thread_id=printable(c.thread_id),
                            checkpoint_ns=printable(c.checkpoint_ns))
        for c in report.changes], threads=[printable(t) for t in report.threads], skipped=[
        dataclasses.replace(s, thread_id=printable(s.thread_id),
                            schema_name=None if s.schema_name is None else printable(s.schema_name))
        for s in report.skipped])


# -- verify ---------------------------------------------------------------------------------------


def _verify(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "verify", help="check threads' audit hash chains (exit 6 on a problem)",
        description="Recompute each checkpoint's audit hash from what is stored and check the "
        "links to its parent, for threads written while the store was audited (lgckpt audit). "
        "Exits with 6 when a checkpoint was altered, removed or replaced, or when a thread "
        "holds no audit trail.",
        example="lgckpt verify --all\n"
                "lgckpt verify t-1 --json",
    )
    p.add_argument("threads", metavar="THREAD", nargs="*", help="the threads to verify")
    p.add_argument("--all", action="store_true", help="every thread of the store")
    p.set_defaults(run=run_verify)


def audit_row(report: AuditReport) -> dict[str, Any]:
    from ..timetravel.audit import UNHASHED

    unaudited = bool(report.problems) and all(p.kind == UNHASHED for p in report.problems) and (
        len(report.problems) == report.checked)
    if report.ok:
        status = "intact"
    elif unaudited:
        status = "not audited"
    else:
        status = f"failed: {len(report.problems)} problem(s)"
    return {
        "thread_id": report.thread_id,
        "checked": report.checked,
        "status": status,
        "ok": report.ok,
        "audited": not unaudited,
        "problems": [
            {"kind": p.kind, "checkpoint_ns": p.checkpoint_ns, "checkpoint_id": p.checkpoint_id,
             "detail": p.detail}
            for p in report.problems
        ],
    }


def run_verify(args: argparse.Namespace, out: Output) -> int:
    reports = []
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        threads = _threads_of(saver, args.threads, args.all, args.url)
        with out.progress(len(threads), "verifying") as bar:
            for thread_id in threads:
                try:
                    reports.append(saver.verify(thread_id))
                except ThreadNotFoundError:
                    if not args.all:
                        raise
                bar.update()
    rows = [audit_row(r) for r in reports]
    out.table(rows, ["thread_id", "checked", "status"])
    failed = [r for r in reports if not r.ok and audit_row(r)["audited"]]
    unaudited = [r["thread_id"] for r in rows if not r["audited"]]
    if not out.json_mode:
        for report in failed:
            out.lines(str(_printable_audit(report)))
    offs = [s for s in (reports[0].switches if reports else []) if not s.enabled]
    if offs and (failed or unaudited):
        out.note(f"the store's audit was turned off {len(offs)} time(s), last at "
                 f"{_iso(offs[-1].at)} ({printable(offs[-1].reason)}): checkpoints stored "
                 "while it was off are not sealed")
    if unaudited:
        out.error(f"{len(unaudited)} thread(s) hold no audit trail ({quoted_names(unaudited)}): they "
                  "were written with audit off; turn it on for the store (lgckpt audit on, or "
                  "open a checkpointer with audit=True) to record one")
    if failed:
        out.error(f"verification failed for {len(failed)} of {len(rows)} thread(s): "
                  f"{quoted_names([r.thread_id for r in failed])}")
    return VERIFY_FAILED if failed or unaudited else OK


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds")


def _printable_audit(report: AuditReport) -> AuditReport:
    """`report` with what its text shows raw escaped (see `_printable_diff`)."""
    return dataclasses.replace(report, problems=[
        dataclasses.replace(p, checkpoint_ns=printable(p.checkpoint_ns),
                            detail=printable(p.detail))
        for p in report.problems])


# -- stats ----------------------------------------------------------------------------------------


def _stats(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "stats", help="bytes stored per thread, or per channel of one thread",
        description="Bytes of stored values (serialized data; not the keys, indexes or the "
        "engine's overhead): per thread, or with THREAD per namespace, kind (checkpoint "
        "records, channel values as blobs, pending writes) and channel.",
        example="lgckpt stats --limit 20\n"
                "lgckpt stats t-1 --json",
    )
    p.add_argument("thread", metavar="THREAD", nargs="?", help="one thread, in detail")
    _add_paging(p, 100)
    p.set_defaults(run=run_stats)


def run_stats(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        if args.thread is not None:
            return _thread_stats(saver, args.thread, out)
        page, more = _page(saver.thread_ids(), args.after, args.limit)
        rows: list[dict[str, Any]] = []
        with out.progress(len(page), "reading sizes") as bar:
            for thread_id in page:
                totals = _totals(saver.sizes(thread_id))
                if totals["checkpoints"]:
                    rows.append({"thread_id": thread_id, **totals})
                bar.update()
    out.table(rows, ["thread_id", "checkpoints", "blobs", "writes", "bytes"])
    if not out.json_mode and rows:
        out.line(f"total: {human_bytes(sum(r['bytes'] for r in rows))} in {len(rows)} "
                 "thread(s)")
    _more(out, more, page)
    return OK


def _thread_stats(saver: StoreCheckpointer, thread_id: str, out: Output) -> int:
    sizes = saver.sizes(thread_id)
    if not sizes:
        raise _not_found(thread_id)
    order = {"checkpoint": 0, "blob": 1, "write": 2}
    sizes.sort(key=lambda s: (s.checkpoint_ns, order.get(s.kind, 3), -s.bytes, s.channel))
    rows = [{"checkpoint_ns": s.checkpoint_ns, "kind": s.kind, "channel": s.channel,
             "rows": s.rows, "bytes": s.bytes} for s in sizes]
    out.table(rows, ["checkpoint_ns", "kind", "channel", "rows", "bytes"])
    if not out.json_mode:
        out.line(f"total: {human_bytes(sum(s.bytes for s in sizes))} in "
                 f"{sum(s.rows for s in sizes)} row(s)")
    return OK
