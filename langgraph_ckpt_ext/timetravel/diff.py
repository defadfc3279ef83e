"""`diff` / `adiff`: what changed between two stored checkpoints, of one thread or of two (the
result, `StateDiff`, and the comparison of values are `statediff.py`'s)."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver

from ..core.graph import user_values
from ._base import must_get, run_sync, sync_view
from .statediff import StateDiff, diff_values


async def adiff(
    saver: BaseCheckpointSaver[Any],
    a: RunnableConfig,
    b: RunnableConfig,
    *,
    labels: tuple[str, str] | None = None,
) -> StateDiff:
    """What changed from checkpoint `a` to checkpoint `b` (either may be a thread's latest:
    leave out its checkpoint id), in the state's own channels, after any schema upgrade.
    `labels` name the two sides when it is shown (default: `thread@checkpoint_id`)."""
    ta = await must_get(saver, a)
    tb = await must_get(saver, b)
    return diff_values(
        user_values(ta.checkpoint["channel_values"]),
        user_values(tb.checkpoint["channel_values"]),
        labels=labels or (_label(ta.config), _label(tb.config)),
    )


def diff(
    saver: BaseCheckpointSaver[Any],
    a: RunnableConfig,
    b: RunnableConfig,
    *,
    labels: tuple[str, str] | None = None,
) -> StateDiff:
    saver = sync_view(saver)
    return run_sync(saver, adiff(saver, a, b, labels=labels))


def _label(config: RunnableConfig) -> str:
    conf = config["configurable"]
    return f"{conf['thread_id']}@{conf.get('checkpoint_id')}"
