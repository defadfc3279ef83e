"""What this package knows of LangGraph's graphs, in one place (pure; no I/O): the names of
LangGraph's own channels and writes, which channels are the state's, and which nodes a stored
checkpoint triggers."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from langgraph._internal._constants import (
    ERROR,
    ERROR_SOURCE_NODE,
    INTERRUPT,
    NULL_TASK_ID,
    RESUME,
)

START = "__start__"
"""The channel holding the input a run was started with (read by the `__start__` node)."""
BRANCH = "branch:to:"
"""Prefix of the channel that triggers a node of a StateGraph (`branch:to:<node>`)."""

__all__ = [
    "BRANCH", "ERROR", "ERROR_SOURCE_NODE", "INTERRUPT", "NULL_TASK_ID", "RESUME", "START",
    "is_reserved", "next_nodes", "user_values",
]


def is_reserved(channel: str) -> bool:
    """LangGraph's own channels (`__start__`, `__interrupt__`, `branch:to:x`): a name starting
    with `__` or holding `:`; every other channel is a field of the state."""
    return channel.startswith("__") or ":" in channel


def user_values(values: Mapping[str, Any]) -> dict[str, Any]:
    """The state's own channels, without LangGraph's (`__start__`, `branch:to:x`, ...)."""
    return {k: v for k, v in values.items() if not is_reserved(k)}


def next_nodes(checkpoint: Mapping[str, Any]) -> tuple[str, ...]:
    """Nodes triggered at a checkpoint: those whose `branch:to:` channel holds a value at a
    version newer than the one they last saw (how a StateGraph schedules its nodes)."""
    versions = checkpoint.get("channel_versions") or {}
    values = checkpoint.get("channel_values") or {}
    seen = checkpoint.get("versions_seen") or {}
    out = []
    for channel, version in versions.items():
        if channel not in values:
            continue
        if channel == START:  # the input, read by the __start__ node
            node = START
        elif channel.startswith(BRANCH):
            node = channel[len(BRANCH):]
        else:
            continue
        last = (seen.get(node) or {}).get(channel)
        try:
            newer = last is None or version > last
        except TypeError:
            newer = str(version) > str(last)
        if newer:
            out.append(node)
    return tuple(sorted(out))
