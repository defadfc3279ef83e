"""Types a serializer refused to construct: LangGraph's serializer returns their raw data
instead (and logs a warning); a copy reports them, an import refuses them."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from langgraph.checkpoint.serde.base import SerializerProtocol

_watch_lock = threading.Lock()
_watchers: list[set[str]] = []
_local = threading.local()
_listening = False


def _on_serde_event(event: Mapping[str, Any]) -> None:
    if not str(event.get("kind", "")).endswith("_blocked"):
        return
    name = f"{event.get('module')}.{event.get('name')}"
    with _watch_lock:
        for seen in _watchers:
            seen.add(name)
    strict = getattr(_local, "blocked", None)
    if strict is not None:
        strict.append(name)


def _listen() -> None:
    global _listening
    with _watch_lock:
        if _listening:
            return
        _listening = True
    try:
        from langgraph.checkpoint.serde.event_hooks import register_serde_event_listener
    except ImportError:  # pragma: no cover - an older langgraph-checkpoint
        return
    register_serde_event_listener(_on_serde_event)


@contextlib.contextmanager
def blocked_types() -> Iterator[set[str]]:
    """The types any serializer of this process refused to construct meanwhile."""
    _listen()
    seen: set[str] = set()
    with _watch_lock:
        _watchers.append(seen)
    try:
        yield seen
    finally:
        with _watch_lock:
            _watchers.remove(seen)


def loads_strict(serde: SerializerProtocol, typed: tuple[str, bytes]) -> Any:
    """`serde.loads_typed`, refusing a value holding a type the serializer would not construct
    (LangGraph's serializer returns its raw data instead, and logs a warning)."""
    _listen()
    blocked: list[str] = []
    _local.blocked = blocked
    try:
        value = serde.loads_typed(typed)
    finally:
        _local.blocked = None
    if blocked:
        raise ValueError(
            f"it holds a value of type {blocked[0]}, which the serializer does not allow "
            "(pass a serde that allows it, if the file is trusted)"
        )
    return value
