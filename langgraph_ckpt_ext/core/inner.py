"""What a wrapping checkpointer (`SmartCheckpointer`, `ReplicatedCheckpointer`) may ask of the
saver it wraps, beyond LangGraph's `BaseCheckpointSaver`: two named protocols, checked once
with `isinstance` when the wrapper is built, never looked up by name at a call.

- `BatchSaver`: stores a sequence of puts and writes as one batch. Ours, and a wrapper of
  ours, implement it; a LangGraph saver does not, and is then written op by op.
- `RowSaver`: a batch can also be prepared as rows (encoded once), written later, and handed to
  another of our stores as it is; or one op written at once, giving back its rows
  (replication). Only our own store-backed savers implement it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from langchain_core.runnables import RunnableConfig
    from langgraph.checkpoint.base import BaseCheckpointSaver

    from .batch import PreparedBatch
    from .store import BatchItem

Op = tuple[Any, ...]
"""`("put", config, checkpoint, metadata, new_versions)` or
`("writes", config, writes, task_id, task_path)`: the arguments of `put` / `put_writes`."""


@runtime_checkable
class BatchSaver(Protocol):
    """Stores ops in order as one batch (one transaction or round trip where it can)."""

    def put_batch(self, ops: Sequence[Op]) -> None: ...

    async def aput_batch(self, ops: Sequence[Op]) -> None: ...


@runtime_checkable
class RowSaver(BatchSaver, Protocol):
    """A `BatchSaver` whose batches are rows: prepared (encoded) once, written later, and
    storable by another saver whose serializer is alike (`rows_compatible`)."""

    def prepare_batch(
        self, ops: Sequence[Op], *, portable: bool = False
    ) -> PreparedBatch | None: ...

    async def aprepare_batch(
        self, ops: Sequence[Op], *, portable: bool = False
    ) -> PreparedBatch | None: ...

    def write_prepared(self, batches: Sequence[PreparedBatch]) -> None: ...

    async def awrite_prepared(self, batches: Sequence[PreparedBatch]) -> None: ...

    def write_op(self, op: Op) -> tuple[RunnableConfig | None, list[BatchItem]]: ...

    async def awrite_op(self, op: Op) -> tuple[RunnableConfig | None, list[BatchItem]]: ...

    def write_rows(self, items: Sequence[BatchItem], *, epoch: int | None = None) -> None: ...

    async def awrite_rows(self, items: Sequence[BatchItem], *, epoch: int | None = None
                          ) -> None: ...

    def rows_compatible(self, other: BaseCheckpointSaver[Any]) -> bool: ...
