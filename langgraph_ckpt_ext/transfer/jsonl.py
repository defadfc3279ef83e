"""Threads as JSON Lines: `export_threads` writes them, `import_jsonl` reads them back."""

from __future__ import annotations

import base64
import binascii
import contextlib
import datetime as dt
import io
import json
import os
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core.config import checkpoint_ns_of, make_config, put_ids, write_ids
from ..core.errors import CheckpointerError
from ..core.saver import strict_serde
from ..core.sealing import Encryption, Sealer
from . import sealed as _sealed
from ._blocked import loads_strict
from .copy import CopyReport, Progress, _wanted, copy_threads
from .threads import Saver, _parent_id, checkpoint_key, thread_tuples

FORMAT = "langgraph-ckpt-ext/threads"
FORMAT_VERSION = _sealed.SEALED_VERSION
"""The newest format version this package reads (and writes, for a sealed export; a
plaintext one is written as version 1, which every release reads)."""
PLAIN_VERSION = 1


class MalformedExportError(CheckpointerError, ValueError):
    """A JSON Lines export cannot be imported: the message names the line and what is wrong.
    Nothing was written."""


@dataclass(frozen=True, slots=True)
class ExportReport:
    threads: int
    checkpoints: int
    writes: int
    seconds: float


def _b64(typed: tuple[str, bytes]) -> list[str]:
    return [typed[0], base64.b64encode(typed[1]).decode("ascii")]


def _checkpoint_line(serde: SerializerProtocol, thread_id: str, tup: CheckpointTuple) -> dict[str, Any]:
    ns, checkpoint_id = checkpoint_key(tup)
    return {
        "thread_id": thread_id,
        "checkpoint_ns": ns,
        "checkpoint_id": checkpoint_id,
        "parent_checkpoint_id": _parent_id(tup),
        "checkpoint": _b64(serde.dumps_typed(tup.checkpoint)),
        "metadata": _b64(serde.dumps_typed(tup.metadata)),
        "writes": [[str(task), channel, *_b64(serde.dumps_typed(value))]
                   for task, channel, value in tup.pending_writes or []],
    }


def export_threads(
    saver: Saver,
    fh: IO[str],
    thread_ids: Sequence[str] | None = None,
    *,
    progress: Progress | None = None,
    plaintext: bool = False,
) -> ExportReport:
    """Write threads (all, or `thread_ids`) to `fh` as JSON Lines: a header line (format and
    version), one line per checkpoint, each thread's lines together and oldest first, and an
    end line with the counts (an export cut short is refused by `import_jsonl`).

    A checkpoint line holds `thread_id`, `checkpoint_ns`, `checkpoint_id`,
    `parent_checkpoint_id`, and the checkpoint (with its channel values), its metadata and its
    pending writes (`[task_id, channel, type, base64]`), each value as the saver's serde
    `dumps_typed` gives it: `[type, base64 of the bytes]`.

    From one of our checkpointers that encrypts, the export stays encrypted (format version
    2, `"sealed": true`): each line holds the checkpoint's rows as stored, every value sealed
    for its row (see `transfer.sealed`), and importing it needs the keys. `plaintext=True`
    writes the decrypted values instead (which needs the keys too). A wrapper that encrypts
    (smart, replicated) is refused unless `plaintext`: export from the checkpointer it wraps.

    Example:
        >>> with open("threads.jsonl", "w") as fh:  # doctest: +SKIP
        ...     export_threads(connect("sqlite:///agent.db"), fh)
    """
    started = time.monotonic()
    sealing = None if plaintext else _sealed.sealing_of(saver)
    wanted = _wanted(saver, thread_ids)
    serde = saver.serde
    fh.write(json.dumps(export_header(len(wanted), sealing is not None)) + "\n")
    checkpoints = writes = 0
    for n, thread_id in enumerate(wanted, 1):
        if sealing is not None:
            cp, store = sealing
            for line in cp.run_sync(_sealed.thread_lines(cp, store, thread_id)):
                fh.write(json.dumps(line) + "\n")
                checkpoints += 1
                writes += len(line["writes"])
        for tup in thread_tuples(saver, thread_id) if sealing is None else ():
            fh.write(json.dumps(_checkpoint_line(serde, thread_id, tup)) + "\n")
            checkpoints += 1
            writes += len(tup.pending_writes or [])
        if progress is not None:
            progress(n, len(wanted))
    fh.write(json.dumps({"end": True, "threads": len(wanted), "checkpoints": checkpoints}) + "\n")
    fh.flush()
    return ExportReport(len(wanted), checkpoints, writes, time.monotonic() - started)


