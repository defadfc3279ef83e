"""Threads of an encrypted store exported as they are stored: sealed values, each bound to its
row's identity (`core.sealing`), so that an export never holds a plaintext value.

A sealed checkpoint line holds the stored rows of one checkpoint, not its decoded values:

    thread_id, checkpoint_ns, checkpoint_id, parent_checkpoint_id, run_id
    checkpoint, metadata      [type, base64] as stored (sealed)
    blobs                     [[channel, version, base_version, type, base64], ...]: on the
                              first line of each namespace of a thread, every value its lines read
    writes                    [[task_id, idx, channel, task_path, type, base64], ...]

Importing one opens every value with the importer's keys for the row it names (a value moved
to another line, or a line whose thread id was edited, fails to open: the file is refused
before anything is written), then writes it into the target, which seals it again for its own
rows under its own current key.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple
from langgraph.checkpoint.serde.base import SerializerProtocol

from ..core import codec
from ..core.errors import DecryptionError, InvalidConfigError
from ..core.rows import BlobRow, CheckpointRow, ListQuery, Typed, WriteRow
from ..core.sealing import (
    Encryption,
    Identity,
    Sealer,
    blob_identity,
    checkpoint_identity,
    metadata_identity,
    write_identity,
)

if TYPE_CHECKING:
    from ..core.saver import StoreCheckpointer
    from ..core.sealedstore import SealedStore

SEALED_VERSION = 2
"""The format version of a sealed export (a plaintext one is version 1)."""


def sealing_of(saver: Any) -> tuple[StoreCheckpointer, SealedStore] | None:
    """The checkpointer and its sealing layer when `saver` is one of our checkpointers that
    encrypts; None when it stores plaintext. An encrypting saver whose rows cannot be read
    as stored (a wrapper) is refused: export from the checkpointer it wraps."""
    from ..core.saver import StoreCheckpointer

    if not _encrypts(saver):
        return None
    if not isinstance(saver, StoreCheckpointer) or saver.stored.sealed is None:
        raise InvalidConfigError(
            f"{type(saver).__name__} encrypts, and an export of it stays encrypted: export "
            "from the checkpointer it wraps, or pass plaintext=True (--plaintext) for "
            "decrypted values")
    sealed = saver.stored.sealed
    assert sealed is not None
    return saver, sealed


def _encrypts(saver: Any, depth: int = 0) -> bool:
    """Whether `saver`, or a checkpointer it wraps (`inner`, `primary`), encrypts."""
    if getattr(saver, "encryption", None) is not None:
        return True
    held = [getattr(saver, attr, None) for attr in ("inner", "primary")]
    return depth < 8 and any(h is not None and _encrypts(h, depth + 1) for h in held)


def _b64(typed: Typed) -> list[str]:
    return [typed[0], base64.b64encode(bytes(typed[1])).decode("ascii")]


async def thread_lines(saver: StoreCheckpointer, sealed: SealedStore, thread_id: str
                       ) -> list[dict[str, Any]]:
    """One thread's sealed lines, oldest first per namespace (see the module docstring)."""
    inner = sealed.inner
    raws = [r async for r in inner.iter_checkpoints(ListQuery(thread_id=thread_id, replica=True))]
    by_ns: dict[str, list[CheckpointRow]] = {}
    for raw in sorted(raws, key=lambda r: (r.checkpoint_ns, r.checkpoint_id)):
        by_ns.setdefault(raw.checkpoint_ns, []).append(raw)
    lines: list[dict[str, Any]] = []
    for ns, rows in by_ns.items():
        keys: set[tuple[str, str]] = set()
        for raw in rows:  # the blob keys are in the record: opened, never written out
            header = saver.stored.header(sealed.open_row(raw, remember=False))
            keys |= codec.blob_keys(header["channel_versions"]).items()
        blobs = await inner.read_blobs(thread_id, ns, keys)
        writes = await inner.read_writes(thread_id, ns, [r.checkpoint_id for r in rows])
        for i, raw in enumerate(rows):
            lines.append({
                "thread_id": thread_id, "checkpoint_ns": ns, "checkpoint_id": raw.checkpoint_id,
                "parent_checkpoint_id": raw.parent_checkpoint_id, "run_id": raw.run_id,
                "checkpoint": _b64(raw.checkpoint), "metadata": _b64(raw.metadata),
                "blobs": [[b.channel, b.version, b.base_version, *_b64((b.type, b.data))]
                          for b in (blobs.values() if i == 0 else ())],
                "writes": [[w.task_id, w.idx, w.channel, w.task_path, *_b64((w.type, w.data))]
                           for w in writes.get(raw.checkpoint_id, [])],
            })
    return lines


# -- reading a sealed line --------------------------------------------------------------------


_KEYS = ("thread_id", "checkpoint_ns", "checkpoint_id", "parent_checkpoint_id", "run_id",
         "checkpoint", "metadata", "blobs", "writes")


def _typed(value: Any, what: str) -> Typed:
    if (not isinstance(value, list) or len(value) != 2
            or not all(isinstance(v, str) for v in value)):
        raise ValueError(f"{what} is not [type, base64]")
    try:
        return value[0], base64.b64decode(value[1], validate=True)
    except ValueError as exc:
        raise ValueError(f"{what} is not valid base64") from exc


