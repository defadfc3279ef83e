"""The read-time schema upgrade: a checkpoint stored under an older state schema, as the
current one sees it (pure)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from langgraph.checkpoint.base import Checkpoint, CheckpointMetadata, CheckpointTuple

from .schema import SchemaChain, compare, stored_schema_name, stored_schema_version
from .versions import Version, upgraded_version


def upgrade_read(tup: CheckpointTuple, chain: SchemaChain) -> CheckpointTuple:
    """A checkpoint stored under an older state schema, as the current one sees it.

    Channels whose value the upgrade changed or added get a fresh version marked as not
    stored (`upgraded_version`): the next `put` of a checkpoint that still holds them
    stores them, so a thread resumed from here keeps its upgraded values."""
    if not chain.owns(stored_schema_name(tup.metadata, tup.checkpoint["id"])):
        return tup  # another chain's: its versions mean nothing to this one
    stored = stored_schema_version(tup.metadata, chain, tup.checkpoint["id"])
    if not chain.needs(stored):
        return tup

    old = tup.checkpoint["channel_values"]
    values = chain.upgrade(old, stored)
    old_versions = tup.checkpoint["channel_versions"]
    added, removed, changed = compare(old, values)
    versions = {ch: v for ch, v in old_versions.items() if ch not in removed}
    moved = [*added, *changed, *(ch for ch in values if ch not in versions)]
    if moved:
        bump = upgraded_version(_max_version(old_versions.values()))
        versions.update(dict.fromkeys(moved, bump))
    writes = [
        (task, ch, v)
        for task, channel, value in tup.pending_writes or ()
        for ch, v in chain.upgrade_write(channel, value, stored)
    ]
    checkpoint = cast(
        Checkpoint,
        {**tup.checkpoint, "channel_values": values, "channel_versions": versions},
    )
    metadata = cast(CheckpointMetadata, {**tup.metadata, "schema_version": chain.current})
    return tup._replace(checkpoint=checkpoint, metadata=metadata, pending_writes=writes)


def _max_version(versions: Iterable[Version]) -> Version | None:
    try:
        return max(versions, default=None)
    except TypeError:  # mixed kinds (never written by us): the floats are ours
        return max((v for v in versions if not isinstance(v, str)), default=None)
