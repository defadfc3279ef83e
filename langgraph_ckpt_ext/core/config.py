"""Reading `RunnableConfig` values the way every backend needs them."""

from __future__ import annotations

from typing import Any

from langchain_core.runnables import RunnableConfig

from .errors import InvalidConfigError


def _configurable(config: RunnableConfig | None) -> dict[str, Any]:
    if not isinstance(config, dict):
        raise InvalidConfigError(
            f"expected a RunnableConfig dict, got {type(config).__name__}; "
            'pass {"configurable": {"thread_id": ...}}'
        )
    conf = config.get("configurable")
    return conf if isinstance(conf, dict) else {}


def thread_id_of(config: RunnableConfig | None) -> str:
    """The config's `thread_id` as a string; `InvalidConfigError` when it is missing."""
    tid = _configurable(config).get("thread_id")
    if tid is None or tid == "":
        raise InvalidConfigError(
            "config['configurable']['thread_id'] is missing: a checkpointer stores state per "
            'thread, so call the graph with {"configurable": {"thread_id": "<some id>"}}'
        )
    return str(tid)


def checkpoint_ns_of(config: RunnableConfig | None) -> str:
    ns = _configurable(config).get("checkpoint_ns")
    return "" if ns is None else str(ns)


def checkpoint_id_of(config: RunnableConfig | None) -> str | None:
    cid = _configurable(config).get("checkpoint_id")
    return None if cid in (None, "") else str(cid)


def writes_checkpoint_of(config: RunnableConfig | None) -> str:
    """The checkpoint that `put_writes` writes to; `InvalidConfigError` when it is missing."""
    cid = checkpoint_id_of(config)
    if cid is None:
        raise InvalidConfigError(
            "put_writes needs config['configurable']['checkpoint_id']: the checkpoint "
            "these writes belong to (the config that put returned)"
        )
    return cid


def make_config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }
