"""What every `lgckpt` command shares: exit codes, the error type, the common options, and
opening the store a URL names (and never printing its password)."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..core.errors import (
    CheckpointerError,
    CheckpointNotFoundError,
    InvalidConfigError,
    InvalidFilterError,
    StoreBusyError,
    StoreUnavailableError,
    ThreadExistsError,
)
from ..core.urls import ambiguous_url, mask, parse_url, url_secrets
from ..core.urls import redact as shown_url

__all__ = ["ambiguous_url", "shown_url", "url_secrets"]  # used by the commands

if TYPE_CHECKING:
    from langgraph.checkpoint.serde.base import SerializerProtocol

    from ..backends.checkpointer import Checkpointer
    from ..core.keys import EnvKeys
    from ..core.sealing import Encryption

OK = 0
ERROR = 1
"""Any other failure (a server error, a state-schema chain that cannot apply, ...)."""
USAGE = 2
"""Bad arguments (argparse's own code)."""
NOT_FOUND = 3
"""The thread or checkpoint named is not stored."""
CONFLICT = 4
"""The target already exists (a fork or copy onto a thread that holds checkpoints)."""
UNAVAILABLE = 5
"""The store cannot be used: server unreachable, wrong URL, no checkpoint store there."""
VERIFY_FAILED = 6
"""A verification found a problem (audit chain, copy check)."""
BUSY = 7
"""A thread was being written the whole time a maintenance command tried (prune): retry."""
DAMAGED = 8
"""A store-wide command went on past damaged threads (each reported) and finished."""

ENV_URL = "LGCKPT_URL"
ENV_AUDIT = "LGCKPT_AUDIT"
"""The audit keys' variables: $LGCKPT_AUDIT_KEYS ("id:base64,...", the last current unless
$LGCKPT_AUDIT_KEY_CURRENT names one), as `EnvKeys(prefix="LGCKPT_AUDIT")` reads them."""
ENV_KEYS = "LGCKPT_KEYS"
"""Encryption keys, `id:base64key,...` (`EnvKeys`): every command reads and writes encrypted
stores with them (the current key: `$LGCKPT_KEY_CURRENT`, else the last)."""
URL_HELP = (
    "the checkpoint store: sqlite:///relative.db, sqlite:////abs/path.db "
    "[?busy_timeout=S&mode=ro], postgresql://user@host:5432/db[?schema=NAME], "
    f"redis://host:6379/0[?key_prefix=NAME] (default: ${ENV_URL})"
)
SERDE_HELP = (
    "the serializer the store was written with, if not the default: an object with dumps_typed "
    "and loads_typed, or a class or factory that makes one, imported from the current "
    "directory (e.g. myapp.store:SERDE); it reads and writes every store the command opens"
)


class CliError(Exception):
    """An expected failure: `main` prints `message` as one line and exits with `code`."""

    def __init__(self, message: str, code: int = ERROR) -> None:
        super().__init__(message)
        self.code = code


def exit_code(exc: BaseException) -> int | None:
    """The exit code for an expected error (None: an unexpected one)."""
    if isinstance(exc, CliError):
        return exc.code
    if isinstance(exc, ThreadExistsError):
        return CONFLICT
    if isinstance(exc, CheckpointNotFoundError):  # ThreadNotFoundError too
        return NOT_FOUND
    if isinstance(exc, StoreUnavailableError):
        return UNAVAILABLE
    if isinstance(exc, StoreBusyError):
        return BUSY
    if isinstance(exc, InvalidConfigError | InvalidFilterError):
        return USAGE
    if isinstance(exc, CheckpointerError):
        return ERROR
    return None


# -- options -----------------------------------------------------------------------------------


def add_common_options(parser: argparse.ArgumentParser, *, url: bool = True,
                       top: bool = False) -> None:
    """`--url` and `--serde` (unless `url` is False), `--json`, `--no-color`.

    They are accepted before the command (`top`: the main parser, which holds the defaults)
    and after it (a command's parser, whose options only override what was given)."""
    keep = argparse.SUPPRESS
    if url:
        parser.add_argument("--url", metavar="URL", default=os.environ.get(ENV_URL) if top
                            else keep, help=URL_HELP)
        parser.add_argument("--serde", metavar="MODULE:OBJECT", default=None if top else keep,
                            help=SERDE_HELP)
        parser.add_argument("--unsafe-allow-any-class", action="store_true",
                            default=False if top else keep,
                            help="use --serde's serializer as it is even when it is not one this "
                                 "package can make strict (LangGraph's JsonPlusSerializer, or an "
                                 "EncryptedSerializer over one): stored rows may then construct "
                                 "any class; only for a store nobody else can write to")
        parser.add_argument("--plaintext-read", action="store_true",
                            default=False if top else keep,
                            help=f"with keys in ${ENV_KEYS}: read values stored unencrypted "
                                 "too (a store being encrypted: `lgckpt rotate-keys "
                                 "--plaintext-read` encrypts them in place); default: refuse "
                                 "them")
    parser.add_argument("--json", action="store_true", default=False if top else keep,
                        help="print JSON on stdout (tables as arrays of objects)")
    parser.add_argument("--no-color", action="store_true", default=False if top else keep,
                        help="no colour (also: the NO_COLOR environment variable)")


def add_strict(parser: argparse.ArgumentParser) -> None:
    """`--strict`, for a command that reads many threads (see `damage.DamageLog`)."""
    parser.add_argument("--strict", action="store_true",
                        help="stop at the first damaged thread (exit 1) instead of reporting "
                             "it, going on, and exiting with 8 at the end")


def add_command(
    sub: argparse._SubParsersAction,  # type: ignore[type-arg]
    name: str,
    *,
    help: str,
    description: str,
    example: str,
    url: bool = True,
) -> argparse.ArgumentParser:
    """A command's parser, with the common options and an example in its `--help`."""
    parser: argparse.ArgumentParser = sub.add_parser(
        name, help=help, description=textwrap.fill(description, 88),
        epilog="example:\n" + "\n".join(f"  {line}" for line in example.strip().splitlines()),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    add_common_options(parser, url=url)
    return parser


# -- opening a store ---------------------------------------------------------------------------


def import_object(spec: str, option: str, dirs: Sequence[str], *, example: str,
                  hint: str) -> Any:
    """The object `MODULE:ATTR` names, MODULE imported with `dirs` first on the path; errors
    name `option`, show `example` and, for a module not found, say `hint`."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise CliError(f"{option} {spec!r}: write MODULE:ATTR, e.g. {example}", USAGE)
    sys.path[:0] = [os.path.abspath(d) for d in dirs]
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise CliError(f"{option}: cannot import {module_name!r} ({exc}): {hint}",
                       USAGE) from exc
    except Exception as exc:
        raise CliError(f"{option}: importing {module_name!r} failed: {type(exc).__name__}: "
                       f"{exc}") from exc
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CliError(f"{option}: {module_name!r} has no attribute {attr!r}", USAGE)
        obj = getattr(obj, part)
    return obj


def load_serde(spec: str, dirs: Sequence[str] | None = None) -> SerializerProtocol:
    """The serializer `--serde MODULE:OBJECT` names (MODULE imported from `dirs`, default the
    current directory): the object itself, or what calling it (a class, a factory) returns."""
    obj = import_object(spec, "--serde", dirs or ["."], example="myapp.store:SERDE",
                        hint="run lgckpt from the directory that holds it, or add that "
                             "directory to PYTHONPATH")
    if isinstance(obj, type) or (callable(obj) and not _is_serde(obj)):
        try:
            obj = obj()
        except Exception as exc:
            raise CliError(f"--serde: calling {spec} failed: {type(exc).__name__}: {exc}",
                           USAGE) from exc
    if not _is_serde(obj):
        raise CliError(f"--serde: {spec} gives a {type(obj).__name__}, not a serializer (an "
                       "object with dumps_typed and loads_typed)", USAGE)
    serde: SerializerProtocol = obj
    return serde


def serde_options(args: argparse.Namespace, serde: SerializerProtocol | None = None
                  ) -> dict[str, Any]:
    """`open_saver`'s serializer options from the command line (`serde`: instead of
    `--serde`'s)."""
    return {"serde": serde if serde is not None else args.serde,
            "unsafe": args.unsafe_allow_any_class,
            "plaintext": "read" if getattr(args, "plaintext_read", False) else "refuse"}


def env_keys(prefix: str) -> EnvKeys | None:
    """The keys of `$<prefix>_KEYS` (None when it is not set; a malformed one: `USAGE`)."""
    if not os.environ.get(f"{prefix}_KEYS", "").strip():
        return None
    from ..core.keys import EnvKeys

    try:
        return EnvKeys(prefix=prefix)
    except InvalidConfigError as exc:
        raise CliError(str(exc), USAGE) from None


def env_encryption(plaintext: str = "refuse") -> Encryption | None:
    """Encryption with the keys of `$LGCKPT_KEYS` (None when it is not set)."""
    keys = env_keys("LGCKPT")
    if keys is None:
        if plaintext == "read":
            raise CliError(f"--plaintext-read reads a store being encrypted: set {ENV_KEYS} "
                           "(id:base64key,...; `lgckpt new-key` makes one)", USAGE)
        return None
    from ..core.sealing import Encryption

    return Encryption(keys, plaintext=plaintext)


def _is_serde(obj: Any) -> bool:
    return all(callable(getattr(obj, m, None)) for m in ("dumps_typed", "loads_typed"))


def open_saver(url: str | None, *, write: bool, create: bool | None = None,
               serde: SerializerProtocol | None = None, unsafe: bool = False,
               plaintext: str = "refuse", **options: Any) -> Checkpointer:
    """The checkpointer for the store `url` names (close it when done: it is a context
    manager).

    A reader (`write=False`) creates and changes nothing: the tables or key layout must be
    there. A writer sets the storage up (creates or upgrades it, as the checkpointers do when
    they open); with `create=False` it too needs a store that is there already. `serde` (when
    given) and `options` go to `connect`; `unsafe`: `serde` is used as it is
    (`--unsafe-allow-any-class`). With keys in `$LGCKPT_KEYS` (and no `encryption=` in the
    URL) the store is read and written encrypted with them; `plaintext="read"`
    (`--plaintext-read`): values stored unencrypted are read too. Raises `CliError`:
    `USAGE` without a URL, `UNAVAILABLE` for a URL of no store this package can open, a
    server that cannot be reached, or no checkpoint store at that place.
    """
    if not url:
        raise CliError(f"no checkpoint store given: pass --url URL or set {ENV_URL}", USAGE)
    shown = shown_url(url)
    if serde is not None:
        options["serde"] = serde
        if unsafe:
            options["unsafe_allow_any_class"] = True
    try:
        parsed = parse_url(url)
    except InvalidConfigError as exc:
        raise CliError(str(exc), UNAVAILABLE) from None
    if "encryption" in parsed.options:
        if plaintext == "read":
            raise CliError(f"--plaintext-read takes its keys from ${ENV_KEYS}: leave "
                           "encryption= out of the URL", USAGE)
    elif "encryption" not in options:
        found = env_encryption(plaintext)
        if found is not None:
            options["encryption"] = found
    scheme = parsed.backend
    if scheme == "memory":
        raise CliError("memory:// keeps nothing between runs: point --url at a SQLite, "
                       "PostgreSQL or Redis store", UNAVAILABLE)
    create = write if create is None else create
    if "audit_keys" not in options:  # seal and verify the audit trail with these keys
        audit_keys = env_keys(ENV_AUDIT)
        if audit_keys is not None:
            options["audit_keys"] = audit_keys
    from ..connecting import connect

    if scheme == "sqlite":
        if parsed.target == ":memory:":
            raise CliError("an in-memory SQLite database keeps nothing between runs: name a "
                           "file, sqlite:///path.db", UNAVAILABLE)
        if not create:
            _check_sqlite_file(parsed.target, shown)
    try:
        saver = connect(url, setup=False, **options)
    except CheckpointerError:
        raise
    except Exception as exc:  # the driver refused the URL
        raise CliError(f"cannot open {shown}: {_reason(exc, url)}", UNAVAILABLE) from exc
    try:
        if not create and saver.storage_version() == 0:
            raise CliError(f"no checkpoint store at {shown}: {_where(scheme)}", UNAVAILABLE)
        if write:
            saver.setup()
    except BaseException as exc:
        saver.close()
        if isinstance(exc, StoreUnavailableError):
            reason = _reason(exc.__cause__ or exc, url)
            raise CliError(f"cannot reach {shown}: {reason}", UNAVAILABLE) from exc
        if isinstance(exc, CheckpointerError | CliError) or not isinstance(exc, Exception):
            raise
        raise CliError(f"cannot open {shown}: {_reason(exc, url)}", UNAVAILABLE) from exc
    return saver


def _check_sqlite_file(path: str, shown: str) -> None:
    """Refuse a file that holds no checkpoint tables, reading it read-only: opening it as the
    checkpointer does would create it, or turn on WAL mode in it."""
    import pathlib
    import sqlite3

    if not os.path.isfile(path):
        raise CliError(f"no checkpoint store at {shown}: no such file {path!r}", UNAVAILABLE)
    uri = pathlib.Path(path).absolute().as_uri() + "?mode=ro"
    try:
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as conn:
            found = conn.execute(
                "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'lgx_checkpoints'"
            ).fetchone()
    except sqlite3.Error as exc:
        raise CliError(f"cannot open {shown}: {_reason(exc)}", UNAVAILABLE) from exc
    if found is None:
        raise CliError(f"no checkpoint store at {shown}: {_where('sqlite')}", UNAVAILABLE)


def _where(scheme: str) -> str:
    if scheme == "sqlite":
        return "the file holds no checkpoint tables"
    if scheme.startswith("postgres"):
        return ("no checkpoint tables in that database and schema (name the schema with "
                "?schema=NAME)")
    return "no key layout under that key prefix (name it with ?key_prefix=NAME)"


def _reason(exc: BaseException, url: str | None = None) -> str:
    """The first line of a driver's message (without `url`'s password)."""
    text = str(exc).strip().splitlines()
    reason = f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__
    return reason if url is None else mask(reason, url_secrets(url))


def quoted_names(ids: Sequence[str], show: int = 5) -> str:
    """`'a', 'b' and 3 more`."""
    text = ", ".join(repr(t) for t in ids[:show])
    return text + (f" and {len(ids) - show} more" if len(ids) > show else "")
