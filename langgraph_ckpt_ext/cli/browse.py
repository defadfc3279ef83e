"""The commands that look into a store: `threads`, `history`, `show`, `diff`. Each is a few
calls of the checkpointer's public methods; what they print is built here."""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from ..core.errors import ThreadNotFoundError
from ..core.redact import DEFAULT
from .common import (
    OK,
    USAGE,
    CliError,
    add_command,
    add_strict,
    open_saver,
    serde_options,
)
from .damage import DAMAGE, DamageLog
from .output import Output
from .selection import (
    REF_HELP,
    add_paging,
    latest,
    not_found,
    page_of,
    positive,
    printable_diff,
    resolve_ref,
    say_more,
    size_totals,
    thread_config,
)

if TYPE_CHECKING:
    from ..backends.checkpointer import Checkpointer
    from ..timetravel.history import HistoryEntry, Inspection


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for add in (_threads, _history, _show, _diff):
        add(sub)


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
    add_paging(p, 100)
    add_strict(p)
    p.add_argument("--lifecycle", action="store_true",
                   help="show each thread's lifecycle row too: when it was created and last "
                        "written, whether it is pinned, and its own retention policy")
    p.set_defaults(run=run_threads)


def thread_summary(saver: Checkpointer, thread_id: str, damage: DamageLog | None = None
                   ) -> dict[str, Any] | None:
    """A row of `threads`: the thread's totals and its status (None: nothing stored). A
    thread that cannot be decoded is reported to `damage` (if given) and listed as `damaged`,
    with the row and error."""
    totals = size_totals(saver.sizes(thread_id))  # read natively: no value decoded
    try:
        state = latest(saver, thread_id)
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


def lifecycle_columns(saver: Checkpointer, thread_id: str) -> dict[str, Any]:
    """A thread's lifecycle row as `threads --lifecycle` shows it (no row: all None)."""
    state = saver.thread_state(thread_id)
    if state is None:
        return dict.fromkeys(("created", "written", "read", "pinned", "policy"))

    def at(seconds: float | None) -> dt.datetime | None:
        return None if seconds is None else dt.datetime.fromtimestamp(seconds, dt.timezone.utc)

    return {"created": at(state.created_at), "written": at(state.written_at),
            "read": at(state.read_at), "pinned": state.pinned,
            "policy": None if state.policy is None else json.loads(state.policy)}


def run_threads(args: argparse.Namespace, out: Output) -> int:
    damage = DamageLog(out, args.strict)
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        page, more = page_of(saver.thread_ids(), args.after, args.limit)
        rows = []
        with out.progress(len(page), "reading threads") as bar:
            for thread_id in page:
                row = thread_summary(saver, thread_id, damage)
                if row is not None:
                    if args.lifecycle:
                        row.update(lifecycle_columns(saver, thread_id))
                    rows.append(row)
                bar.update()
    columns = ["thread_id", "checkpoints", "bytes", "last_update", "status"]
    if args.lifecycle:
        columns[3:4] = ["created", "written", "pinned"]
    out.table(rows, columns)
    say_more(out, more, page)
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
    p.add_argument("thread", metavar="THREAD", help=f"{REF_HELP}; with a checkpoint, the "
                   "listing starts at it")
    p.add_argument("--limit", type=positive, default=50, metavar="N",
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
            if args.ns and latest(saver, args.thread) is not None:
                raise ThreadNotFoundError(
                    f"thread {args.thread!r} has no checkpoint in namespace {args.ns!r}: "
                    "`lgckpt history THREAD --subgraphs` lists the namespaces")
            raise not_found(args.thread)
    columns = ["checkpoint_id", "step", "source", "next", "time", "writes"]
    if args.subgraphs:
        columns.insert(1, "checkpoint_ns")
    if damage.found:
        columns.append("status")
    out.table(rows, columns)
    return damage.finish(OK)


def _history_start(saver: Checkpointer, args: argparse.Namespace, damage: DamageLog
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
        state = saver.inspect(thread_config(args.thread, ns, start))
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
        "metadata": DEFAULT.mask(doc["metadata"]),
    }]


def _entries(saver: Checkpointer, args: argparse.Namespace, *, metadata_only: bool
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
        "metadata": DEFAULT.mask(e.metadata or {}),
    }


def _history_one_by_one(saver: Checkpointer, args: argparse.Namespace,
                        damage: DamageLog) -> list[dict[str, Any]]:
    """The history of a damaged thread: its checkpoints listed from their records (no value
    decoded), each then read alone; one that cannot be is listed as damaged."""
    from ..core.graph import next_nodes

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
    p.add_argument("thread", metavar="THREAD", help=REF_HELP)
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
        # a secret stored before redaction (or by another saver) is never printed
        "metadata": DEFAULT.mask(state.metadata or {}),
        "pending_writes": [
            {"task_id": task, "channel": channel, "value": value}
            for task, channel, value in state.pending_writes
        ],
        "interrupts": list(state.interrupts),
    }


def run_show(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        thread, checkpoint = resolve_ref(saver, args.thread, args.checkpoint, args.ns)
        state = saver.inspect(thread_config(thread, args.ns, checkpoint))
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
    p.add_argument("a", metavar="A", help=REF_HELP)
    p.add_argument("b", metavar="B", help=REF_HELP)
    p.set_defaults(run=run_diff)


def run_diff(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        a, b = resolve_ref(saver, args.a), resolve_ref(saver, args.b)
        diff = saver.diff(thread_config(a[0], "", a[1]), thread_config(b[0], "", b[1]))
    if out.json_mode:
        out.json(diff.to_dict())
    else:
        out.lines(printable_diff(diff).to_text())
    return OK
