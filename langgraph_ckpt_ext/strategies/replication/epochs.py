"""Fencing by epoch (`core.guard`): the primary's writes carry the epoch of its store, read
before the first write; a promotion takes a newer one (on the promoted store, and on the
demoted primary once it answers), so that a node still writing through the demoted primary,
and its applies to the promoted store, are refused (`FencedError`).

The epoch lives in the stores of this package's checkpointers (`Store.read_epoch`,
`raise_epoch`); any other saver has none, and its writes are not fenced."""

from __future__ import annotations

from typing import Any

from ...core.saver import StoreCheckpointer


def has_epoch(saver: Any) -> bool:
    """Whether `saver` keeps an epoch (one of ours)."""
    return isinstance(saver, StoreCheckpointer)


def read_epoch(saver: Any) -> int | None:
    """The epoch of `saver`'s store (None: not one of ours)."""
    if not isinstance(saver, StoreCheckpointer):
        return None
    return saver.read_epoch()


def fence_store(saver: Any, epoch: int) -> None:
    """Raise `saver`'s store to `epoch` (older writers refused from then on), and write with
    it from now on."""
    if isinstance(saver, StoreCheckpointer):
        saver.writer_epoch = saver.raise_epoch(epoch)


def write_with(savers: list[Any], epoch: int) -> None:
    """Guarded writes of these savers (ours) carry `epoch`."""
    for saver in savers:
        if isinstance(saver, StoreCheckpointer):
            saver.writer_epoch = epoch


def as_replica(saver: Any, replica: bool) -> None:
    """Make `saver` (ours) write as a replica (only the epoch checked: the primary decided)
    or, once promoted, as a primary (every guard)."""
    if isinstance(saver, StoreCheckpointer):
        saver.replica_apply = replica
