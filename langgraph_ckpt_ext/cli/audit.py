"""`lgckpt audit status|on|off`: the store's audit setting, which every checkpointer and every
command writing to the store follows (`StoreCheckpointer.audit_status`, `enable_audit`,
`disable_audit`)."""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import logging
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .common import OK, USAGE, CliError, add_command, open_saver, serde_options
from .output import Output

if TYPE_CHECKING:
    from ..core.audit import AuditStatus


def register(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    p = add_command(
        sub, "audit", help="show, turn on or turn off the store's audit trail",
        description="Auditing is a setting of the store, recorded in it: when on, every "
        "checkpointer and every command writing to the store seals each checkpoint into a "
        "hash chain that `lgckpt verify` checks. `status` shows the setting and its log; "
        "`on` turns it on; `off` turns it off, which needs --reason (recorded in the store, "
        "and reported by verify).",
        example="lgckpt audit status\n"
                "lgckpt audit on\n"
                "lgckpt audit off --reason 'bulk re-import, ticket 4711'",
    )
    p.add_argument("action", choices=("status", "on", "off"), help="what to do")
    p.add_argument("--reason", help="why (required by off; recorded in the store's audit log)")
    p.set_defaults(run=run_audit)


def status_dict(status: AuditStatus) -> dict[str, Any]:
    return {"enabled": status.enabled, "log": [
        {"enabled": s.enabled, "at": _iso(s.at), "reason": s.reason} for s in status.log]}


def run_audit(args: argparse.Namespace, out: Output) -> int:
    if args.action == "off" and not (args.reason or "").strip():
        raise CliError("audit off needs --reason REASON (recorded in the store's audit log)",
                       USAGE)
    write = args.action != "status"
    with open_saver(args.url, write=write, create=False, **serde_options(args)) as saver, \
            _warnings_to(out):
        if args.action == "on":
            status = saver.enable_audit(reason=args.reason or "lgckpt audit on")
        elif args.action == "off":
            status = saver.disable_audit(reason=args.reason)
        else:
            status = saver.audit_status()
    if out.json_mode:
        out.json(status_dict(status))
    else:
        out.line(f"audit: {'on' if status.enabled else 'off'}")
        for s in status.log:
            out.line(f"  {_iso(s.at)}  {'on ' if s.enabled else 'off'}  {s.reason}")
    return OK


@contextlib.contextmanager
def _warnings_to(out: Output) -> Iterator[None]:
    """The audit logger's warnings as `lgckpt: warning:` lines, for the call's duration."""
    logger = logging.getLogger("langgraph_ckpt_ext.audit")
    handler = _ToOutput(out)
    logger.addHandler(handler)
    propagate, logger.propagate = logger.propagate, False
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


class _ToOutput(logging.Handler):
    def __init__(self, out: Output) -> None:
        super().__init__(logging.WARNING)
        self._out = out

    def emit(self, record: logging.LogRecord) -> None:
        self._out.warn(record.getMessage())


def _iso(at: float) -> str:
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds")
