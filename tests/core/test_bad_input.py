"""Bad input gets a clear error and leaves what is stored untouched."""

from __future__ import annotations

import dataclasses
import logging
import threading
from typing import Any, ClassVar

import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_ckpt_ext import InvalidConfigError, InvalidFilterError, SerializationError
from langgraph_ckpt_ext.core.rows import BlobRow
from tests.support.graphs import chat_graph, human
from tests.support.savers import SaverHandle


def _cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, "checkpoint_ns": ""}}


def _snapshot(saver: Any) -> list[tuple[str, Any]]:
    return [(t.config["configurable"]["checkpoint_id"], t.checkpoint["channel_values"])
            for t in saver.list(None)]


def test_missing_thread_id(saver: Any) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    graph.invoke({"messages": [human("hi")]}, _cfg("keep"))
    before = _snapshot(saver)
    for call in (
        lambda: saver.get_tuple({"configurable": {}}),
        lambda: saver.put({"configurable": {}}, empty_checkpoint(), {}, {}),
        lambda: saver.put_writes({"configurable": {"checkpoint_id": "x"}}, [("a", 1)], "t"),
        lambda: graph.invoke({"messages": [human("x")]}, {"configurable": {}}),
    ):
        with pytest.raises(ValueError, match="thread_id"):
            call()
    with pytest.raises(InvalidConfigError, match="thread_id"):
        saver.get_tuple({"configurable": {"checkpoint_ns": ""}})
    assert _snapshot(saver) == before


@pytest.mark.parametrize(
    "bad",
    [
        {"x') OR 1=1 --": "a"},
        {"source; DROP TABLE lgx_checkpoints": "loop"},
        {"$.source": "loop"},
        {"": 1},
        {"source": object()},
        {1: "a"},
    ],
)
def test_malicious_or_malformed_filter(saver: Any, bad: dict[Any, Any]) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    graph.invoke({"messages": [human("hi")]}, _cfg("f"))
    before = _snapshot(saver)
    with pytest.raises(InvalidFilterError, match="filter"):
        list(saver.list(_cfg("f"), filter=bad))
    assert _snapshot(saver) == before
    assert len(list(saver.list(_cfg("f"), filter={"source": "loop"}))) == 2


async def test_malformed_filter_async(saver: Any) -> None:
    with pytest.raises(InvalidFilterError, match=r"x'\) OR 1=1 --"):
        _ = [t async for t in saver.alist(None, filter={"x') OR 1=1 --": 1})]


def test_unserializable_value_names_channel(saver: Any) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    graph.invoke({"messages": [human("hi")]}, _cfg("s"))
    before = _snapshot(saver)
    cp = empty_checkpoint()
    cp["channel_values"] = {"good": 1, "handle": threading.Lock()}
    cp["channel_versions"] = {"good": 1, "handle": 1}
    with pytest.raises(SerializationError, match="channel 'handle'"):
        saver.put(_cfg("s"), cp, {}, {"good": 1, "handle": 1})
    with pytest.raises(SerializationError, match="channel 'sock'"):
        saver.put_writes(
            {"configurable": {"thread_id": "s", "checkpoint_ns": "", "checkpoint_id": before[0][0]}},
            [("sock", threading.Lock())], "task-1",
        )
    assert _snapshot(saver) == before
    assert saver.get_tuple(_cfg("s")).pending_writes == []


@dataclasses.dataclass
class Boom:
    """A class that must never be constructed from stored data."""

    payload: str = "rm -rf /"
    constructed: ClassVar[int] = 0

    def __post_init__(self) -> None:
        Boom.constructed += 1


def test_blob_naming_class_outside_allowlist_is_refused(
    saver: Any, saver_handle: SaverHandle, caplog: pytest.LogCaptureFixture
) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    graph.invoke({"messages": [human("hi")]}, _cfg("evil"))
    tup = saver.get_tuple(_cfg("evil"))
    version = tup.checkpoint["channel_versions"]["messages"]
    # What an attacker with write access to the store would plant: a value that names a class.
    planted = JsonPlusSerializer(allowed_msgpack_modules=True).dumps_typed([Boom()])
    Boom.constructed = 0
    store = saver._store
    row = BlobRow("messages", repr(version) if isinstance(version, float) else str(version),
                  *planted)
    store_write = getattr(store, "blobs", None)
    if store_write is not None:  # in-memory
        store.blobs[("evil", "")][("messages", row.version)] = row
    elif hasattr(store, "prefix"):  # Redis: overwrite the blob's hash field
        client = saver_handle.redis_client()
        try:
            field = "\0".join(("", "messages", row.version))
            client.hset(store.keys("evil")[3], field, b"\0" + row.type.encode() + b"\0" + row.data)
        finally:
            client.close()
    elif hasattr(store, "_run"):  # PostgreSQL
        saver.run_sync(store._run(lambda conn: conn.execute(
            "UPDATE lgx_blobs SET type = $1, data = $2, base_version = NULL "
            "WHERE thread_id = $3 AND channel = $4 AND version = $5",
            row.type, row.data, "evil", "messages", row.version,
        ), tx=True))
    else:
        saver.run_sync(store._commits.submit(lambda conn: conn.execute(
            "UPDATE lgx_blobs SET type = ?, data = ?, base_version = NULL "
            "WHERE thread_id = ? AND channel = ? AND version = ?",
            (row.type, row.data, "evil", "messages", row.version),
        )))
    saver._log.forget("evil")  # read as a process that did not write the value would
    with caplog.at_level(logging.WARNING):
        value = saver.get_tuple(_cfg("evil")).checkpoint["channel_values"]["messages"]
        graph.get_state(_cfg("evil"))
    assert Boom.constructed == 0
    assert not any(isinstance(v, Boom) for v in value)
    assert value == [{"payload": "rm -rf /"}]  # the raw fields, never the object
