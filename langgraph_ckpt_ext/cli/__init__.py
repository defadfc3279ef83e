"""`lgckpt`: the operator's command line, a thin client of the public API.

    lgckpt --url sqlite:///agent.db threads
    lgckpt history t-1 --limit 5
    lgckpt verify --all --json

Each command lives in a module with `register(sub)`, which adds its parsers and sets
`run=handler`; a handler is `handler(args, out) -> exit code`. `main` turns the errors users
can meet into one line on stderr and an exit code (see `common`).

May import: every other package (a top layer), and the top-level package for its version.
Layers, bottom to top: core -> state, migrations, timetravel -> backends -> connecting,
transfer -> strategies -> cli and the top-level package (`tests/core/test_layering.py`).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import traceback
from types import ModuleType

from ..core.urls import mask
from .common import (
    ENV_URL,
    ERROR,
    OK,
    USAGE,
    CliError,
    add_common_options,
    exit_code,
    load_serde,
    url_secrets,
)
from .output import Output, printable

__all__ = ["CliError", "Output", "main"]

_DESCRIPTION = """\
Inspect and operate the checkpoint stores of langgraph-ckpt-ext: list threads and their
history, show and diff checkpoints, fork, prune, migrate state schemas, verify audit trails
(and turn a store's auditing on or off), sweep by a retention policy, erase by metadata, pin
threads, vacuum, copy threads between stores, import them from LangGraph's own savers, export
them.

A store written with a serializer of your own is read with --serde MODULE:OBJECT (an object
with dumps_typed and loads_typed, or a class or factory that makes one). Store-wide commands
(threads, history, copy, import, export) report a thread that cannot be decoded, go on with
the others and exit with 8; --strict stops at the first. Passwords in URLs are never printed;
percent-encode '#', '/', '?' and '@' in them (%23, %2F, %3F, %40).

exit codes: 0 ok, 1 error, 2 usage, 3 thread or checkpoint not found, 4 conflict (target
exists), 5 store unavailable (unreachable server, wrong URL, no store there), 6 verification
failed, 7 busy (a thread was being written the whole time, or another sweeper holds the
store's sweep lock: retry), 8 finished past damaged threads (each reported on stderr)"""


def _command_modules() -> list[ModuleType]:
    from . import audit, browse, keys, lifecycle, maintain, move

    return [browse, maintain, lifecycle, move, audit, keys]


def build_parser() -> argparse.ArgumentParser:
    """The `lgckpt` parser with every command registered."""
    from .. import __version__

    parser = argparse.ArgumentParser(
        prog="lgckpt", description=_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  export LGCKPT_URL=sqlite:///agent.db\n  lgckpt threads\n"
               "  lgckpt show t-1\n\nlgckpt COMMAND --help tells more about each command.",
    )
    parser.add_argument("--version", action="version", version=f"lgckpt {__version__}")
    add_common_options(parser, top=True)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in _command_modules():
        module.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run `lgckpt` with `argv` (default: the process's arguments); the exit code."""
    argv = sys.argv[1:] if argv is None else argv
    secrets = [s for arg in [*argv, os.environ.get(ENV_URL) or ""] if "://" in arg
               for s in url_secrets(arg)]
    args, code = _parse(argv, secrets)
    if args is None:
        return code
    out = Output(args.json, False if args.no_color else None)
    out.hide(secrets)
    try:
        if getattr(args, "serde", None):
            args.serde = load_serde(args.serde, getattr(args, "path", None))
        result: int = args.run(args, out)
        return result
    except KeyboardInterrupt:
        out.error("interrupted")
        return 130
    except BrokenPipeError:  # `lgckpt threads | head`: the reader has gone
        _silence_stdout()
        return ERROR
    except Exception as exc:
        code_for = exit_code(exc)
        if code_for is not None:
            out.error(str(exc))
            return code_for
        if os.environ.get("LGCKPT_DEBUG"):
            for line in traceback.format_exc().splitlines():
                out.note(line)
        out.error(f"unexpected {type(exc).__name__}: {exc} (set LGCKPT_DEBUG=1 to see the "
                  "traceback, and please report it)")
        return ERROR


def _parse(argv: list[str], secrets: list[str]) -> tuple[argparse.Namespace | None, int]:
    """The parsed arguments, or None and the exit code (after --help, --version, or a usage
    error, whose message may quote an argument: printed without passwords or control
    characters)."""
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            return build_parser().parse_args(argv), OK
    except SystemExit as exc:
        return None, exc.code if isinstance(exc.code, int) else (
            OK if exc.code is None else USAGE)
    finally:
        text = mask(said.getvalue(), secrets)
        sys.stderr.write("".join(f"{printable(line)}\n" for line in text.splitlines()))


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that flushing it at exit raises nothing more."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):
        pass