def export_header(threads: int, sealed: bool) -> dict[str, Any]:
    """The first line of an export of `threads` threads (`sealed`: values as stored)."""
    return {"format": FORMAT, "version": FORMAT_VERSION if sealed else PLAIN_VERSION,
            **({"sealed": True} if sealed else {}), "threads": threads,
            "exported_at": dt.datetime.now(dt.timezone.utc).isoformat()}


def _typed(value: Any, what: str) -> tuple[str, bytes]:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, str) for v in value)):
        raise ValueError(f"{what} is not [type, base64]")
    try:
        return value[0], base64.b64decode(value[1], validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ValueError(f"{what} is not valid base64") from exc


_LINE_KEYS = ("thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id",
              "checkpoint", "metadata", "writes")


def _json(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"not JSON ({exc})") from None


def _parse_line(serde: SerializerProtocol, obj: Any) -> CheckpointTuple:
    """One checkpoint line (parsed JSON) as a tuple; `ValueError` saying what is wrong."""
    if not isinstance(obj, dict) or any(k not in obj for k in _LINE_KEYS):
        raise ValueError(f"not a checkpoint line (it needs the keys {', '.join(_LINE_KEYS)})")
    for key in ("thread_id", "checkpoint_ns", "checkpoint_id"):
        if not isinstance(obj[key], str) or (key != "checkpoint_ns" and not obj[key]):
            raise ValueError(f"{key} is not a non-empty string")
    parent = obj["parent_checkpoint_id"]
    if parent is not None and (not isinstance(parent, str) or not parent):
        raise ValueError("parent_checkpoint_id is neither null nor a string")
    try:
        checkpoint = loads_strict(serde, _typed(obj["checkpoint"], "checkpoint"))
        metadata = loads_strict(serde, _typed(obj["metadata"], "metadata"))
        if not isinstance(obj["writes"], list):
            raise ValueError("writes is not a list")
        writes = []
        for i, w in enumerate(obj["writes"]):
            if (not isinstance(w, list) or len(w) != 4
                    or not all(isinstance(x, str) for x in w)):
                raise ValueError(f"write {i} is not [task_id, channel, type, base64]")
            writes.append((w[0], w[1], loads_strict(serde, _typed(w[2:], f"write {i}"))))
    except ValueError:
        raise
    except Exception as exc:  # what the serializer raises on bytes it cannot read
        raise ValueError(f"a value cannot be decoded ({type(exc).__name__}: {exc})") from None
    if (not isinstance(checkpoint, dict) or checkpoint.get("id") != obj["checkpoint_id"]
            or not isinstance(checkpoint.get("channel_values"), dict)
            or not isinstance(checkpoint.get("channel_versions"), dict)):
        raise ValueError("checkpoint is not a checkpoint with this line's checkpoint_id")
    if not isinstance(metadata, dict):
        raise ValueError("metadata is not a mapping")
    tid, ns = obj["thread_id"], obj["checkpoint_ns"]
    tup = CheckpointTuple(
        config=make_config(tid, ns, obj["checkpoint_id"]),
        checkpoint=cast(Checkpoint, checkpoint),
        metadata=cast(CheckpointMetadata, metadata),
        parent_config=make_config(tid, ns, parent) if parent else None,
        pending_writes=writes,
    )
    # Ids no store of ours can hold are refused here, before anything is written
    # (`InvalidConfigError` is a `ValueError`).
    put_ids(tup.parent_config or tup.config, checkpoint, metadata, {})
    for task_id, channel, _ in writes:
        write_ids(tup.config, [(channel, None)], task_id, "")
    return tup


class _JsonlSource(BaseCheckpointSaver[str]):
    """A JSON Lines export as a read-only saver: every line checked and decoded once when
    opened (so a bad file is refused before anything is written), then each thread read back
    from its lines when listed."""

    def __init__(self, fh: IO[bytes], serde: SerializerProtocol,
                 encryption: Encryption | None = None) -> None:
        super().__init__(serde=serde)
        self._encryption = encryption
        self._sealer: Sealer | None = None  # set for a sealed export
        self._fh = fh
        self._lock = threading.Lock()
        self._threads: dict[str, tuple[int, int]] = {}  # id -> (offset, lines)
        self._index()

    def _bad(self, line: int, why: str) -> MalformedExportError:
        return MalformedExportError(f"line {line} of the export: {why}; nothing was imported")

    def _header(self, raw: bytes) -> None:
        try:
            head = json.loads(raw) if raw.strip() else None
        except (json.JSONDecodeError, UnicodeDecodeError):
            head = None
        if not isinstance(head, dict) or head.get("format") != FORMAT:
            raise self._bad(1, f"not an export of langgraph-ckpt-ext (no {FORMAT!r} header)")
        version = head.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise self._bad(1, f"format version {version!r} is not a positive integer")
        if version > FORMAT_VERSION:
            raise self._bad(1, f"format version {version} is newer than the {FORMAT_VERSION} "
                               "this langgraph-ckpt-ext reads: upgrade the package")
        if head.get("sealed") is True:
            self._encryption = _sealed.need_keys(self._encryption)
            self._sealer = Sealer(self._encryption)

    def _check(self, obj: Any) -> tuple[str, tuple[str, str]]:
        """A checkpoint line checked whole (every value decoded, or for a sealed export
        opened for its row): its thread id and `checkpoint_key`."""
        if self._sealer is not None:
            rows = _sealed.parse_rows(obj)
            try:
                _sealed.check_opens(self._sealer, rows)
            except CheckpointerError as exc:
                raise ValueError(str(exc)) from None
            return rows[0].thread_id, (rows[0].checkpoint_ns, rows[0].checkpoint_id)
        tup = _parse_line(self.serde, obj)
        return str(tup.config["configurable"]["thread_id"]), checkpoint_key(tup)

    def _index(self) -> None:
        fh = self._fh
        fh.seek(0)
        self._header(fh.readline())
        n, current = 1, None
        end: tuple[int, dict[str, Any]] | None = None
        keys: set[tuple[str, str]] = set()
        checkpoints = 0
        while True:
            offset = fh.tell()
            raw = fh.readline()
            if not raw:
                break
            n += 1
            if end is not None:
                raise self._bad(n, "a line after the end line")
            if not raw.strip():
                raise self._bad(n, "an empty line")
            try:
                obj = _json(raw)
                if isinstance(obj, dict) and "end" in obj:
                    end = (n, obj)
                    continue
                tid, key = self._check(obj)
            except ValueError as exc:
                raise self._bad(n, str(exc)) from None
            if tid != current:
                if tid in self._threads:
                    raise self._bad(n, f"thread {tid!r} appears again after other threads")
                self._threads[tid] = (offset, 0)
                current, keys = tid, set()
            if key in keys:
                raise self._bad(n, f"checkpoint {key[1]!r} appears twice in thread {tid!r}")
            keys.add(key)
            start, count = self._threads[tid]
            self._threads[tid] = (start, count + 1)
            checkpoints += 1
        self._end(end, n, checkpoints)

    def _end(self, end: tuple[int, dict[str, Any]] | None, last: int, checkpoints: int) -> None:
        if end is None:
            raise self._bad(last, "the file ends without its end line: it was cut short "
                                  "(an interrupted export?); export it again")
        n, obj = end
        if (obj.get("end") is not True or obj.get("threads") != len(self._threads)
                or obj.get("checkpoints") != checkpoints):
            raise self._bad(n, f"the end line does not match the file ({len(self._threads)} "
                               f"threads, {checkpoints} checkpoints)")

    def thread_ids(self) -> list[str]:
        return sorted(self._threads)

    def _read(self, thread_id: str) -> list[CheckpointTuple]:
        where = self._threads.get(thread_id)
        if where is None:
            return []
        offset, count = where
        with self._lock:
            self._fh.seek(offset)
            lines = [self._fh.readline() for _ in range(count)]
        # Checked when opened: decoded the same way now.
        if self._encryption is not None and self._sealer is not None:
            return _sealed.load_thread([_sealed.parse_rows(_json(raw)) for raw in lines],
                                       self.serde, self._encryption,
                                       {"configurable": {"thread_id": thread_id}})
        return [_parse_line(self.serde, _json(raw)) for raw in lines]

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, of one thread (all when `config` is None), of its
        namespace and checkpoint when the config names them. `filter` and `before` are not
        supported (this saver only feeds `copy_threads`)."""
        if filter or before:
            raise NotImplementedError("an export read as a saver lists threads whole")
        conf = (config or {}).get("configurable") or {}
        threads = self.thread_ids() if conf.get("thread_id") is None else [
            str(conf["thread_id"])]
        ns, cid = conf.get("checkpoint_ns"), conf.get("checkpoint_id")
        out = [
            t for tid in threads for t in self._read(tid)
            if (ns is None or checkpoint_ns_of(t.config) == ns)
            and (not cid or t.checkpoint["id"] == cid)
        ]
        out.sort(key=lambda t: str(t.checkpoint["id"]), reverse=True)
        return iter(out if limit is None else out[:limit])

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        conf = config.get("configurable") or {}
        scoped: RunnableConfig = {"configurable": {**conf, "checkpoint_ns": conf.get(
            "checkpoint_ns") or ""}}
        return next(self.list(scoped, limit=1), None)


@contextlib.contextmanager
def _seekable(fh: IO[Any] | str | os.PathLike[str]) -> Iterator[IO[bytes]]:
    """A seekable binary view of `fh` (a path, or a file object of text or bytes), spooled to a
    temporary file when it cannot seek (a pipe)."""
    if isinstance(fh, str | os.PathLike):
        with open(fh, "rb") as f:
            yield f
        return
    raw = getattr(fh, "buffer", None) if isinstance(fh, io.TextIOBase) else fh
    if raw is not None and _can_seek(raw):
        yield raw
        return
    with tempfile.TemporaryFile() as spool:
        while chunk := fh.read(1 << 20):
            spool.write(chunk.encode() if isinstance(chunk, str) else chunk)
        spool.seek(0)
        yield spool


def _can_seek(fh: Any) -> bool:
    try:
        return bool(fh.seekable())
    except (AttributeError, ValueError, OSError):
        return False


@contextlib.contextmanager
def open_jsonl(
    fh: IO[Any] | str | os.PathLike[str], *, serde: SerializerProtocol | None = None,
    encryption: Encryption | None = None,
) -> Iterator[Saver]:
    """A JSON Lines export (`export_threads`) as a read-only saver, for `copy_threads`: a path,
    or a file object of text or bytes (a pipe is spooled to a temporary file).

    The whole file is checked first, every value decoded with `serde` (default: our strict
    serializer, so a file cannot make us construct arbitrary classes: a value of a type it
    does not allow is refused): `MalformedExportError` names the first bad line. The saver
    lists the file's threads (`thread_ids()`) and each thread's checkpoints (`list`).

    A sealed export (from an encrypting store) is opened with `encryption`'s keys: every
    value must open for the row its line names (else `MalformedExportError` naming the line;
    without `encryption`, `DecryptionError`).

    Example:
        >>> with open_jsonl("threads.jsonl") as source:  # doctest: +SKIP
        ...     copy_threads(source, connect("redis://localhost"))
    """
    with _seekable(fh) as f:
        yield _JsonlSource(f, serde or strict_serde(), encryption)


def import_jsonl(
    fh: IO[Any] | str | os.PathLike[str],
    target: Saver,
    thread_ids: Sequence[str] | None = None,
    *,
    overwrite: bool = False,
    serde: SerializerProtocol | None = None,
    concurrency: int = 8,
    progress: Progress | None = None,
    encryption: Encryption | None = None,
) -> CopyReport:
    """Import threads (all, or `thread_ids`) from a JSON Lines export: `open_jsonl` then
    `copy_threads` (resumable, conflicts refused unless `overwrite`, verified at the end).
    A malformed file raises `MalformedExportError` naming the line, before anything is
    written. A sealed export is opened with `encryption` (default: the target's), and each
    value sealed again by the target for its own row.

    Example:
        >>> import_jsonl("threads.jsonl", connect("redis://localhost")).summary()  # doctest: +SKIP
    """
    if encryption is None:
        encryption = getattr(target, "encryption", None)
    with open_jsonl(fh, serde=serde, encryption=encryption) as source:
        return copy_threads(source, target, thread_ids, overwrite=overwrite,
                            concurrency=concurrency, progress=progress)
