"""A walk up a thread's parent links that always ends.

Stored rows can be altered (or copied in by hand) so that a checkpoint's parent is one of its
descendants; every walk from a checkpoint to its ancestors goes through `ParentWalk`, which
raises `CorruptChainError` naming the rows instead of looping forever.
"""

from __future__ import annotations

from .errors import CorruptChainError

MAX_CHAIN = 1_000_000
"""Ancestors a walk may meet: far past any real thread, short of exhausting memory."""


class ParentWalk:
    """The checkpoints a walk up one namespace's parent links has met, in order."""

    __slots__ = ("_ns", "_order", "_thread_id")

    def __init__(self, thread_id: str, ns: str) -> None:
        self._thread_id, self._ns = thread_id, ns
        self._order: dict[str, int] = {}  # checkpoint id -> its place in the walk

    def visit(self, checkpoint_id: str) -> None:
        """Go on to `checkpoint_id`; `CorruptChainError` if the walk met it already (a cycle)
        or has gone `MAX_CHAIN` steps."""
        if checkpoint_id in self._order:
            cycle = [*list(self._order)[self._order[checkpoint_id]:], checkpoint_id]
            shown = cycle if len(cycle) <= 8 else [*cycle[:4], "...", *cycle[-3:]]
            raise CorruptChainError(
                f"the parent links of {self._where()} form a cycle: {' -> '.join(shown)} (each "
                "one's parent_checkpoint_id names the next): the stored rows were altered; "
                "delete or repair these checkpoints"
            )
        if len(self._order) >= MAX_CHAIN:
            raise CorruptChainError(
                f"the parent chain of {self._where()} runs past {MAX_CHAIN} checkpoints at "
                f"{checkpoint_id!r}: the stored rows were altered"
            )
        self._order[checkpoint_id] = len(self._order)

    def _where(self) -> str:
        return f"thread {self._thread_id!r}" + (f", namespace {self._ns!r}" if self._ns else "")
