"""LangGraph's saver interface of `ReplicatedCheckpointer` (`put`, `get_tuple`, `list`, ...
and their async twins): each call written once, as a coroutine taking `sync` that picks the
saver's method with `either`, and run by a one-line front pair (`run_inline` or `await`).
Writes go through `Writer` (`writes.py`), reads through `Failover` (`failover.py`)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Coroutine, Iterator, Mapping, Sequence
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    DeltaChannelHistory,
)

from ...core.bridge import either, run_inline
from ...core.filters import validate_filter
from .calls import ready
from .failover import Failover
from .writes import Writer

_END: Any = object()


class SaverInterface(BaseCheckpointSaver[Any]):
    """The saver methods, over the failover and the writer the subclass sets up."""

    _failover: Failover
    _writer: Writer

    @property
    def primary(self) -> BaseCheckpointSaver[Any]:
        """Where writes and reads go: the primary given, or the replica promoted in its
        place."""
        return self._failover.primary

    # -- writing (`writes.py`) ----------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        return run_inline(self._writer.put(True, self.serde, config, checkpoint, metadata,
                                           new_versions))

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        return await self._writer.put(False, self.serde, config, checkpoint, metadata,
                                      new_versions)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]], task_id: str,
                   task_path: str = "") -> None:
        run_inline(self._writer.put_writes(True, self.serde, config, writes, task_id, task_path))

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        await self._writer.put_writes(False, self.serde, config, writes, task_id, task_path)

    def delete_thread(self, thread_id: str) -> None:
        run_inline(self._delete_thread(True, thread_id))

    async def adelete_thread(self, thread_id: str) -> None:
        await self._delete_thread(False, thread_id)

    def _delete_thread(self, sync: bool, thread_id: str) -> Coroutine[Any, Any, None]:
        return self._writer.write(
            sync, "delete", lambda s: either(sync, s.delete_thread, s.adelete_thread, thread_id),
            (thread_id,), (str(thread_id),))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        run_inline(self._delete_for_runs(True, list(run_ids)))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self._delete_for_runs(False, list(run_ids))

    def _delete_for_runs(self, sync: bool, ids: list[str]) -> Coroutine[Any, Any, None]:
        return self._writer.write(
            sync, "delete_runs", lambda s: either(sync, s.delete_for_runs, s.adelete_for_runs, ids),
            (ids,), ())

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        run_inline(self._copy_thread(True, source_thread_id, target_thread_id))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self._copy_thread(False, source_thread_id, target_thread_id)

    def _copy_thread(self, sync: bool, *args: str) -> Coroutine[Any, Any, None]:
        return self._writer.write(
            sync, "copy", lambda s: either(sync, s.copy_thread, s.acopy_thread, *args), args,
            tuple(map(str, args)))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        run_inline(self._prune(True, list(thread_ids), strategy))

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self._prune(False, list(thread_ids), strategy)

    def _prune(self, sync: bool, ids: list[str], strategy: str) -> Coroutine[Any, Any, None]:
        return self._writer.write(
            sync, "prune", lambda s: either(sync, s.prune, s.aprune, ids, strategy=strategy),
            (ids, strategy), tuple(map(str, ids)))

    # -- reading (`failover.py`) ---------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return run_inline(self._get_tuple(True, config))

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        return await self._get_tuple(False, config)

    def _get_tuple(self, sync: bool, config: RunnableConfig
                   ) -> Coroutine[Any, Any, CheckpointTuple | None]:
        return self._failover.call(
            sync, lambda s: either(sync, s.get_tuple, s.aget_tuple, config))

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None, limit: int | None = None
             ) -> Iterator[CheckpointTuple]:
        validate_filter(filter)  # raise here, not at the first next()
        # Fail over only before the first item: a listing never mixes two stores.
        return run_inline(self._failover.call(True, lambda s: ready(_started(
            s.list(config, filter=filter, before=before, limit=limit)))))

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None, limit: int | None = None
                    ) -> AsyncIterator[CheckpointTuple]:
        validate_filter(filter)
        first, rest = await self._failover.call(False, lambda s: _astarted(
            s.alist(config, filter=filter, before=before, limit=limit)))
        if first is _END:
            return
        yield first
        async for tup in rest:
            yield tup

    def get_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                  ) -> Mapping[str, DeltaChannelHistory]:
        return run_inline(self._delta_history(True, config, channels))

    async def aget_delta_channel_history(self, *, config: RunnableConfig, channels: Sequence[str]
                                         ) -> Mapping[str, DeltaChannelHistory]:
        return await self._delta_history(False, config, channels)

    def _delta_history(self, sync: bool, config: RunnableConfig, channels: Sequence[str]
                       ) -> Coroutine[Any, Any, Mapping[str, DeltaChannelHistory]]:
        return self._failover.call(sync, lambda s: either(
            sync, s.get_delta_channel_history, s.aget_delta_channel_history, config=config,
            channels=channels))

    def get_next_version(self, current: Any, channel: Any = None) -> Any:
        return self.primary.get_next_version(current, channel)


def _started(it: Iterator[CheckpointTuple]) -> Iterator[CheckpointTuple]:
    """Take the first item now (so that a failing store fails here), then the rest."""
    first = next(it, _END)
    if first is _END:
        return iter(())

    def rest() -> Iterator[CheckpointTuple]:
        yield first
        yield from it

    return rest()


async def _astarted(it: AsyncIterator[CheckpointTuple]
                    ) -> tuple[Any, AsyncIterator[CheckpointTuple]]:
    first = await anext(it, _END)
    return first, it
