"""The time-travel helpers as methods of our checkpointers (`checkpointer.history(...)`), and
`verify` of the audit trail: mixins of the public classes (backends and wrappers), over the
core saver."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from ..core.config import check_id
from ..core.saver import StoreCheckpointer
from .audit import AuditReport, verify_thread
from .diff import adiff, diff
from .fork import ForkNode, afork, alineage, fork, lineage
from .history import (
    HistoryEntry,
    HistoryPage,
    Inspection,
    ahistory,
    ahistory_page,
    ainspect,
    history,
    history_page,
    inspect,
)
from .replay import Transition, areplay, replay
from .statediff import StateDiff


class TimeTravel:
    """Mixed into the backends' checkpointers and the wrappers: each method calls the helper
    of the same name in `langgraph_ckpt_ext.timetravel` with this checkpointer."""

    def _saver(self) -> BaseCheckpointSaver[Any]:
        assert isinstance(self, BaseCheckpointSaver)
        return self

    def history(
        self, thread_id: str, *, metadata_only: bool = False,
        filter: Mapping[str, Any] | None = None, subgraphs: bool = False,
        before: RunnableConfig | str | None = None, limit: int | None = None,
        checkpoint_ns: str | None = None,
    ) -> Iterator[HistoryEntry]:
        """A thread's checkpoints, newest first, a page at a time (see `timetravel.history`)."""
        return history(self._saver(), thread_id, metadata_only=metadata_only,
                               filter=filter, subgraphs=subgraphs, before=before, limit=limit,
                               checkpoint_ns=checkpoint_ns)

    def ahistory(
        self, thread_id: str, *, metadata_only: bool = False,
        filter: Mapping[str, Any] | None = None, subgraphs: bool = False,
        before: RunnableConfig | str | None = None, limit: int | None = None,
        checkpoint_ns: str | None = None,
    ) -> AsyncIterator[HistoryEntry]:
        return ahistory(self._saver(), thread_id, metadata_only=metadata_only,
                                filter=filter, subgraphs=subgraphs, before=before, limit=limit,
                                checkpoint_ns=checkpoint_ns)

    def history_page(self, thread_id: str, **kwargs: Any) -> HistoryPage:
        return history_page(self._saver(), thread_id, **kwargs)

    async def ahistory_page(self, thread_id: str, **kwargs: Any) -> HistoryPage:
        return await ahistory_page(self._saver(), thread_id, **kwargs)

    def inspect(self, config: RunnableConfig) -> Inspection:
        """The state at one checkpoint (see `timetravel.inspect`)."""
        return inspect(self._saver(), config)

    async def ainspect(self, config: RunnableConfig) -> Inspection:
        return await ainspect(self._saver(), config)

    def diff(
        self, a: RunnableConfig, b: RunnableConfig, *, labels: tuple[str, str] | None = None
    ) -> StateDiff:
        """What changed from checkpoint `a` to checkpoint `b` (see `timetravel.diff`)."""
        return diff(self._saver(), a, b, labels=labels)

    async def adiff(
        self, a: RunnableConfig, b: RunnableConfig, *, labels: tuple[str, str] | None = None
    ) -> StateDiff:
        return await adiff(self._saver(), a, b, labels=labels)

    def fork(
        self, config: RunnableConfig, new_thread_id: str | None = None,
        values: Mapping[str, Any] | None = None, *, graph: Any = None, as_node: str | None = None,
        resume: Any = None,
    ) -> RunnableConfig:
        """A new thread holding the history up to a checkpoint (see `timetravel.fork`)."""
        return fork(self._saver(), config, new_thread_id, values, graph=graph,
                         as_node=as_node, resume=resume)

    async def afork(
        self, config: RunnableConfig, new_thread_id: str | None = None,
        values: Mapping[str, Any] | None = None, *, graph: Any = None, as_node: str | None = None,
        resume: Any = None,
    ) -> RunnableConfig:
        return await afork(self._saver(), config, new_thread_id, values, graph=graph,
                                as_node=as_node, resume=resume)

    def replay(
        self, start: RunnableConfig, end: RunnableConfig | None = None, *, graph: Any = None
    ) -> list[Transition]:
        """The steps between two checkpoints, from stored data (see `timetravel.replay`)."""
        return replay(self._saver(), start, end, graph=graph)

    async def areplay(
        self, start: RunnableConfig, end: RunnableConfig | None = None, *, graph: Any = None
    ) -> list[Transition]:
        return await areplay(self._saver(), start, end, graph=graph)

    def lineage(self, thread_id: str) -> ForkNode:
        """The fork tree a thread belongs to (see `timetravel.lineage`)."""
        return lineage(self._saver(), thread_id)

    async def alineage(self, thread_id: str) -> ForkNode:
        return await alineage(self._saver(), thread_id)


class Verifying:
    """`verify` of the audit trail, mixed into the backends' checkpointers (subclasses of
    `StoreCheckpointer`; the wrappers forward it to the one they wrap)."""

    def _own(self) -> StoreCheckpointer:
        if not isinstance(self, StoreCheckpointer):  # pragma: no cover - a wrong mix
            raise TypeError(f"{type(self).__name__} mixes in Verifying without StoreCheckpointer")
        return self

    def verify(self, thread_id: str) -> AuditReport:
        """Check a thread's audit chain against storage: every namespace, oldest first.

        Each checkpoint's hash is recomputed from its stored rows (no cache, no schema upgrade)
        and its `prev` compared with its parent's stored hash. The report lists, oldest first,
        checkpoints altered, whose parent is gone, whose parent was replaced, or without a
        hash (see `langgraph_ckpt_ext.timetravel.audit`). Records sealed with a key are checked
        under this checkpointer's `audit_keys` (the key id each names); with keys given, an
        unkeyed record is a problem too (`unkeyed`), and so is one sealed under a key id they
        do not hold (`unknown_key`). Raises `ThreadNotFoundError` for a thread with no
        checkpoint.
        """
        return self._own().run_sync(self.averify(thread_id))

    async def averify(self, thread_id: str) -> AuditReport:
        own = self._own()
        return await verify_thread(
            own.stored, check_id(thread_id, "thread_id", required=True), own._auditor.keys)
