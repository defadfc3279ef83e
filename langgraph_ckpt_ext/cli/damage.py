"""Going on past damaged threads: a stored row that cannot be decoded (a corrupted blob, a
store written with another serializer) stops only its own thread.

A store-wide command reports each damaged thread on stderr as it finds it (one line: the
thread, the row, the error), skips it, finishes the others, and exits with `DAMAGED`; its JSON
lists them. `--strict` stops at the first instead (exit 1).
"""

from __future__ import annotations

import builtins
import re
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from ..core.errors import CorruptBlobError, DecryptionError, MissingBaseError, UnknownKeyError
from .common import DAMAGED, ENV_KEYS, ERROR, OK, USAGE, CliError, quoted_names
from .output import Output

DAMAGE = (CorruptBlobError, MissingBaseError)
"""What a damaged row raises when read."""

# How the checkpointers name the row in a decoding error: "cannot decode <row> (type '<t>'): "
_ROW = re.compile(r"cannot decode (.+?) \(type '[^']*'\): ", re.S)


@dataclass(frozen=True, slots=True)
class Damage:
    """A thread (or one checkpoint of it) that cannot be read."""

    thread_id: str
    checkpoint_id: str | None
    """The checkpoint whose reading failed, when the command read them one by one."""
    row: str | None
    """The stored row the error names (`channel 'x' at version '3'`), when it names one."""
    error: str

    @classmethod
    def of(cls, thread_id: str, exc: BaseException, checkpoint_id: str | None = None) -> Damage:
        found = _ROW.match(str(exc))
        return cls(thread_id, checkpoint_id, found.group(1) if found else None, str(exc))


class DamageLog:
    """The damage one command went past. `record` reports each on stderr (or, `strict`,
    raises); `finish` says how many at the end and turns the exit code into `DAMAGED`.
    Safe to call from several threads (a copy reads threads concurrently)."""

    def __init__(self, out: Output, strict: bool, *, noun: str = "thread",
                 done: str = "skipped") -> None:
        self.found: list[Damage] = []
        self._out = out
        self._strict = strict
        self._noun = noun
        self._done = done  # what the command did with it
        self._lock = threading.Lock()

    @property
    def threads(self) -> set[str]:
        with self._lock:
            return {d.thread_id for d in self.found}

    def record(self, thread_id: str, exc: BaseException, checkpoint_id: str | None = None
               ) -> Damage:
        """Report `exc`, met reading `thread_id`, once; `CliError` instead when strict."""
        where = f"thread {thread_id!r}" + (f" at checkpoint {checkpoint_id}" if checkpoint_id
                                           else "")
        keys = keys_problem(exc)
        if keys is not None:  # not the thread's damage: the command's keys
            raise CliError(f"{where}: {keys}", USAGE) from exc
        if self._strict:
            raise CliError(f"{where} is damaged: {exc} (--strict stops there; without it the "
                           "command goes on past damaged threads and exits with 8)",
                           ERROR) from exc
        damage = Damage.of(thread_id, exc, checkpoint_id)
        with self._lock:
            if any((d.thread_id, d.checkpoint_id) == (thread_id, checkpoint_id)
                   for d in self.found):
                return damage
            self.found.append(damage)
        self._out.warn(f"{where} is damaged, {self._done}: {exc}")
        return damage

    def as_json(self) -> list[dict[str, Any]]:
        return [{"thread_id": d.thread_id, "checkpoint_id": d.checkpoint_id, "row": d.row,
                 "error": d.error} for d in sorted(self.found, key=_order)]

    def finish(self, code: int) -> int:
        """`code`, or `DAMAGED` in place of `OK` when something was skipped (said on
        stderr, with what to do)."""
        if not self.found:
            return code
        names = [d.checkpoint_id or d.thread_id for d in sorted(self.found, key=_order)]
        self._out.error(
            f"went on past {len(names)} damaged {self._noun}(s) ({quoted_names(names)}), each "
            "reported above: --strict stops at the first; a store written with a serializer "
            "of your own is read with --serde MODULE:OBJECT")
        return DAMAGED if code == OK else code


def keys_problem(exc: BaseException) -> str | None:
    """What to do when `exc` says the command holds no key for what it read (None: another
    error): the store is encrypted and no keys were given, or a value names a key they
    lack."""
    if isinstance(exc, UnknownKeyError):
        return f"{exc} (add that key to ${ENV_KEYS})"
    if type(exc) is DecryptionError and "encryption=Encryption(keys=" in str(exc):
        return (f"the store is encrypted: set ${ENV_KEYS} to its keys (id:base64key,...) "
                "to read it")
    return None


def _order(d: Damage) -> tuple[str, str]:
    return d.thread_id, d.checkpoint_id or ""


class SkipDamaged(BaseCheckpointSaver[Any]):
    """A saver's `threads` as the source of `copy_threads` or `export_threads`: each read
    whole, a damaged one reported to `log` and read as holding no checkpoint (which both
    skip). Reads only: nothing else of the saver is offered."""

    def __init__(self, saver: BaseCheckpointSaver[Any], threads: builtins.list[str],
                 log: DamageLog) -> None:
        super().__init__(serde=saver.serde)
        self._saver = saver
        self._threads = threads
        self._log = log

    def thread_ids(self) -> builtins.list[str]:
        """The threads, but those found damaged so far."""
        damaged = self._log.threads
        return [t for t in self._threads if t not in damaged]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        thread_id = str(((config or {}).get("configurable") or {}).get("thread_id"))
        try:  # read whole here, so that damage is met before anything is written
            return iter(builtins.list(self._saver.list(config, filter=filter, before=before,
                                                       limit=limit)))
        except DAMAGE as exc:
            self._log.record(thread_id, exc)
            return iter(())
