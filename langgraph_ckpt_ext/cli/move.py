"""The commands that move threads: `copy` between two of our stores, `import` from a database
of LangGraph's official savers or from a JSON Lines export, `export` to JSON Lines.

Each is a call of `langgraph_ckpt_ext.transfer`. What can refuse a command is checked before
the target is opened for writing: the source can be read, the threads named are there, the
file is well formed; conflicts with the target are found before the first write.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from typing import IO, TYPE_CHECKING, Any

from ..core.errors import (
    CheckpointNotFoundError,
    InvalidConfigError,
    MissingDependencyError,
    ThreadExistsError,
)
from ..transfer import (
    CopyReport,
    ExportReport,
    copy_threads,
    export_header,
    export_threads,
    named_threads,
    open_jsonl,
    open_official,
    thread_ids,
)
from .common import (
    ERROR,
    OK,
    UNAVAILABLE,
    USAGE,
    VERIFY_FAILED,
    CliError,
    add_command,
    add_strict,
    env_encryption,
    open_saver,
    serde_options,
    shown_url,
)
from .damage import DAMAGE, DamageLog, SkipDamaged
from .output import Output

if TYPE_CHECKING:
    from langgraph.checkpoint.base import BaseCheckpointSaver
    from langgraph.checkpoint.serde.base import SerializerProtocol


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    for add in (_copy, _import, _export):
        add(sub)


# -- shared -----------------------------------------------------------------------------------


def _positive(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if n < 1:
        raise argparse.ArgumentTypeError("must be 1 or more")
    return n


def _copy_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("threads", metavar="THREAD", nargs="*",
                   help="the threads to copy (default: every thread, forks included)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace threads the target holds with other content (default: refuse "
                        "them, before writing anything)")
    p.add_argument("--concurrency", type=_positive, default=8, metavar="N",
                   help="threads copied at once (default: 8)")
    p.add_argument("--allow-type", action="append", default=[], metavar="MODULE.NAME",
                   help="a class of your state the source's values may construct (repeat "
                        "for more); others are refused in a file, read as plain data "
                        "elsewhere")
    add_strict(p)


def _serde(allowed: Sequence[str], given: SerializerProtocol | None
           ) -> SerializerProtocol | None:
    """The serializer the source is read with: `--serde`'s (None: the default), allowing the
    classes `--allow-type` names (our strict one when no `--serde`)."""
    if not allowed:
        return given
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from ..core.saver import strict_serde

    pairs = []
    for spec in allowed:
        module, _, name = spec.rpartition(".")
        if not module or not name:
            raise CliError(f"--allow-type {spec!r}: give MODULE.NAME, e.g. myapp.state.Plan",
                           USAGE)
        pairs.append((module, name))
    serde = strict_serde() if given is None else given
    if not isinstance(serde, JsonPlusSerializer):
        raise CliError("--allow-type works with LangGraph's serializer: allow the types in "
                       "your --serde instead", USAGE)
    return serde.with_msgpack_allowlist(pairs)


def _healthy(source: BaseCheckpointSaver[Any], names: Sequence[str], where: str,
             damage: DamageLog) -> list[str]:
    """The threads named (each checked to be in the source) or, with none named, every one;
    a named thread found damaged meanwhile is reported and left out."""
    if not names:
        return thread_ids(source)
    hint = " (`lgckpt threads` lists a store's), or name none to copy every thread"
    kept = []
    for name in dict.fromkeys(names):
        try:
            kept += named_threads(source, [name], where, hint)
        except DAMAGE as exc:
            damage.record(str(name), exc)
    return kept


def _run_copy(out: Output, source: SkipDamaged, target: BaseCheckpointSaver[Any],
              args: argparse.Namespace) -> CopyReport:
    with out.progress(None, "copying threads") as bar:

        def step(done: int, total: int) -> None:
            bar.total = total
            bar.update(done - bar.done)

        return copy_threads(source, target, None, overwrite=args.overwrite,
                            concurrency=args.concurrency, progress=step)


def _copy_past_damage(out: Output, source: SkipDamaged, target: BaseCheckpointSaver[Any],
                      args: argparse.Namespace, damage: DamageLog) -> CopyReport:
    try:
        return _run_copy(out, source, target, args)
    except ThreadExistsError:
        if not damage.found:
            raise
        # A damaged thread the target holds read as empty, so as differing from it; that
        # is found before anything is written. The source now lists it no more: again.
        return _run_copy(out, source, target, args)


def _report(out: Output, report: CopyReport, damage: DamageLog) -> int:
    if report.blocked_types:
        out.warn(
            f"values of {', '.join(report.blocked_types)} were read as plain data (their "
            f"classes are not allowed): pass --allow-type {report.blocked_types[0]} to keep "
            "them, with --overwrite"
        )
    if out.json_mode:
        out.json({**dataclasses.asdict(report), "ok": report.ok,
                  "threads_per_second": round(report.threads_per_second, 1),
                  "damaged": damage.as_json()})
    else:
        out.line(report.summary())
    if not report.ok:
        tid, why = report.failed[0]
        out.error(
            f"{len(report.failed)} threads read back different from the source (first: {tid!r}: "
            f"{why}): run the command again with --overwrite to copy them whole"
        )
        return damage.finish(VERIFY_FAILED)
    return damage.finish(OK)


# -- copy -------------------------------------------------------------------------------------


def _copy(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "copy", help="copy threads to another store (resumable, verified)",
        description="Copy threads from the store --url names to the one --to names: every "
        "checkpoint of every namespace, pending writes, forks (threads of their own). Each "
        "thread is written in one transaction (a very long one in several, oldest first); run "
        "it again after an interruption and it resumes (threads already copied are skipped, "
        "one cut short is completed). A thread the target holds with other content "
        "is refused before anything is written, unless --overwrite. At the end every thread "
        "copied is read back and compared with the source (exit 6 if one differs). A thread "
        "of the source that cannot be decoded is reported and skipped (exit 8 at the end).",
        example="lgckpt copy --url sqlite:///agent.db --to 'postgresql://db/app?schema=agents'\n"
                "lgckpt copy --url redis://old:6379/0 --to redis://new:6379/0 t-1 t-2 "
                "--overwrite",
    )
    p.add_argument("--to", metavar="URL", required=True,
                   help="the store to copy into (set up if need be), same forms as --url")
    _copy_options(p)
    p.set_defaults(run=run_copy)


def run_copy(args: argparse.Namespace, out: Output) -> int:
    serde = _serde(args.allow_type, args.serde)
    with open_saver(args.url, write=False, **serde_options(args, serde)) as source:
        return _copy_into(out, args, source, shown_url(args.url or ""), args.to)


def _copy_into(out: Output, args: argparse.Namespace, source: BaseCheckpointSaver[Any],
               where: str, to: str | None) -> int:
    """`copy` and `import` once their source is open: the threads checked in it before the
    target is opened (set up if need be, written with `--serde` too), then copied."""
    damage = DamageLog(out, args.strict)
    threads = SkipDamaged(source, _healthy(source, args.threads, where, damage), damage)
    with open_saver(to, write=True, **serde_options(args)) as target:
        return _report(out, _copy_past_damage(out, threads, target, args, damage), damage)


# -- import -----------------------------------------------------------------------------------


def _import(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "import", help="import threads from LangGraph's own savers or a JSON Lines export",
        description="Import threads into the store --url names: from a database written by "
        "LangGraph's official SqliteSaver or PostgresSaver (opened read-only: nothing there "
        "changes), or from a file `lgckpt export` wrote (checked whole before anything is "
        "written; values may construct only allowed classes). Resumable and verified as "
        "`copy` is.",
        example="lgckpt import --from-official sqlite:///langgraph.db --url sqlite:///agent.db\n"
                "lgckpt import --from-official 'postgresql://db/app?options=-c%20search_path%3D"
                "lg' --url redis://localhost:6379/0\n"
                "lgckpt import --jsonl threads.jsonl --url sqlite:///agent.db",
    )
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from-official", metavar="URL",
                     help="a SqliteSaver database (sqlite:///path.db) or a PostgresSaver one "
                          "(postgresql://...; a schema as ?options=-c%%20search_path%%3DNAME)")
    src.add_argument("--jsonl", metavar="FILE", help="an export file ('-': standard input)")
    _copy_options(p)
    p.set_defaults(run=run_import)


@contextlib.contextmanager
def _source(args: argparse.Namespace, serde: SerializerProtocol | None
            ) -> Iterator[tuple[BaseCheckpointSaver[Any], str]]:
    """The saver `--from-official` or `--jsonl` names, and how to name it in a message."""
    if args.from_official is not None:
        url = args.from_official
        try:
            with open_official(url, serde=serde) as saver:
                yield saver, shown_url(url)
        except MissingDependencyError as exc:
            raise CliError(str(exc), ERROR) from exc
        except InvalidConfigError as exc:
            raise CliError(str(exc), UNAVAILABLE) from exc
        return
    path = args.jsonl
    if path != "-" and not os.path.isfile(path):
        raise CliError(f"cannot read {path!r}: no such file", UNAVAILABLE)
    encryption = env_encryption("read" if args.plaintext_read else "refuse")
    with open_jsonl(sys.stdin if path == "-" else path, serde=serde,
                    encryption=encryption) as saver:
        yield saver, ("standard input" if path == "-" else repr(path))


def run_import(args: argparse.Namespace, out: Output) -> int:
    serde = _serde(args.allow_type, args.serde)
    with _source(args, serde) as (source, where):
        return _copy_into(out, args, source, where, args.url)


# -- export -----------------------------------------------------------------------------------


def _export(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "export", help="write threads as JSON Lines (to stdout or a file)",
        description="Write threads (all, or those named) as JSON Lines: a header line, one "
        "line per checkpoint (its values, metadata and pending writes, serialized as the "
        "store does and base64-encoded), each thread's together and oldest first, and an end "
        "line. `lgckpt import --jsonl` reads it back. A file is written under a temporary "
        "name and renamed when complete. An encrypted store (keys in $LGCKPT_KEYS) is exported "
        "encrypted, its values as stored, each bound to its row (importing it needs the "
        "keys), unless --plaintext.",
        example="lgckpt export --url sqlite:///agent.db -o threads.jsonl\n"
                "lgckpt export --url redis://localhost:6379/0 t-1 | gzip > t-1.jsonl.gz",
    )
    p.add_argument("threads", metavar="THREAD", nargs="*",
                   help="the threads to export (default: every thread)")
    p.add_argument("-o", "--output", metavar="FILE", default="-",
                   help="the file to write ('-', the default: standard output)")
    p.add_argument("--plaintext", action="store_true",
                   help="export an encrypted store's values decrypted (default: as stored, "
                        "encrypted)")
    add_strict(p)
    p.set_defaults(run=run_export)


def run_export(args: argparse.Namespace, out: Output) -> int:
    damage = DamageLog(out, args.strict)
    with open_saver(args.url, write=False, **serde_options(args)) as source:
        threads = _healthy(source, args.threads, shown_url(args.url or ""), damage)
        with out.progress(len(threads), "exporting threads") as bar:

            def step(done: int, total: int) -> None:
                bar.update(done - bar.done)

            if args.output == "-":
                report = _write_export(source, out.stdout, threads, damage, step,
                                       args.plaintext)
            else:
                part = f"{args.output}.part"
                try:
                    with open(part, "w", encoding="utf-8") as fh:
                        report = _write_export(source, fh, threads, damage, step,
                                               args.plaintext)
                    os.replace(part, args.output)
                except OSError as exc:
                    raise CliError(f"cannot write {args.output!r}: {exc.strerror or exc}",
                                   ERROR) from exc
                finally:
                    with contextlib.suppress(FileNotFoundError):
                        os.remove(part)
    where = "standard output" if args.output == "-" else repr(args.output)
    text = (f"{report.threads} threads ({report.checkpoints} checkpoints, {report.writes} "
            f"writes) exported to {where} in {report.seconds:.2f} s")
    if out.json_mode and args.output != "-":
        out.json({**dataclasses.asdict(report), "damaged": damage.as_json()})
    elif args.output == "-":
        out.note(text)  # stdout holds the export
    else:
        out.line(text)
    return damage.finish(OK)


def _export_one(source: BaseCheckpointSaver[Any], thread_id: str, damage: DamageLog,
                sealed: bool) -> tuple[io.StringIO, ExportReport | None]:
    one = io.StringIO()
    if not sealed:
        return one, export_threads(SkipDamaged(source, [thread_id], damage), one,
                                   plaintext=True)
    try:  # its rows as stored: a damaged one is met here, before a line is kept
        return one, export_threads(source, one, [thread_id])
    except DAMAGE as exc:
        damage.record(thread_id, exc)
    except CheckpointNotFoundError:  # deleted since it was listed
        pass
    return one, None


def _write_export(source: BaseCheckpointSaver[Any], fh: IO[str], threads: list[str],
                  damage: DamageLog, progress: Callable[[int, int], None],
                  plaintext: bool = False) -> ExportReport:
    """`export_threads`, a thread at a time, so that a damaged one is left out whole and the
    end line counts the threads written (`import --jsonl` checks it)."""
    started = time.monotonic()
    sealed = not plaintext and getattr(source, "encryption", None) is not None
    fh.write(json.dumps(export_header(len(threads), sealed)) + "\n")
    written = checkpoints = writes = 0
    for n, thread_id in enumerate(threads, 1):
        one, report = _export_one(source, thread_id, damage, sealed)
        if report is not None and report.checkpoints:  # none: damaged, or deleted
            lines = one.getvalue().split("\n")  # its header, checkpoint lines, end line, ""
            fh.write("".join(f"{line}\n" for line in lines[1:-2]))
            written, checkpoints = written + 1, checkpoints + report.checkpoints
            writes += report.writes
        progress(n, len(threads))
    fh.write(json.dumps({"end": True, "threads": written, "checkpoints": checkpoints}) + "\n")
    fh.flush()
    return ExportReport(written, checkpoints, writes, time.monotonic() - started)
