"""What the time-travel helpers share: reading checkpoints with clear errors, and the configs
they name (each sync helper runs its async twin through `core.bridge.run_sync`)."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple

from ..core.bridge import run_sync
from ..core.errors import (
    CheckpointNotFoundError,
    InvalidConfigError,
    ThreadExistsError,
    ThreadNotFoundError,
)

__all__ = [
    "CheckpointNotFoundError", "ThreadExistsError", "ThreadNotFoundError", "ids_of", "must_get",
    "run_sync", "thread_config", "thread_exists",
]


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
