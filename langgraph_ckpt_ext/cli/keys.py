"""The commands of encryption at rest: `new-key` makes a key, `rotate-keys` seals every stored
value under the current key (`StoreCheckpointer.rotate_keys`), which with `--plaintext-read`
also encrypts a store written without encryption. Keys come from `$LGCKPT_KEYS`."""

from __future__ import annotations

import argparse
import dataclasses

from ..core.keys import check_key_id, encode_key, new_key
from ..core.rotation import RotationProgress
from .common import (
    DAMAGED,
    ENV_KEYS,
    OK,
    USAGE,
    CliError,
    add_command,
    open_saver,
    serde_options,
)
from .output import Output


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    _new_key(sub)
    _rotate_keys(sub)


# -- new-key ----------------------------------------------------------------------------------


def _new_key(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "new-key", url=False, help="print a new random encryption key (base64)",
        description=f"Print a new random 256-bit key as base64, or as ID:KEY with --id, the "
        f"form ${ENV_KEYS} takes (id:base64key,..., the last one current unless "
        "$LGCKPT_KEY_CURRENT names one). Keep it secret: whoever holds it reads the store.",
        example=f"lgckpt new-key --id 2026-12\n"
                f"export {ENV_KEYS}=\"$(lgckpt new-key --id 2026-12)\"\n"
                f"export {ENV_KEYS}=\"${ENV_KEYS},$(lgckpt new-key --id 2027-01)\"",
    )
    p.add_argument("--id", metavar="ID", help="print ID:KEY (a key id: letters, digits, _.:/@+-)")
    p.set_defaults(run=run_new_key)


def run_new_key(args: argparse.Namespace, out: Output) -> int:
    key = encode_key(new_key())
    kid = None if args.id is None else check_key_id(args.id)
    if out.json_mode:
        out.json({"id": kid, "key": key})
    else:
        out.line(key if kid is None else f"{kid}:{key}")
    return OK


# -- rotate-keys ------------------------------------------------------------------------------


def _rotate_keys(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "rotate-keys", help="seal every stored value under the current key",
        description=f"Seal every stored value again under its current key (from "
        f"${ENV_KEYS}): values under an older key, and with --plaintext-read values stored "
        "unencrypted (which encrypts an existing store in place). Safe beside running "
        "agents: a value rewritten meanwhile is left alone. A run that was stopped resumes "
        "when started again (values already current are counted and skipped). Rows that "
        "cannot be opened (an unknown key, tampering) are listed and left as they are "
        "(exit 8). Keep every old key in the variable until this has run.",
        example="lgckpt rotate-keys sqlite:///agent.db --dry-run   # LGCKPT_KEYS=old:...,new:...\n"
                "lgckpt rotate-keys --url postgresql://db/app --thread t-1 --thread t-2\n"
                "lgckpt rotate-keys sqlite:///agent.db --plaintext-read   # encrypt in place",
    )
    p.add_argument("store", metavar="URL", nargs="?", default=None,
                   help="the checkpoint store (or --url, or $LGCKPT_URL)")
    p.add_argument("--thread", action="append", default=[], metavar="THREAD",
                   help="rotate only this thread (repeatable; default: every thread)")
    p.add_argument("--dry-run", action="store_true",
                   help="count what would be sealed again; change nothing")
    p.set_defaults(run=run_rotate_keys)


def run_rotate_keys(args: argparse.Namespace, out: Output) -> int:
    url = args.store or args.url
    with open_saver(url, write=not args.dry_run, create=False, **serde_options(args)) as saver:
        if saver.encryption is None:
            raise CliError(f"rotate-keys needs the keys: set {ENV_KEYS} (id:base64key,..., "
                           "the current one last; `lgckpt new-key --id ID` makes one)", USAGE)
        with out.progress(None, "rotating keys") as bar:

            def step(p: RotationProgress) -> None:
                bar.total = p.threads_total
                bar.update(p.threads_done - bar.done)

            report = saver.rotate_keys(args.thread or None, dry_run=args.dry_run,
                                       progress=step)
    if out.json_mode:
        out.json(dataclasses.asdict(report))
    else:
        for line in report.summary().splitlines():
            out.line(line)
    if report.unreadable:
        out.warn(f"{len(report.unreadable)} row(s) could not be opened and were left as they "
                 "are: are all the old keys in the variable?")
        return DAMAGED
    return OK