def _text(obj: dict[str, Any], key: str, empty: bool = False) -> str:
    value = obj[key]
    if not isinstance(value, str) or (not value and not empty):
        raise ValueError(f"{key} is not a non-empty string")
    return value


def parse_rows(obj: Any) -> tuple[CheckpointRow, list[BlobRow], list[WriteRow]]:
    """The stored rows of one sealed line (parsed JSON); `ValueError` saying what is wrong."""
    if not isinstance(obj, dict) or any(k not in obj for k in _KEYS):
        raise ValueError(f"not a sealed checkpoint line (it needs the keys {', '.join(_KEYS)})")
    tid, cid = _text(obj, "thread_id"), _text(obj, "checkpoint_id")
    ns = _text(obj, "checkpoint_ns", empty=True)
    parent, run = obj["parent_checkpoint_id"], obj["run_id"]
    for name, value in (("parent_checkpoint_id", parent), ("run_id", run)):
        if value is not None and not isinstance(value, str):
            raise ValueError(f"{name} is neither null nor a string")
    row = CheckpointRow(tid, ns, cid, parent, run, _typed(obj["checkpoint"], "checkpoint"),
                        _typed(obj["metadata"], "metadata"))
    if not isinstance(obj["blobs"], list) or not isinstance(obj["writes"], list):
        raise ValueError("blobs and writes are lists")
    blobs = []
    for i, b in enumerate(obj["blobs"]):
        if (not isinstance(b, list) or len(b) != 5 or not all(isinstance(x, str) for x in b[:2])
                or not (b[2] is None or isinstance(b[2], str))):
            raise ValueError(f"blob {i} is not [channel, version, base_version, type, base64]")
        blobs.append(BlobRow(b[0], b[1], *_typed(b[3:], f"blob {i}"), b[2]))
    writes = []
    for i, w in enumerate(obj["writes"]):
        if (not isinstance(w, list) or len(w) != 6 or not isinstance(w[1], int)
                or isinstance(w[1], bool)
                or not all(isinstance(x, str) for x in (w[0], w[2], w[3]))):
            raise ValueError(f"write {i} is not [task_id, idx, channel, task_path, type, base64]")
        writes.append(WriteRow(tid, ns, cid, w[0], w[1], w[2], *_typed(w[4:], f"write {i}"),
                               w[3]))
    return row, blobs, writes


def _identities(row: CheckpointRow, blobs: Sequence[BlobRow], writes: Sequence[WriteRow]
                ) -> list[tuple[Typed, Identity]]:
    tid, ns, cid = row.thread_id, row.checkpoint_ns, row.checkpoint_id
    out = [(row.checkpoint, checkpoint_identity(tid, ns, cid)),
           (row.metadata, metadata_identity(tid, ns, cid))]
    out += [((b.type, b.data), blob_identity(tid, ns, b.channel, b.version, b.base_version))
            for b in blobs]
    out += [((w.type, w.data), write_identity(tid, ns, cid, w.task_id, w.idx, w.channel))
            for w in writes]
    return out


def check_opens(sealer: Sealer, rows: tuple[CheckpointRow, list[BlobRow], list[WriteRow]]
                ) -> None:
    """Every value of a line opens with `sealer`'s keys for the row it names (else the
    sealer's error, which names the row)."""
    for typed, ident in _identities(*rows):
        sealer.open(typed, ident)


def need_keys(encryption: Encryption | None) -> Encryption:
    if encryption is None:
        raise DecryptionError(
            "this export is encrypted (its values as the store sealed them): import it into "
            "a checkpointer opened with encryption=Encryption(keys=...) holding their keys, "
            "or pass encryption= (lgckpt: set LGCKPT_KEYS)")
    return encryption


def _depth(blobs: Sequence[BlobRow]) -> list[BlobRow]:
    """Blobs ordered so that a delta's base comes before it."""
    by_key = {(b.channel, b.version): b for b in blobs}

    def depth(b: BlobRow) -> int:
        n = 0
        while b.base_version is not None and (b.channel, b.base_version) in by_key and n < 64:
            b, n = by_key[(b.channel, b.base_version)], n + 1
        return n

    return sorted(blobs, key=depth)


def load_thread(rows: Sequence[tuple[CheckpointRow, list[BlobRow], list[WriteRow]]],
                serde: SerializerProtocol, encryption: Encryption,
                config: RunnableConfig) -> list[CheckpointTuple]:
    """A thread's sealed rows read back as checkpoint tuples: written as they are into an
    in-memory checkpointer holding `encryption`'s keys, then listed (`config`) from it."""
    from ..backends.memory import InMemoryCheckpointer

    with InMemoryCheckpointer(serde=serde, encryption=encryption) as mem:
        sealed = mem.stored.sealed
        assert sealed is not None
        items: list[Any] = []
        by_ns: dict[str, list[BlobRow]] = {}
        for row, blobs, _ in rows:
            by_ns.setdefault(row.checkpoint_ns, []).extend(blobs)
        firsts: set[str] = set()
        for row, _, writes in rows:
            ns = row.checkpoint_ns
            items.append((row, _depth(by_ns[ns]) if ns not in firsts else []))
            firsts.add(ns)
            if writes:
                items.append(list(writes))
        if items:
            mem.run_sync(sealed.inner.write_batch(items))
        return list(mem.list(config))

