"""The data-lifecycle commands: `sweep` (one pass of a retention policy), `erase` (every thread
whose metadata matches), `vacuum`, `pin` and `unpin`. Each is a call or two of the
checkpointer's lifecycle methods (`sweep`, `erase`, `vacuum`, `pin`, `unpin`); the policy is a
`Retention` built from the options, never decided here.

Everything a command can refuse (a duration, a date, a `--where`) is refused before the store is
opened."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import re
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..core.errors import InvalidConfigError
from ..core.lifecycle import check_where
from ..core.retention import Retention, thread_digest
from .common import BUSY, OK, USAGE, CliError, add_command, open_saver, serde_options
from .output import Output, human_bytes
from .selection import positive, size_totals

if TYPE_CHECKING:
    from ..backends.checkpointer import Checkpointer
    from ..core.retention import SweepReport


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for add in (_sweep, _erase, _vacuum, _pin):
        add(sub)


# -- durations and dates ---------------------------------------------------------------------------

_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_DURATION = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")
DURATION_HELP = "a duration: a number and a unit, s m h d or w (90s, 30m, 12h, 7d, 1d12h)"


def duration(text: str) -> float:
    """Seconds from `90s`, `30m`, `12h`, `7d`, `2w` or a sum of them (`1d12h`)."""
    spec = text.strip().lower()
    parts = _DURATION.findall(spec)
    if not parts or "".join(n + u for n, u in parts) != spec:
        raise argparse.ArgumentTypeError(f"{text!r} is not {DURATION_HELP}")
    seconds = sum(float(n) * _UNITS[u] for n, u in parts)
    if seconds <= 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the duration must be more than 0")
    return seconds


def instant(text: str, now: Callable[[], float] = time.time) -> float:
    """Epoch seconds from a date or time (ISO 8601, UTC unless it says otherwise) or a
    duration ago (`7d`: seven days before now)."""
    try:
        return now() - duration(text)
    except argparse.ArgumentTypeError:
        pass
    try:
        older = Retention(older_than=text.strip()).older_than
    except InvalidConfigError:
        raise argparse.ArgumentTypeError(
            f"{text!r} is neither a date (2026-11-01, 2026-11-01T08:00:00+01:00) nor "
            f"{DURATION_HELP}") from None
    assert isinstance(older, float)
    return older


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds")


def add_rules(p: argparse.ArgumentParser, *, absolute: bool) -> None:
    """The options a `Retention` is built from: `--idle-for`, `--older-than`, `--keep` (and
    `--absolute`)."""
    p.add_argument("--idle-for", type=duration, metavar="D",
                   help="threads not written for D expire (e.g. 30d)")
    if absolute:
        p.add_argument("--absolute", type=duration, metavar="D",
                       help="threads first written more than D ago expire")
    p.add_argument("--older-than", type=instant, metavar="DATE|D",
                   help="threads not written since DATE (ISO 8601, UTC unless it says) or for "
                        "D expire")
    p.add_argument("--keep", type=positive, metavar="N",
                   help="cut every thread's history to its newest N checkpoints per namespace "
                        "(plus what their delta channels need)")


def policy_of(args: argparse.Namespace, strategy: str, delete_paused: bool) -> Retention | None:
    """The `Retention` the options give (None: no rule given)."""
    rules = {"idle": args.idle_for, "absolute": getattr(args, "absolute", None),
             "older_than": args.older_than, "keep": args.keep}
    if all(v is None for v in rules.values()):
        return None
    return Retention(**rules, strategy=strategy, delete_paused=delete_paused)


def report_dict(report: SweepReport, policy: Retention) -> dict[str, Any]:
    return {
        "at": _iso(report.at), "dry_run": report.dry_run, "locked_out": report.locked_out,
        "examined": report.examined, "deleted": report.deleted, "trimmed": report.trimmed,
        "checkpoints_deleted": report.checkpoints_deleted, "paused": report.paused,
        "pinned": report.pinned, "busy": report.busy, "more": report.more,
        "policy": json.loads(policy.to_json()),
    }


def sweep_rows(report: SweepReport, counts: dict[str, int] | None = None
               ) -> list[dict[str, Any]]:
    """A row per thread the pass changed (would change) or kept: thread id, status, the
    checkpoints removed (`counts`: those of deleted threads, when known)."""
    dry = report.dry_run
    rows: list[dict[str, Any]] = []
    for tid in report.deleted:
        rows.append({"thread_id": tid, "status": "would delete" if dry else "deleted",
                     "removed": (counts or {}).get(tid)})
    for tid, n in report.trimmed.items():
        rows.append({"thread_id": tid, "status": "would cut" if dry else "cut", "removed": n})
    rows += [{"thread_id": t, "status": "kept: awaiting human", "removed": 0}
             for t in report.paused]
    rows += [{"thread_id": t, "status": "skipped: being written", "removed": 0}
             for t in report.busy]
    return sorted(rows, key=lambda r: r["thread_id"])


def _locked_out(report: SweepReport) -> CliError:
    return CliError(f"{report} (retry when it is done)", BUSY)


# -- sweep -----------------------------------------------------------------------------------------


def _sweep(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "sweep", help="one pass of a retention policy: expire idle or old threads",
        description="Apply a retention policy once to every thread of the store: a thread "
        "expires when it was not written for --idle-for, was first written more than "
        "--absolute ago, or was not written since --older-than; expiring deletes it "
        "(--strategy delete) or cuts it to each namespace's newest checkpoint "
        "(keep_latest). --keep N caps every thread's history. Pinned threads (lgckpt pin) "
        "are left alone, and so are threads paused at an interrupt() unless --delete-paused; "
        "a thread with a retention policy of its own follows it. Safe beside running graphs "
        "(a thread written meanwhile is skipped) and other sweepers (exit 7 when another "
        "holds the store's sweep lock). --dry-run lists what would go and changes nothing.",
        example="lgckpt sweep --idle-for 30d --dry-run\n"
                "lgckpt sweep --older-than 2026-01-01 --strategy keep_latest --limit 1000\n"
                "lgckpt sweep --keep 20 --json",
    )
    add_rules(p, absolute=True)
    p.add_argument("--strategy", choices=("delete", "keep_latest"), default="delete",
                   help="what expiring does (default: delete)")
    p.add_argument("--limit", type=positive, metavar="N",
                   help="change at most N threads (run again to go on)")
    p.add_argument("--delete-paused", action="store_true",
                   help="expire threads paused at an interrupt() too")
    p.add_argument("--dry-run", action="store_true",
                   help="list what would be deleted or cut, change nothing")
    p.set_defaults(run=run_sweep)


def run_sweep(args: argparse.Namespace, out: Output) -> int:
    policy = policy_of(args, args.strategy, args.delete_paused)
    if policy is None:
        raise CliError("sweep needs a rule: --idle-for D, --absolute D, --older-than DATE|D "
                       "or --keep N", USAGE)
    with open_saver(args.url, write=not args.dry_run, create=False,
                    **serde_options(args)) as saver:
        saver.retention = policy
        report = saver.sweep(args.limit, dry_run=args.dry_run,
                             delete_paused=True if args.delete_paused else None)
        counts = _counts(saver, report.deleted) if args.dry_run else None
    if report.locked_out:
        raise _locked_out(report)
    if out.json_mode:
        out.json(report_dict(report, policy))
        return OK
    if args.dry_run:
        out.table(sweep_rows(report, counts), ["thread_id", "status", "removed"])
    out.line(str(report) + ("; nothing changed (dry run)" if args.dry_run else ""))
    return OK


def _counts(saver: Checkpointer, threads: list[str]) -> dict[str, int]:
    return {t: size_totals(saver.sizes(t))["checkpoints"] for t in threads}


# -- erase -----------------------------------------------------------------------------------------


def where_item(text: str) -> tuple[str, Any]:
    """`KEY=VALUE` (VALUE a string) or `KEY:=JSON` (a typed value: 42, true, "x")."""
    key, sep, value = text.partition("=")
    if not sep:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write KEY=VALUE (or KEY:=JSON for a number, true, false)")
    typed = key.endswith(":")
    key = key[:-1] if typed else key
    if not key.strip():
        raise argparse.ArgumentTypeError(f"{text!r}: the metadata key is empty")
    if not typed:
        return key, value
    try:
        parsed = json.loads(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{key}:= takes a JSON value (42, true, \"text\"), not {value!r}") from None
    return key, parsed


def where_filter(items: list[tuple[str, Any]] | None) -> dict[str, Any]:
    """The erasure filter of the `--where` items, checked as `erase` checks it."""
    if not items:
        raise CliError("erase needs --where KEY=VALUE (repeatable; every one must match)", USAGE)
    flt: dict[str, Any] = {}
    for key, value in items:
        if key in flt:
            raise CliError(f"--where names the key {key!r} twice", USAGE)
        flt[key] = value
    try:
        return check_where(flt)
    except InvalidConfigError as exc:
        raise CliError(str(exc), USAGE) from None


def _erase(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "erase", help="delete every thread whose metadata matches (right to erasure)",
        description="Delete every thread one of whose checkpoints' metadata matches all the "
        "--where items, in every namespace, with its pending writes, and every fork made of "
        "it. The store records the erasure (when, how many checkpoints, the threads' digests "
        "and --reason; never the values matched). --dry-run lists the threads. A real erase "
        "asks for confirmation on a terminal; --yes skips the question, and is needed when "
        "stdin is not a terminal. The values matched are never printed.",
        example="lgckpt erase --where user_id=u-42 --dry-run\n"
                "lgckpt erase --where user_id=u-42 --reason 'GDPR request 2026-118' --yes\n"
                "lgckpt erase --where tenant=acme --where 'attempt:=3' --yes --json",
    )
    p.add_argument("--where", type=where_item, action="append", metavar="KEY=VALUE",
                   help="a metadata item to match (repeatable: all must match); KEY:=JSON for "
                        "a typed value")
    p.add_argument("--reason", default="", help="why (recorded with the erasure)")
    p.add_argument("--dry-run", action="store_true", help="list the threads, delete nothing")
    p.add_argument("--yes", action="store_true", help="erase without asking")
    p.set_defaults(run=run_erase)


def _confirm(question: str) -> bool:
    sys.stderr.write(f"{question} [y/N] ")
    sys.stderr.flush()
    answer = sys.stdin.readline().strip().lower()
    return answer in ("y", "yes")


def run_erase(args: argparse.Namespace, out: Output) -> int:
    flt = where_filter(args.where)
    ask = not args.dry_run and not args.yes
    if ask and not sys.stdin.isatty():
        raise CliError("erase deletes for good: pass --yes to erase without a terminal to "
                       "confirm on (or --dry-run to see what would go)", USAGE)
    with open_saver(args.url, write=not args.dry_run, create=False,
                    **serde_options(args)) as saver:
        if ask:
            plan = saver.erase(flt, dry_run=True)
            if not plan.threads:
                out.line(str(plan))
                return OK
            if not _confirm(f"erase {len(plan.threads)} thread(s), {plan.checkpoints} "
                            "checkpoint(s), for good?"):
                raise CliError("erase cancelled: nothing deleted")
        report = saver.erase(flt, dry_run=args.dry_run, reason=args.reason)
    result: dict[str, Any] = {"at": _iso(report.at), "where": report.where,
                              "dry_run": report.dry_run, "checkpoints": report.checkpoints}
    if report.dry_run:
        result["threads"] = report.threads
    else:  # what is printed may be kept in logs: the erased ids as the store records them
        result["threads"] = len(report.threads)
        result["thread_digests"] = [thread_digest(t) for t in report.threads]
        result["reason"] = args.reason
    if out.json_mode:
        out.json(result)
        return OK
    if report.dry_run:
        out.table([{"thread_id": t} for t in report.threads], ["thread_id"])
    out.line(str(report) + ("; nothing changed (dry run)" if report.dry_run else ""))
    return OK


# -- vacuum ----------------------------------------------------------------------------------------


def _vacuum(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "vacuum", help="give the space of deleted rows back to the file system",
        description="After a sweep, an erase or a prune: SQLite runs an incremental vacuum, "
        "PostgreSQL a VACUUM of the checkpoint tables; Redis frees memory as keys go, so there "
        "is nothing to do. Prints the storage's size before and after (where it can tell).",
        example="lgckpt vacuum\nlgckpt vacuum --json",
    )
    p.set_defaults(run=run_vacuum)


def run_vacuum(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=True, create=False, **serde_options(args)) as saver:
        before, after = saver.vacuum()
    known = bool(before or after)
    if out.json_mode:
        out.json({"before_bytes": before if known else None,
                  "after_bytes": after if known else None,
                  "freed_bytes": max(0, before - after) if known else None})
    elif known:
        out.line(f"vacuum: {human_bytes(before)} before, {human_bytes(after)} after "
                 f"({human_bytes(max(0, before - after))} given back)")
    else:
        out.line("vacuum: nothing to do on this store (it frees space as rows go, and does "
                 "not tell its size)")
    return OK


# -- pin, unpin ------------------------------------------------------------------------------------


def _pin(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for name, text in (("pin", "exempt a thread from every retention rule and TTL"),
                       ("unpin", "give a pinned thread its retention again")):
        p = add_command(
            sub, name, help=text,
            description=f"{text[0].upper()}{text[1:]}. A thread can be pinned before its "
            "first write; unpinned, its idle time counts from its last write (or read).",
            example=f"lgckpt {name} t-1",
        )
        p.add_argument("thread", metavar="THREAD", help="the thread id")
        p.set_defaults(run=run_pin, pinned=name == "pin")


def run_pin(args: argparse.Namespace, out: Output) -> int:
    with open_saver(args.url, write=True, create=False, **serde_options(args)) as saver:
        stored = bool(saver.sizes(args.thread))
        state = saver.thread_state(args.thread)
        if args.pinned:
            saver.pin(args.thread)
        elif state is not None:  # no row, nothing to unpin (and no row made for it)
            saver.unpin(args.thread)
        state = saver.thread_state(args.thread)
    pinned = bool(state and state.pinned)
    if out.json_mode:
        out.json({"thread_id": args.thread, "pinned": pinned, "stored": stored})
        return OK
    out.line(f"thread {args.thread!r} {'pinned' if pinned else 'unpinned'}")
    if not stored and args.pinned:
        out.note(f"thread {args.thread!r} has no checkpoint yet: pinned ahead of its first "
                 "write")
    return OK
