"""What a `put` and a `put_writes` become in the buffer: items whose values are serialized when
they are handed over (`Encoder`), the events they tell, the call that stores them (`op`), and
a batch coalesced to its newest checkpoints (`coalesced`)."""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ...core import codec
from ...core.config import make_config, put_ids, write_ids
from ...core.graph import ERROR, INTERRUPT, next_nodes
from ...core.guard import with_held_lease
from ...core.inner import Op
from ...core.lru import SizedLRU
from ...core.versions import version_key
from . import policies


@dataclass
class Put:
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    config: RunnableConfig
    checkpoint: Checkpoint
    metadata: CheckpointMetadata
    new_versions: ChannelVersions
    size: int
    at: float
    events: set[str] = field(default_factory=set)


@dataclass
class Writes:
    thread_id: str
    ns: str
    checkpoint_id: str
    config: RunnableConfig
    writes: list[tuple[str, Any]]
    task_id: str
    task_path: str
    size: int
    at: float
    events: set[str] = field(default_factory=set)


Item = Put | Writes


def puts(items: Sequence[Item]) -> int:
    return sum(isinstance(i, Put) for i in items)


class Encoder:
    """Makes the items, values serialized as of the hand-over, as a direct `put` would store
    them. Remembers the value last encoded per (thread, ns, channel), at its version: a channel
    a checkpoint holds but did not write is not serialized again. Shared by a checkpointer and
    its `with_allowlist` copies, which pass their own serializer."""

    def __init__(self, max_bytes: int) -> None:
        self._lock = threading.Lock()
        self._encoded: SizedLRU[tuple[str, str, str], tuple[str, codec.Encoded]] = SizedLRU(
            max_bytes, lambda hit: hit[1].listed.size if hit[1].listed else len(hit[1].typed[1]))

    def put(
        self, serde: SerializerProtocol, config: RunnableConfig, checkpoint: Checkpoint,
        metadata: CheckpointMetadata, new_versions: ChannelVersions,
    ) -> tuple[Put, RunnableConfig]:
        """The item of a `put`, and the config `put` returns."""
        # Ids checked now, as a direct put would: a bad one must not fail a later flush.
        thread_id, ns, checkpoint_id, parent_id = put_ids(
            config, checkpoint, get_serializable_checkpoint_metadata(config, metadata),
            new_versions)
        config = with_held_lease(config)  # flushed later, maybe from another thread
        values = self._freeze(serde, thread_id, ns, checkpoint, new_versions)
        size = 256 + sum(len(values[ch].typed[1]) for ch in new_versions if ch in values)
        item = Put(
            thread_id, ns, checkpoint_id, parent_id, config,
            {**_copied(checkpoint), "channel_values": values},
            metadata.copy(), dict(new_versions), size, time.monotonic(),
        )
        item.events = _put_events(item.metadata, item.checkpoint)
        return item, make_config(thread_id, ns, checkpoint_id)

    def _freeze(
        self, serde: SerializerProtocol, thread_id: str, ns: str, checkpoint: Checkpoint,
        new_versions: ChannelVersions,
    ) -> dict[str, codec.Encoded]:
        """The checkpoint's values serialized as of now: a channel this step wrote is
        serialized; one it did not write is the value buffered at its version, if any (else
        serialized too)."""
        versions = checkpoint.get("channel_versions") or {}
        out: dict[str, codec.Encoded] = {}
        for ch, value in (checkpoint.get("channel_values") or {}).items():
            vkey = version_key(versions[ch]) if ch in versions else None
            key = (thread_id, ns, ch)
            with self._lock:
                hit = self._encoded.get(key)
            if ch not in new_versions and hit is not None and hit[0] == vkey:
                out[ch] = hit[1]
                continue
            out[ch] = enc = codec.encode(serde, value, f"channel {ch!r}",
                                         hit[1] if hit is not None else None)
            if vkey is not None:
                with self._lock:
                    self._encoded.put(key, (vkey, enc))
        return out

    def forget(self, thread_id: str | None) -> None:
        """Forget the values remembered for a thread (None: all): deleted, or rewritten."""
        with self._lock:
            self._encoded.drop_thread(thread_id)


def writes_item(
    serde: SerializerProtocol, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
    task_id: str, task_path: str, plan_channels: frozenset[str],
    side_effect_tools: frozenset[str] | None,
) -> Writes:
    """The item of a `put_writes`."""
    thread_id, ns, checkpoint_id, task = write_ids(config, writes, task_id, task_path)
    config = with_held_lease(config)  # flushed later, maybe from another thread
    frozen = [(ch, codec.encode(serde, v, f"write to channel {ch!r} of task {task_id!r}"))
              for ch, v in writes]
    size = 64 + sum(len(v.typed[1]) for _, v in frozen)
    item = Writes(thread_id, ns, checkpoint_id, config,
                  frozen, task, task_path, size, time.monotonic())
    item.events = _write_events(writes, plan_channels, side_effect_tools)
    return item


