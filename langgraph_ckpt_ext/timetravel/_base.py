"""What the time-travel helpers share: reading checkpoints with clear errors, and the configs
they name (each sync helper runs its async twin through `core.bridge.run_sync`)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
)

from ..core.bridge import run_sync
from ..core.errors import (
    CheckpointNotFoundError,
    InvalidConfigError,
    ThreadExistsError,
    ThreadNotFoundError,
)

__all__ = [
    "CheckpointNotFoundError", "ThreadExistsError", "ThreadNotFoundError", "ids_of", "must_get",
    "run_sync", "sync_view", "thread_config", "thread_exists",
]


def sync_view(saver: BaseCheckpointSaver[Any]) -> BaseCheckpointSaver[Any]:
    """The saver a sync helper runs its async twin over: ours as they are; any other one seen
    through `SyncBacked`, so that a saver with sync methods only (LangGraph's `SqliteSaver`)
    serves the helpers too."""
    if type(saver).__module__.startswith("langgraph_ckpt_ext."):
        return saver
    return SyncBacked(saver)


class SyncBacked(BaseCheckpointSaver[Any]):
    """Another saver, whose async methods fall back to its sync ones where it has none (they
    raise `NotImplementedError`): the sync method then runs in place, in the event loop
    `run_sync` made for the helper (which nothing else uses)."""

    def __init__(self, inner: BaseCheckpointSaver[Any]) -> None:
        super().__init__(serde=inner.serde)
        self.inner = inner

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def get_next_version(self, current: Any, channel: Any = None) -> Any:
        return self.inner.get_next_version(current, channel)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return self.inner.get_tuple(config)

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        return self.inner.list(config, filter=filter, before=before, limit=limit)

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return self.inner.put(config, checkpoint, metadata, new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        self.inner.put_writes(config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        self.inner.delete_thread(thread_id)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        try:
            return await self.inner.aget_tuple(config)
        except NotImplementedError:
            return self.inner.get_tuple(config)

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        items = self.inner.alist(config, filter=filter, before=before, limit=limit)
        try:
            first = await items.__anext__()
        except StopAsyncIteration:
            return
        except NotImplementedError:
            # read whole before the first item: a sync listing may hold its saver's lock (the
            # SqliteSaver's) until it ends, and a helper stops reading early
            for tup in builtins.list(
                    self.inner.list(config, filter=filter, before=before, limit=limit)):
                yield tup
            return
        yield first
        async for tup in items:
            yield tup

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions
                   ) -> RunnableConfig:
        try:
            return await self.inner.aput(config, checkpoint, metadata, new_versions)
        except NotImplementedError:
            return self.inner.put(config, checkpoint, metadata, new_versions)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        try:
            await self.inner.aput_writes(config, writes, task_id, task_path)
        except NotImplementedError:
            self.inner.put_writes(config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        try:
            await self.inner.adelete_thread(thread_id)
        except NotImplementedError:
            self.inner.delete_thread(thread_id)


def thread_config(thread_id: str, ns: str = "", checkpoint_id: str | None = None) -> RunnableConfig:
    conf: dict[str, Any] = {"thread_id": thread_id, "checkpoint_ns": ns}
    if checkpoint_id is not None:
        conf["checkpoint_id"] = checkpoint_id
    return {"configurable": conf}


def ids_of(config: RunnableConfig) -> tuple[str, str, str | None]:
    """(thread_id, checkpoint_ns, checkpoint_id or None) of a config, checked."""
    conf = (config or {}).get("configurable") or {}
    thread_id = conf.get("thread_id")
    if thread_id in (None, ""):
        raise InvalidConfigError(
            "the config names no thread: pass {'configurable': {'thread_id': ...}} (optionally "
            "with 'checkpoint_id')"
        )
    return str(thread_id), str(conf.get("checkpoint_ns") or ""), conf.get("checkpoint_id")


async def must_get(saver: BaseCheckpointSaver[Any], config: RunnableConfig) -> CheckpointTuple:
    """The checkpoint a config names (the thread's latest without a checkpoint_id), or a clear
    `CheckpointNotFoundError`."""
    thread_id, ns, checkpoint_id = ids_of(config)
    tup = await saver.aget_tuple(thread_config(thread_id, ns, checkpoint_id))
    if tup is None:
        where = f"thread {thread_id!r}" + (f", namespace {ns!r}" if ns else "")
        if checkpoint_id is None:
            raise ThreadNotFoundError(f"{where} has no checkpoint: is the thread id right?")
        raise CheckpointNotFoundError(f"checkpoint {checkpoint_id!r} is not stored in {where}")
    return tup


async def thread_exists(saver: BaseCheckpointSaver[Any], thread_id: str) -> bool:
    """Whether any namespace of the thread holds a checkpoint."""
    async for _ in saver.alist({"configurable": {"thread_id": thread_id}}, limit=1):
        return True
    return False
