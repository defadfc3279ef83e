"""Error types raised by every checkpointer of this package."""

from __future__ import annotations

import warnings
from typing import Any, TypeVar

T = TypeVar("T")


class CheckpointerError(Exception):
    """Base class of the errors this package raises on purpose."""


class InvalidConfigError(CheckpointerError, ValueError):
    """A `RunnableConfig` lacks what the operation needs (such as `thread_id`)."""


class InvalidFilterError(CheckpointerError, ValueError):
    """A metadata filter passed to `list`/`alist` is malformed."""


class SerializationError(CheckpointerError, TypeError):
    """A value could not be serialized; the message names the channel or write."""


class CorruptBlobError(CheckpointerError):
    """A stored row cannot be decoded back into the value it was written from."""


class CorruptChainError(CorruptBlobError):
    """Stored parent links loop (a checkpoint is its own ancestor) or run past any real
    thread's length: the rows were altered. The message names the checkpoints."""


class CheckpointNotFoundError(CheckpointerError, LookupError):
    """A checkpoint that the call names is not stored."""


class ThreadNotFoundError(CheckpointNotFoundError, KeyError):
    """No checkpoint of the named thread is stored."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else ""


class ThreadExistsError(CheckpointerError, ValueError):
    """The target thread of a fork or copy already holds checkpoints."""


class StorageVersionError(CheckpointerError):
    """The store was written by a newer version of this package than the one running."""


class MissingBaseError(CheckpointerError):
    """An append-delta's base is not in this store, and the row came without its whole value
    (rows copied from another store, e.g. by replication): the thread needs a repair."""


class StoreUnavailableError(CheckpointerError, ConnectionError):
    """The database server could not be reached after retrying; nothing was half-written."""


class ReplicaAckError(StoreUnavailableError):
    """Fewer replicas than `wait_replicas` acknowledged a write in time: the write is on the
    master, and may be lost if the master fails before a replica copies it."""


class StoreBusyError(CheckpointerError):
    """A maintenance operation (prune, delete, GC) found the thread being written the whole
    time it tried: nothing was changed; retry later."""


class ConcurrentWriteError(CheckpointerError):
    """A write refused because another writer got to the thread first (nothing was stored):
    another run wrote the namespace since this run read it (`writers="single"`), the thread
    was deleted meanwhile, another holder leases it, or this writer was fenced off. The run
    that gets it should read the thread again and decide; retrying the same write fails again.

    Attributes `thread_id` and `checkpoint_ns` name where."""

    def __init__(self, message: str, thread_id: str = "", checkpoint_ns: str = "") -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns


class ThreadDeletedError(ConcurrentWriteError):
    """A late write (from a run that read the thread before it was deleted) for a deleted
    thread: refused while its tombstone lasts. A new run on the same thread id is welcome."""


class ThreadLeasedError(ConcurrentWriteError):
    """The thread is leased by another holder (`lease()`): this run may not write it (or
    take the lease) until the lease is released or expires."""


class LeaseLostError(ConcurrentWriteError):
    """This holder's lease of the thread expired or was taken over: its writes are refused
    (the fencing token no longer matches)."""


class FencedError(ConcurrentWriteError):
    """A write from a writer whose epoch is older than the store's: a primary demoted by a
    failover (`ReplicatedCheckpointer(promote=True)`) and still written through."""


class DecryptionError(CorruptBlobError):
    """A stored value failed authentication: it was sealed for another row, thread or version
    (moved there), altered, or its key is not the one named in it (the message names the row)."""


class UnknownKeyError(DecryptionError):
    """A stored value names a key id the checkpointer's `KeyProvider` does not have."""


class PlaintextRefusedError(CorruptBlobError):
    """Encryption is on and a stored value is not encrypted (`plaintext="refuse"`): a row
    written without encryption, or put there by someone without the key."""


class DecompressionLimitError(CorruptBlobError):
    """A stored value decompresses past the checkpointer's bound (`max_value_bytes`): refused
    before it could exhaust memory."""


class ReplicationError(CheckpointerError):
    """A write could not be replicated as the `ReplicatedCheckpointer`'s consistency asks."""


class QuorumUnavailableError(ReplicationError, ConnectionError):
    """Fewer replicas are up, or confirmed a write, than the quorum needs."""


class PrimaryUnavailableError(StoreUnavailableError):
    """The primary of a `ReplicatedCheckpointer` cannot be reached: reads fail over to a
    replica; writes are refused unless promotion is allowed."""


class SchemaVersionError(CheckpointerError, ValueError):
    """A state-schema chain that cannot be applied: a gap, a bad version, or stored data newer
    than the code."""


class MissingDependencyError(CheckpointerError, ImportError):
    """An optional driver is not installed; the message says which `pip install` fixes it."""


def check_storage_version(current: int, latest: int) -> None:
    """Refuse storage written by a newer version of this package (the migration steps' twin)."""
    if current > latest:
        raise StorageVersionError(
            f"this database has storage version {current}, newer than the {latest} this "
            "langgraph-ckpt-ext knows: upgrade the package"
        )


def require(module: str, extra: str | None = None, *, package: str | None = None,
            what: str | None = None) -> Any:
    """Import an optional module, or raise `MissingDependencyError` naming the fix: our
    `extra`, or else the `package` to install (`what` says what needs it)."""
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError as exc:  # pragma: no cover - depends on the environment
        fix = f"langgraph-ckpt-ext[{extra}]" if extra else package
        why = f"reading {what} needs {package}" if what else f"{module!r} is not installed"
        raise MissingDependencyError(f"{why}: run `pip install {fix}`") from exc


def renamed(module: str, old: str, value: T) -> T:
    """`value`, reached by its former name `old` in `module`, with a `DeprecationWarning`
    naming what to import instead."""
    new = getattr(value, "__name__", "?")
    warnings.warn(
        f"{module}.{old} is now {new}: import {new} instead (the old name will go)",
        DeprecationWarning, stacklevel=3)
    return value