def _put_events(metadata: CheckpointMetadata, checkpoint: Checkpoint) -> set[str]:
    """What a put tells: an `update_state`, or the end of a run."""
    found: set[str] = set()
    if metadata.get("source") == "update":
        found.add(policies.UPDATE)
    if not next_nodes(checkpoint):
        found.add(policies.END)
    return found


def _write_events(
    writes: Sequence[tuple[str, Any]], plan_channels: frozenset[str],
    side_effect_tools: frozenset[str] | None,
) -> set[str]:
    """What a task's writes tell (read from the values handed over, before they are kept
    serialized): an interrupt, an error, a plan change, a tool call."""
    found: set[str] = set()
    for channel, value in writes:
        if channel == INTERRUPT:
            found.add(policies.INTERRUPT)
        elif channel == ERROR:
            found.add(policies.ERROR)
        elif channel in plan_channels:
            found.add(policies.PLAN_CHANGE)
        for v in value if isinstance(value, list | tuple) else (value,):
            calls = getattr(v, "tool_calls", None)
            if calls and (side_effect_tools is None or any(
                c.get("name") in side_effect_tools for c in calls if isinstance(c, Mapping)
            )):
                found.add(policies.TOOL_CALL)
    return found


def op(item: Item, encoded: bool = True) -> Op:
    """The call that stores an item (`encoded`: values as kept, else decoded)."""
    if isinstance(item, Put):
        checkpoint = item.checkpoint if encoded else decoded_checkpoint(item.checkpoint)
        return ("put", item.config, checkpoint, item.metadata, item.new_versions)
    writes = item.writes if encoded else [(ch, codec.decoded(v)) for ch, v in item.writes]
    return ("writes", item.config, writes, item.task_id, item.task_path)


def decoded_checkpoint(checkpoint: Checkpoint) -> Checkpoint:
    """A copy of a buffered checkpoint, values decoded: LangGraph starts a run from the
    checkpoint it reads and updates its versions in place, which must not reach the buffer."""
    values = {ch: codec.decoded(v) for ch, v in checkpoint["channel_values"].items()}
    return {**_copied(checkpoint), "channel_values": values}


def coalesced(batch: list[Item]) -> list[Item]:
    """The newest checkpoint of each namespace (re-parented onto the one before the batch,
    storing every channel that moved in the batch) and its writes; writes of checkpoints
    already stored stay."""
    newest: dict[str, Put] = {}
    first_parent: dict[str, str | None] = {}
    moved: dict[str, dict[str, Any]] = {}
    for item in batch:
        if isinstance(item, Put):
            first_parent.setdefault(item.ns, item.parent_id)
            moved.setdefault(item.ns, {}).update(item.new_versions)
            newest[item.ns] = item
    buffered = {(i.ns, i.checkpoint_id) for i in batch if isinstance(i, Put)}
    out: list[Item] = []
    for item in batch:
        if isinstance(item, Put):
            if newest[item.ns] is not item:
                continue
            versions = item.checkpoint["channel_versions"]
            conf = dict(item.config["configurable"])
            conf["checkpoint_id"] = first_parent[item.ns]
            if conf["checkpoint_id"] is None:
                conf.pop("checkpoint_id")
            out.append(Put(
                item.thread_id, item.ns, item.checkpoint_id, first_parent[item.ns],
                {**item.config, "configurable": conf},
                item.checkpoint, item.metadata,
                {ch: versions[ch] for ch in moved[item.ns] if ch in versions},
                item.size, item.at,
            ))
        elif (item.ns, item.checkpoint_id) not in buffered or (
            newest.get(item.ns) is not None
            and newest[item.ns].checkpoint_id == item.checkpoint_id
        ):
            out.append(item)
    return out


def _copied(checkpoint: Checkpoint) -> Checkpoint:
    """A copy of the checkpoint with exactly its keys (LangGraph's `copy_checkpoint` adds
    `pending_sends` and `updated_channels` where they are absent, and they would be stored)."""
    out: dict[str, Any] = {}
    value: Any
    for key, value in checkpoint.items():
        if key == "versions_seen":
            out[key] = {k: dict(v) for k, v in value.items()}
        else:
            out[key] = value.copy() if isinstance(value, dict | list) else value
    return cast(Checkpoint, out)
