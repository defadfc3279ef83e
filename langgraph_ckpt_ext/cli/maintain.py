"""The commands that act on a store's threads: `fork`, `prune`, `migrate`, `verify`, `stats`.
Each is a few calls of the checkpointer's public methods; what they print is built here."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import ThreadNotFoundError
from ..core.retention import Retention
from .common import (
    BUSY,
    OK,
    USAGE,
    VERIFY_FAILED,
    CliError,
    add_command,
    import_object,
    open_saver,
    quoted_names,
    serde_options,
)
from .lifecycle import add_rules, policy_of, sweep_rows
from .output import Output, human_bytes, printable
from .selection import (
    PAUSED,
    REF_HELP,
    add_paging,
    latest,
    not_found,
    page_of,
    resolve_ref,
    say_more,
    size_totals,
    thread_config,
    threads_of,
)

if TYPE_CHECKING:
    from ..backends.checkpointer import Checkpointer
    from ..migrations import SchemaChain
    from ..migrations.runner import MigrationReport
    from ..timetravel.audit import AuditReport


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for add in (_fork, _prune, _migrate, _verify, _stats):
        add(sub)


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
    p.add_argument("thread", metavar="THREAD", help=f"the thread to fork: {REF_HELP}")
    p.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?",
                   help="the fork point (default: the newest checkpoint)")
    p.add_argument("--to", metavar="NEW_THREAD",
                   help="the new thread id (default: THREAD~<8 random hex digits>)")
    p.set_defaults(run=run_fork)


def run_fork(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=True, create=False, **serde_options(args)) as saver:
        thread, checkpoint = resolve_ref(saver, args.thread, args.checkpoint)
        head = saver.fork(thread_config(thread, "", checkpoint), args.to)
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
        "would be removed and changes nothing. With --idle-for, --older-than or --keep (and "
        "--all or named threads), the threads are chosen by their lifecycle rows, as one pass "
        "of `lgckpt sweep` with that policy: those not written for --idle-for or since "
        "--older-than are pruned with --strategy, and --keep N cuts each history to its newest "
        "N checkpoints; pinned threads are left alone.",
        example="lgckpt prune --all --dry-run\n"
                "lgckpt prune t-1 t-2 --strategy delete\n"
                "lgckpt prune --all --idle-for 30d --strategy delete --dry-run\n"
                "lgckpt prune --all --keep 10\n"
                "lgckpt prune t-1 t-2 --keep 3",
    )
    p.add_argument("threads", metavar="THREAD", nargs="*", help="the threads to prune")
    p.add_argument("--all", action="store_true", help="every thread of the store")
    p.add_argument("--strategy", choices=("keep_latest", "delete"), default="keep_latest",
                   help="what to remove (default: keep_latest)")
    p.add_argument("--dry-run", action="store_true", help="list what would be removed, "
                   "change nothing")
    p.add_argument("--include-paused", action="store_true",
                   help="prune threads awaiting a human too")
    add_rules(p, absolute=False)
    p.set_defaults(run=run_prune)


def _prune_row(saver: Checkpointer, thread_id: str, args: argparse.Namespace
               ) -> dict[str, Any] | None:
    """What pruning a thread would do (None: the thread is gone)."""
    stored = size_totals(saver.sizes(thread_id))["checkpoints"]
    if not stored:
        return None
    state = latest(saver, thread_id)
    paused = state is not None and state.status == PAUSED
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
    policy = policy_of(args, args.strategy, args.include_paused)
    if policy is not None:
        return _prune_by_policy(args, out, policy)
    with open_saver(args.url, write=not args.dry_run, create=False, **serde_options(args)) as saver:
        threads = threads_of(saver, args.threads, args.all, args.url)
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


def _prune_by_policy(args: argparse.Namespace, out: Output, policy: Retention) -> int:
    """`prune` with lifecycle options: a sweep pass with `policy`, over the store or the named
    threads (its dry run first, for the counts the table shows)."""
    if bool(args.threads) == bool(args.all):
        raise CliError("--idle-for, --older-than and --keep need the threads: name them, or "
                       "give --all (not both)", USAGE)
    paused = True if args.include_paused else None
    named = args.threads or None
    with open_saver(args.url, write=not args.dry_run, create=False, **serde_options(args)) as saver:
        saver.retention = policy
        report = saver.sweep(dry_run=True, delete_paused=paused, threads=named)
        stored = {t: size_totals(saver.sizes(t))["checkpoints"]
                  for t in [*report.deleted, *report.trimmed, *report.paused]}
        if not args.dry_run and not report.locked_out:
            report = saver.sweep(delete_paused=paused, threads=named)
    if report.locked_out:
        raise CliError(f"{report} (retry when it is done)", BUSY)
    rows = []
    for row in sweep_rows(report, stored):
        status = row["status"]
        if status in ("deleted", "cut"):
            status = "removed"
        elif status.startswith("would"):
            status = "would remove"
        elif status.startswith("kept"):
            status = "skipped: awaiting human"
        removed = row["removed"] or 0
        kept = max(0, stored.get(row["thread_id"], removed) - removed)
        rows.append({"thread_id": row["thread_id"], "status": status, "removed": removed,
                     "kept": kept})
    out.table(rows, ["thread_id", "status", "removed", "kept"])
    if not out.json_mode:
        changed = [r for r in rows if r["removed"]]
        verb = "would remove" if args.dry_run else "removed"
        text = (f"{verb} {sum(r['removed'] for r in changed)} checkpoint(s) of {len(changed)} "
                f"thread(s), of {report.examined} examined")
        if report.paused:
            text += (f"; {len(report.paused)} thread(s) awaiting a human skipped "
                     "(--include-paused prunes them)")
        if report.pinned:
            text += f"; {report.pinned} pinned thread(s) left alone"
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
        threads = threads_of(saver, args.threads, False, args.url) if args.threads else None
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
    """`report` with the ids its summary shows raw escaped (see `printable_diff`)."""
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
        "holds no audit trail. With $LGCKPT_AUDIT_KEYS set ('id:base64key,...', the audit "
        "keys the writers seal with), each keyed seal is checked under its key id, and a "
        "checkpoint sealed without a key, or under a key id not given, fails too.",
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
        status = f"failed ({report.status}): {len(report.problems)} problem(s)"
    return {
        "thread_id": report.thread_id,
        "checked": report.checked,
        "status": status,
        "ok": report.ok,
        "audited": not unaudited,
        "keyed": report.keyed,
        "key_ids": report.key_ids,
        "problems": [
            {"kind": p.kind, "checkpoint_ns": p.checkpoint_ns, "checkpoint_id": p.checkpoint_id,
             "detail": p.detail}
            for p in report.problems
        ],
    }


def run_verify(args: argparse.Namespace, out: Output) -> int:
    reports = []
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        threads = threads_of(saver, args.threads, args.all, args.url)
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
    """`report` with what its text shows raw escaped (see `printable_diff`)."""
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
                "lgckpt stats t-1 --json\n"
                "lgckpt stats --store",
    )
    p.add_argument("thread", metavar="THREAD", nargs="?", help="one thread, in detail")
    p.add_argument("--store", action="store_true",
                   help="the store as a whole: threads, rows and bytes by kind, the deletions "
                        "and migrations it recorded, whether it is audited (the figures its "
                        "OpenTelemetry metrics count as they happen)")
    add_paging(p, 100)
    p.set_defaults(run=run_stats)


def run_stats(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=False, **serde_options(args)) as saver:
        if args.store:
            if args.thread is not None:
                raise CliError("--store is the whole store: name no thread with it", USAGE)
            return _store_stats(saver, out)
        if args.thread is not None:
            return _thread_stats(saver, args.thread, out)
        page, more = page_of(saver.thread_ids(), args.after, args.limit)
        rows: list[dict[str, Any]] = []
        with out.progress(len(page), "reading sizes") as bar:
            for thread_id in page:
                totals = size_totals(saver.sizes(thread_id))
                if totals["checkpoints"]:
                    rows.append({"thread_id": thread_id, **totals})
                bar.update()
    out.table(rows, ["thread_id", "checkpoints", "blobs", "writes", "bytes"])
    if not out.json_mode and rows:
        out.line(f"total: {human_bytes(sum(r['bytes'] for r in rows))} in {len(rows)} "
                 "thread(s)")
    say_more(out, more, page)
    return OK


def _store_stats(saver: Checkpointer, out: Output) -> int:
    threads = saver.thread_ids()
    rows: dict[str, int] = {}
    size: dict[str, int] = {}
    with out.progress(len(threads), "reading sizes") as bar:
        for thread_id in threads:
            for s in saver.sizes(thread_id):
                rows[s.kind] = rows.get(s.kind, 0) + s.rows
                size[s.kind] = size.get(s.kind, 0) + s.bytes
            bar.update()
    events = saver.lifecycle_log()
    migrations = saver.migration_log()
    figures: list[tuple[str, Any]] = [("threads", len(threads))]
    for kind, noun in (("checkpoint", "checkpoints"), ("blob", "channel values (blobs)"),
                       ("write", "pending writes")):
        figures += [(noun, rows.get(kind, 0)), (f"{noun}: bytes", size.get(kind, 0))]
    figures.append(("bytes", sum(size.values())))
    for action, noun in (("expire", "threads expired by sweeps"),
                         ("trim", "histories trimmed"), ("erase", "threads erased")):
        done = [e for e in events if e.action == action]
        figures += [(noun, len(done)),
                    (f"{noun}: checkpoints deleted", sum(e.checkpoints for e in done))]
    if events:
        figures.append(("last deletion recorded", _iso(max(e.at for e in events))))
    figures.append(("checkpoints migrated", len(migrations)))
    if migrations:
        figures.append(("last migration", _iso(max(m.migrated_at for m in migrations))))
    figures.append(("audited", saver.audit_status().enabled))
    if out.json_mode:
        out.table([{"figure": k, "value": v} for k, v in figures], ["figure", "value"])
    else:
        out.table([{"figure": k, "value": human_bytes(v) if k.endswith("bytes") else v}
                   for k, v in figures], ["figure", "value"])
    return OK


def _thread_stats(saver: Checkpointer, thread_id: str, out: Output) -> int:
    sizes = saver.sizes(thread_id)
    if not sizes:
        raise not_found(thread_id)
    order = {"checkpoint": 0, "blob": 1, "write": 2}
    sizes.sort(key=lambda s: (s.checkpoint_ns, order.get(s.kind, 3), -s.bytes, s.channel))
    rows = [{"checkpoint_ns": s.checkpoint_ns, "kind": s.kind, "channel": s.channel,
             "rows": s.rows, "bytes": s.bytes} for s in sizes]
    out.table(rows, ["checkpoint_ns", "kind", "channel", "rows", "bytes"])
    if not out.json_mode:
        out.line(f"total: {human_bytes(sum(s.bytes for s in sizes))} in "
                 f"{sum(s.rows for s in sizes)} row(s)")
    return OK
