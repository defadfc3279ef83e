"""The pure core, tested without any server: append-deltas, filters, versions, the bridge,
the storage-migration chain, and DeltaChannel support."""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import operator
import subprocess
import sys
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, RemoveMessage
from langgraph.channels.delta import DeltaChannel
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, PrivateAttr, model_serializer

from langgraph_ckpt_ext import InMemoryCheckpointer, SQLiteCheckpointer, connect
from langgraph_ckpt_ext.backends.sqlite.migrations import LATEST, MIGRATIONS
from langgraph_ckpt_ext.core.appendlog import AppendLog
from langgraph_ckpt_ext.core.bridge import Bridge
from langgraph_ckpt_ext.core.errors import InvalidConfigError, StorageVersionError
from langgraph_ckpt_ext.core.filters import matches, validate_filter
from langgraph_ckpt_ext.core.versions import next_version, version_key
from tests.support.graphs import chat_graph, human
from tests.support.savers import SaverHandle, open_saver

# -- append-deltas ------------------------------------------------------------------------


def _listed(value: list[Any]) -> Any:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_ckpt_ext.core.appendlog import list_bytes

    return list_bytes(JsonPlusSerializer().dumps_typed(value)[1])


def _chain_lengths(log: AppendLog, n: int) -> tuple[list[int], list[int]]:
    """Write a list growing by one item n times; chain length and stored items per write."""
    rows: dict[str, tuple[str | None, int]] = {}  # version -> (base, n items stored)
    value: list[int] = []
    lengths, stored = [], []
    for i in range(n):
        value = [*value, i]
        version = f"v{i:05d}"
        plan = log.plan("t", "", "ch", version, _listed(value))
        rows[version] = (plan.base, len(value) - plan.start)
        log.commit("t", "", "ch", plan)
        depth, cursor = 1, plan.base
        while cursor is not None:
            depth, cursor = depth + 1, rows[cursor][0]
        lengths.append(depth)
        stored.append(len(value) - plan.start)
    return lengths, stored


def test_append_chain_is_bounded_with_full_snapshot_every_k() -> None:
    lengths, stored = _chain_lengths(AppendLog(snapshot_every=16), 200)
    assert max(lengths) <= 5  # log2(16) + 1 rows per read
    fulls = [i for i, s in enumerate(stored) if s == i + 1]
    assert fulls[0] == 0 and all(b - a <= 16 for a, b in itertools.pairwise(fulls))
    # Each item is rewritten about log2(K) times, not once per version as a full rewrite would.
    assert sum(stored) < 200 * 200 / 2 / 10


def test_append_plan_full_when_list_changes_otherwise() -> None:
    log = AppendLog()
    first = log.plan("t", "", "m", "1", _listed(["a", "b"]))
    assert first.base is None
    log.commit("t", "", "m", first)
    grown = log.plan("t", "", "m", "2", _listed(["a", "b", "c"]))
    assert (grown.base, grown.start) == ("1", 2)
    log.commit("t", "", "m", grown)
    edited = log.plan("t", "", "m", "3", _listed(["a", "X", "c", "d"]))
    assert edited.base is None
    # a last item that grew ("c" -> "cc"): the old bytes are a prefix of the new, the items not
    assert log.plan("t", "", "m", "4", _listed(["a", "b", "cc"])).base is None
    assert log.plan("other-thread", "", "m", "1", _listed(["a", "b", "c"])).base is None


class Tagged(BaseModel):
    """Serialized through a hook that reads a private attribute: not a plain model."""

    text: str
    _tag: str = PrivateAttr(default="a")

    @model_serializer
    def _dump(self) -> dict[str, Any]:
        return {"text": self.text, "tag": self._tag}


class Shout(str):
    pass


def test_item_marks_tell_every_change_that_alters_the_bytes() -> None:
    """Two items share a mark only if they serialize alike: a change of type with the same
    fields, a private attribute a model's serializer reads, a subclass of str, a change deep
    inside, -0.0 against 0.0; then a list reusing the marked bytes is byte-identical."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_ckpt_ext.core import codec

    serde = JsonPlusSerializer()

    def mark(item: Any) -> Any:
        return codec.chunk_mark([item])

    assert mark(AIMessage("x", id="1")) == mark(AIMessage("x", id="1"))
    assert mark(AIMessage("x", id="1")) != mark(HumanMessage("x", id="1"))
    tagged, retagged = Tagged(text="t"), Tagged(text="t")
    retagged._tag = "b"
    assert serde.dumps_typed(tagged) != serde.dumps_typed(retagged)
    assert mark(tagged) != mark(retagged)
    assert mark("x") != mark(Shout("x")) and mark(0.0) != mark(-0.0) and mark(1) != mark(True)
    deep = {"a": [{"b": 1}]}
    before = mark(deep)
    deep["a"][0]["b"] = 2
    assert mark(deep) != before
    assert mark(lambda: 1) is None  # cannot be pickled: always serialized again

    first = [AIMessage("x", id="1"), tagged, "x", 0.0, {"a": [{"b": 1}]}]
    last = codec.encode_items(serde, first, None, "m")
    assert last is not None and last.data == serde.dumps_typed(first)[1]
    second = [HumanMessage("x", id="1"), retagged, Shout("x"), -0.0, deep, "new"]
    again = codec.encode_items(serde, second, last, "m")
    assert again is not None and again.data == serde.dumps_typed(second)[1]
    # SmartCheckpointer's frozen values go the same way, one on top of the one before.
    frozen = codec.encode(serde, second, "m", codec.encode(serde, first, "m"))
    assert frozen.typed == serde.dumps_typed(second) and frozen.listed is not None


def test_chunk_marks_reuse_whole_chunks_and_a_grown_last_chunk() -> None:
    """Marks cover chunks of items: a list grown by a few items reuses every chunk before
    and the first items of its grown last chunk, serializing the new items alone; a change
    deep inside one item, a run shared otherwise (equal values), an item of another type,
    an unpicklable item or a shorter list serialize what they touch again; every encoding
    equals the serializer's own."""
    from langchain_core.messages import HumanMessage
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_ckpt_ext.core import codec

    serde = JsonPlusSerializer()
    asked: list[int] = []
    real = serde.dumps_typed

    def counting(value: Any) -> tuple[str, bytes]:
        asked.append(len(value))
        return real(value)

    serde.dumps_typed = counting  # type: ignore[method-assign]
    size = codec._CHUNK
    value: list[Any] = [AIMessage(f"m{i}", id=str(i), additional_kwargs={"n": [i]})
                        for i in range(2 * size + 3)]
    last = codec.encode_items(serde, value, None, "m")
    assert last is not None and len(last.marks or ()) == 3

    def again(new: list[Any]) -> list[int]:
        nonlocal last
        asked.clear()
        out = codec.encode_items(serde, new, last, "m")
        assert out is not None and out.data == real(new)[1]
        last = out
        return list(asked)

    value = [*value, AIMessage("new", id="n1")]
    assert again(value) == [1]  # the new item alone: the last chunk's first three reused
    value = [*value, *(AIMessage(f"x{i}", id=f"x{i}") for i in range(size))]
    assert again(value) == [size - 4, 4]  # the last chunk filled up, and a new one
    value[size + 2].additional_kwargs["n"].append(0)  # in place, deep inside
    assert again(value) == [size]  # its chunk alone
    shared = {"n": [7]}
    value[1] = AIMessage("s", id="s", additional_kwargs=shared)
    value[2] = AIMessage("s", id="s", additional_kwargs=shared)
    assert again(value) == [size]
    value[2] = AIMessage("s", id="s", additional_kwargs={"n": [7]})  # equal, not shared
    assert again(value) == [size]
    value[0] = HumanMessage(value[0].content, id=value[0].id)
    assert again(value) == [size]

    @dataclasses.dataclass
    class Local:  # a class of a function's: pickle cannot name it, msgpack takes it
        x: int

    value[size] = Local(1)
    assert codec.chunk_mark(value[size:2 * size]) is None
    assert again(value) == [size] and again(value) == [size]  # its chunk every time
    value[size] = AIMessage("back", id="back")
    assert again(value) == [size] and again(value) == []
    assert again(value[: size + 5]) == [5]  # shorter: the last chunk again


def test_append_log_is_bounded_in_bytes() -> None:
    log = AppendLog(max_bytes=10_000)
    for i in range(50):
        log.commit(f"t{i}", "", "m", log.plan(f"t{i}", "", "m", "1", _listed(["x" * 900])))
    kept = [k[0] for k in log._chains]
    assert log._chains.total <= 10_000 and kept == [f"t{i}" for i in range(50 - len(kept), 50)]
    assert log.plan("t49", "", "m", "2", _listed(["x" * 900, "y"])).base == "1"
    assert log.plan("t0", "", "m", "2", _listed(["x" * 900, "y"])).base is None  # dropped
    log.forget()
    assert log._chains.total == 0 and not log._chains


def test_lists_serialized_item_by_item_and_byte_identical() -> None:
    """Each put serializes only the chunks of items whose state changed since the list
    stored before (decided from their pickled state, never from the objects); every blob
    equals what the serializer itself gives for that slice; an item changed in place is
    serialized again and the list stored whole; an item the serializer cannot take as
    msgpack falls back to serializing the value whole."""
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    from langgraph_ckpt_ext.core import codec

    serde = JsonPlusSerializer()
    calls = 0
    real = serde.dumps_typed

    def counting(value: Any) -> tuple[str, bytes]:
        nonlocal calls
        calls += 1
        return real(value)

    serde.dumps_typed = counting  # type: ignore[method-assign]
    log = AppendLog(snapshot_every=8)
    items: list[Any] = [AIMessage(content=f"m{i}" * 20, id=str(i)) for i in range(40)]
    items[3] = {"k": [1, None, 2.5]}
    items[5] = None
    value: list[Any] = []
    for i, item in enumerate(items):
        value = [*value, item]
        before = calls
        rows, plans = codec.encode_blobs(serde, log, "t", "", {"m": value}, {"m": float(i + 1)})
        (row,) = rows
        plan = plans["m"]
        assert calls - before == 1
        assert (row.type, row.data) == real(value[plan.start:])
        if row.full is not None:
            assert row.full() == real(value)
        if i > 0 and i % 8:
            assert row.base_version is not None
        log.commit("t", "", "m", plan)
    # The very objects of the last put, two of them changed in place (one deep inside):
    # those two and the new one serialized again, the list stored whole.
    value[10].content = "edited in place"
    value[12].additional_kwargs["deep"] = {"k": [1]}
    log.commit("t", "", "m", codec.encode_blobs(serde, log, "t", "", {"m": value}, {"m": 97.5})[1]["m"])
    value[12].additional_kwargs["deep"]["k"].append(2)
    value = [*value, AIMessage(content="next", id="n")]
    before = calls
    rows, plans = codec.encode_blobs(serde, log, "t", "", {"m": value}, {"m": 98.5})
    assert calls - before == 2  # item 12 (changed again, deep inside) and the new one
    assert plans["m"].base is None and (rows[0].type, rows[0].data) == real(value)
    log.commit("t", "", "m", plans["m"])
    # A fork of an earlier state plus a new item: written whole.
    fork = [*items[:20], AIMessage(content="fork", id="f")]
    rows, plans = codec.encode_blobs(serde, log, "t", "", {"m": fork}, {"m": 99.5})
    assert plans["m"].base is None and (rows[0].type, rows[0].data) == real(fork)
    # Over 15 and 65,535 items: the array header's other forms, as deltas too.
    for n in (16, 70_000):
        big_log = AppendLog()
        big = list(range(n))
        rows, plans = codec.encode_blobs(serde, big_log, "t", "", {"m": big}, {"m": 1.5})
        assert (rows[0].type, rows[0].data) == real(big)
        big_log.commit("t", "", "m", plans["m"])
        grown = [*big, *range(20)]
        rows, _ = codec.encode_blobs(serde, big_log, "t", "", {"m": grown}, {"m": 2.5})
        assert rows[0].base_version == "1.5" and (rows[0].type, rows[0].data) == real(grown[n:])

    lenient = JsonPlusSerializer(pickle_fallback=True)
    odd = [1, complex(1, 2), 2]  # msgpack cannot take a complex: pickled
    rows, _ = codec.encode_blobs(lenient, AppendLog(), "t", "", {"m": odd}, {"m": 1.5})
    assert rows[0].type == "pickle"
    # A serializer of another kind (here wrapping values) is asked for the whole value, and
    # for the new items of a delta.
    seen: list[Any] = []

    class Wrapping(JsonPlusSerializer):
        def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
            seen.append(list(obj))
            return super().dumps_typed(obj)

    wrap_log = AppendLog()
    rows, plans = codec.encode_blobs(Wrapping(), wrap_log, "t", "", {"m": [1, 2]}, {"m": 1.5})
    wrap_log.commit("t", "", "m", plans["m"])
    rows, plans = codec.encode_blobs(Wrapping(), wrap_log, "t", "", {"m": [1, 2, 3]}, {"m": 2.5})
    assert seen == [[1, 2], [1, 2, 3], [3]] and rows[0].base_version == "1.5"


def _blob_rows(saver: Any, thread: str, h: SaverHandle | None = None) -> list[Any]:
    """A thread's stored blob rows, read around `saver` (a Redis one: with its handle `h`)."""
    from langgraph_ckpt_ext.core.rows import BlobRow

    store = saver._store
    if hasattr(store, "blobs"):
        return [b for (tid, _), rows in store.blobs.items() if tid == thread for b in rows.values()]
    if hasattr(store, "prefix"):  # Redis: the thread's blob hash
        assert h is not None
        client = h.redis_client()
        try:
            raw = client.hgetall(store.keys(thread)[3])
        finally:
            client.close()
        out = []
        for field, value in raw.items():
            _, channel, version = field.decode().split("\0")
            base, type_, data = value.split(b"\0", 2)
            out.append(BlobRow(channel, version, type_.decode(), data, base.decode() or None))
        return out
    query = "SELECT channel, version, type, data, base_version FROM lgx_blobs WHERE thread_id = "
    if hasattr(store, "_fetchall"):
        rows = saver.run_sync(store._fetchall(query + "?", (thread,)))
    else:
        rows = saver.run_sync(store._fetch(query + "$1", thread))
    return [BlobRow(*r) for r in rows]


def test_message_list_stored_as_deltas_and_read_back(
    saver: Any, saver_handle: SaverHandle
) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "d"}}
    for i in range(120):
        graph.invoke({"messages": [human(f"message {i} " + "x" * 400)]}, config)
    rows = [b for b in _blob_rows(saver, "d", saver_handle) if b.channel == "messages"]
    deltas = [b for b in rows if b.base_version is not None]
    assert len(deltas) > 0.8 * len(rows)
    full_bytes = sum(len(b.data) for b in rows if b.base_version is None)
    # Whole-list rewrites would store ~ sum over versions of the list: ~240*240/2 messages.
    assert sum(len(b.data) for b in rows) < 0.1 * (240 * 240 / 2) * 450
    assert full_bytes < sum(len(b.data) for b in rows)
    saver._log.forget()  # read back as a process with no memory of the chain would
    values = graph.get_state(config).values
    assert len(values["messages"]) == 240 and values["messages"][-2].content.startswith("message 119")
    for snap in list(graph.get_state_history(config))[::37]:
        turns = snap.values.get("turns", 0)
        assert len(snap.values.get("messages", [])) in (2 * turns, 2 * turns + 1)


def test_delta_whose_base_was_deleted_falls_back_to_full(
    saver: Any, saver_handle: SaverHandle
) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    config = {"configurable": {"thread_id": "p", "checkpoint_ns": ""}}

    def put(items: list[str]) -> Any:
        cp = empty_checkpoint()
        version = saver.get_next_version(None)
        cp["channel_values"], cp["channel_versions"] = {"items": items}, {"items": version}
        return saver.put(config, cp, {}, {"items": version})

    put(["a", "b"])
    forget = saver._log.forget
    saver._log.forget = lambda *a: None  # as if another process deleted the rows
    saver.delete_thread("p")
    stored = put(["a", "b", "c"])  # planned as a delta on a row that is gone
    saver._log.forget = forget
    rows = _blob_rows(saver, "p", saver_handle)
    assert len(rows) == 1 and rows[0].base_version is None  # the store wrote it whole
    last = put(["a", "b", "c", "d"])  # the memory now knows the full row: a delta again
    assert any(r.base_version is not None for r in _blob_rows(saver, "p", saver_handle))
    saver._log.forget()
    assert saver.get_tuple(stored).checkpoint["channel_values"]["items"] == ["a", "b", "c"]
    assert saver.get_tuple(last).checkpoint["channel_values"]["items"] == ["a", "b", "c", "d"]


def test_removed_and_replaced_messages(saver: Any) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "r"}}
    for i in range(4):
        graph.invoke({"messages": [human(f"m{i}")]}, config)
    msgs = graph.get_state(config).values["messages"]
    graph.update_state(config, {"messages": [RemoveMessage(id=msgs[0].id),
                                             AIMessage(content="edited", id=msgs[1].id)]})
    graph.invoke({"messages": [human("after")]}, config)
    contents = [m.content for m in graph.get_state(config).values["messages"]]
    assert contents[:2] == ["edited", "m1"] and contents[-2:] == ["after", "echo: after"]


# -- filters, versions --------------------------------------------------------------------


def test_filter_matching() -> None:
    md = {"source": "loop", "step": 3, "tags": {"team": "a", "env": "prod"}, "flag": True}
    assert matches(md, {"source": "loop", "step": 3})
    assert matches(md, {"tags": {"team": "a"}})
    assert not matches(md, {"tags": {"team": "b"}})
    assert not matches(md, {"step": True}) and not matches(md, {"flag": 1})
    assert not matches(md, {"missing": None})
    assert validate_filter(None) == {}


def test_versions_monotonic_and_distinct_across_forks() -> None:
    v1 = next_version(None)
    v2a, v2b = next_version(v1), next_version(v1)
    assert v2a > v1 and v2b > v1 and v2a != v2b
    assert next_version(v2a) > max(v2a, v2b)
    assert isinstance(next_version(3), float) and next_version(3) > 3
    s = next_version("00000000000000000000000000000007.0.5")
    assert isinstance(s, str) and s > "00000000000000000000000000000007.0.5"
    assert float(version_key(v2a)) == v2a


# -- the bridge -----------------------------------------------------------------------------


def test_bridge_refuses_sync_call_from_its_own_loop() -> None:
    bridge = Bridge()

    async def inner() -> int:
        return 1

    async def reenter() -> None:
        bridge.run(inner())

    with pytest.raises(RuntimeError, match="use the async method"):
        bridge.run(reenter())
    assert bridge.run(inner()) == 1
    bridge.close()


# -- storage migrations ---------------------------------------------------------------------


def test_migration_chain_shape() -> None:
    assert LATEST == len(MIGRATIONS) >= 1
    assert all(step and all(isinstance(s, str) and s.strip() for s in step) for step in MIGRATIONS)


def test_newer_storage_version_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "future.db"
    with SQLiteCheckpointer(db) as saver:
        saver.run_sync(saver._store._commits.submit(lambda conn: conn.execute(
            "INSERT INTO lgx_migrations (version, applied_at) VALUES (?, 'x')", (LATEST + 1,)
        )))
    with pytest.raises(StorageVersionError, match="upgrade"):
        SQLiteCheckpointer(db)


@pytest.mark.postgres
@pytest.mark.redis
def test_import_loads_no_driver_and_connect_urls(tmp_path: Path) -> None:
    code = (
        "import sys, langgraph_ckpt_ext; "
        "assert not {'aiosqlite', 'asyncpg', 'redis'} & set(sys.modules), 'loaded'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    assert isinstance(connect("memory://"), InMemoryCheckpointer)
    with connect(f"sqlite:///{tmp_path / 'u.db'}") as cp:
        assert isinstance(cp, SQLiteCheckpointer) and (tmp_path / "u.db").exists()
    with pytest.raises(ValueError, match="unsupported"):
        connect("mysql://x")
    from langgraph_ckpt_ext import PostgresCheckpointer
    from tests.support.savers import PG_DSN, drop_pg_schemas, pg_schema

    schema = pg_schema()
    try:
        with connect(PG_DSN, schema=schema) as cp:
            assert isinstance(cp, PostgresCheckpointer) and cp.setup() >= 1
        # The URL may carry the schema (the driver never sees it); not twice, though.
        with connect(f"{PG_DSN}?schema={schema}", setup=False) as cp:
            assert cp.storage_version() >= 1
        with connect(f"{PG_DSN}?schema=lgx_test_none&sslmode=disable", setup=False) as cp:
            assert cp.storage_version() == 0
        with pytest.raises(InvalidConfigError, match="twice"):
            connect(f"{PG_DSN}?schema={schema}", schema=schema)
    finally:
        drop_pg_schemas(schema)
    from langgraph_ckpt_ext import RedisCheckpointer
    from tests.support.savers import REDIS_URL, drop_redis_prefixes, redis_prefix

    prefix = redis_prefix()
    try:
        with connect(REDIS_URL, key_prefix=prefix, ttl=60) as cp:
            assert isinstance(cp, RedisCheckpointer) and cp.setup() == 1 and cp.ttl == 60
        with connect(f"{REDIS_URL}?key_prefix={prefix}", setup=False) as cp:
            assert cp.storage_version() == 1
    finally:
        drop_redis_prefixes(prefix)


# -- LangGraph's DeltaChannel ---------------------------------------------------------------


def _extend(state: list[str], writes: list[list[str]]) -> list[str]:
    return state + [x for w in writes for x in w]


class DeltaState(TypedDict):
    events: Annotated[list[str], DeltaChannel(_extend, snapshot_frequency=4)]
    n: Annotated[int, operator.add]


def _delta_graph() -> Any:
    def step(state: DeltaState) -> dict[str, Any]:
        return {"events": [f"e{state.get('n', 0)}"], "n": 1}

    b = StateGraph(DeltaState)
    b.add_node("step", step)
    b.add_edge(START, "step")
    b.add_edge("step", END)
    return b


def test_delta_channel_history_and_prune(saver: Any) -> None:
    ours = _delta_graph().compile(checkpointer=saver)
    ref = _delta_graph().compile(checkpointer=InMemorySaver())
    config = {"configurable": {"thread_id": "dc"}}
    for _ in range(11):
        ours.invoke({"events": ["in"]}, config)
        ref.invoke({"events": ["in"]}, config)
    assert ours.get_state(config).values == ref.get_state(config).values
    assert len(ours.get_state(config).values["events"]) == 22
    fast = saver.get_delta_channel_history(config=config, channels=["events"])
    slow = BaseCheckpointSaver.get_delta_channel_history(saver, config=config, channels=["events"])
    assert fast == slow and fast["events"]["writes"]
    before = ours.get_state(config).values
    saver.prune(["dc"], strategy="keep_latest")
    kept = list(saver.list(config))
    assert 1 <= len(kept) <= 5  # the newest, and the ancestors back to a snapshot
    assert ours.get_state(config).values == before
    ours.invoke({"events": ["more"]}, config)
    assert ours.get_state(config).values["events"][-2:] == ["more", "e11"]


def test_sizes_storage_version_and_prune_plan(saver: Any, backend: str, tmp_path: Path) -> None:
    """`sizes` counts what is stored, natively on each backend; `storage_version` reads
    without creating anything; `prune_plan` names what `prune` then deletes."""
    chat = chat_graph().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "s"}}
    for i in range(3):
        chat.invoke({"messages": [human(f"hello {i}")]}, config)
    sizes = saver.sizes("s")
    listed = [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)]
    rows = {kind: sum(s.rows for s in sizes if s.kind == kind) for kind in ("checkpoint", "blob",
                                                                          "write")}
    assert rows["checkpoint"] == len(listed) and rows["blob"] > 0 and rows["write"] > 0
    assert {"messages", "turns"} <= {s.channel for s in sizes if s.kind == "blob"}
    assert {"messages", "turns"} <= {s.channel for s in sizes if s.kind == "write"}
    by_channel = {(s.kind, s.channel): s.bytes for s in sizes}
    assert by_channel[("checkpoint", "")] > by_channel[("blob", "messages")] > 0
    assert all(s.checkpoint_ns == "" for s in sizes) and saver.sizes("nobody") == []
    assert saver.storage_version() == (0 if backend == "memory" else saver.setup())
    if backend in ("sqlite", "postgres", "redis"):
        (tmp_path / "fresh").mkdir()
        with open_saver(backend, tmp_path / "fresh", setup=False) as fresh:
            assert fresh.saver.storage_version() == 0
    plan = saver.prune_plan("s")
    assert plan == [("", cid) for cid in listed[1:]]
    assert saver.prune_plan("s", strategy="delete") == [("", cid) for cid in listed]
    saver.prune(["s"])
    assert [t.config["configurable"]["checkpoint_id"] for t in saver.list(config)] == listed[:1]
    assert sum(s.rows for s in saver.sizes("s") if s.kind == "checkpoint") == 1


# -- SQLite group commit ----------------------------------------------------------------------


async def test_group_commit_isolates_a_failing_write(tmp_path: Path) -> None:
    import aiosqlite

    from langgraph_ckpt_ext.backends.sqlite.worker import Db, GroupCommit

    conn = await aiosqlite.connect(tmp_path / "g.db", isolation_level=None)
    try:
        await conn.execute("CREATE TABLE t (x INTEGER PRIMARY KEY)")
        commits = GroupCommit(Db(conn))

        def insert(x: int) -> Any:
            return lambda c: c.execute("INSERT INTO t VALUES (?)", (x,)).rowcount

        def broken(c: Any) -> None:
            c.execute("INSERT INTO t VALUES (99)")
            raise RuntimeError("this write fails")

        results = await asyncio.gather(
            *(commits.submit(op) for op in (insert(1), broken, insert(2), insert(1))),
            return_exceptions=True,
        )
        assert results[0] == 1 and results[2] == 1
        assert isinstance(results[1], RuntimeError)
        assert "UNIQUE" in str(results[3])  # a duplicate fails alone, too
        rows = await conn.execute_fetchall("SELECT x FROM t ORDER BY x")
        assert [r[0] for r in rows] == [1, 2]  # 99 rolled back with its failing write
        # While nothing fails, a batch runs without savepoints: one BEGIN, one COMMIT.
        ran: list[str] = []
        await conn.set_trace_callback(ran.append)
        assert await asyncio.gather(*(commits.submit(insert(x)) for x in (3, 4, 5))) == [1, 1, 1]
        await conn.set_trace_callback(None)
        assert ran == ["BEGIN IMMEDIATE", *(f"INSERT INTO t VALUES ({x})" for x in (3, 4, 5)),
                       "COMMIT"]
    finally:
        await conn.close()


def _chatted(tmp_path: Path, turns: int) -> tuple[SQLiteCheckpointer, Any, dict[str, Any]]:
    """A SQLite checkpointer, a chat graph on it, and the config of a thread of `turns` turns."""
    saver = SQLiteCheckpointer(tmp_path / "c.db")
    graph = chat_graph().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "c"}}
    for i in range(turns):
        graph.invoke({"messages": [human(f"m{i}")]}, config)
    return saver, graph, config


def test_copies_held_in_runs_read_as_stored_whatever_callers_do(tmp_path: Path) -> None:
    """A list's copies are kept in runs (one per read that decoded new items), pickled as one
    run again past `codec._RUNS`: across that, every read of a growing thread equals what a
    fresh process decodes, and what a caller does to the items it got (changed, shared
    objects appended to) never reaches a later read."""
    from langgraph_ckpt_ext.core import codec

    saver = SQLiteCheckpointer(tmp_path / "c.db")
    graph = chat_graph().compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "c"}}
    for i in range(2 * codec._RUNS + 3):
        graph.invoke({"messages": [human(f"m{i}")]}, config)
        got = graph.get_state(config).values["messages"]
        assert [m.content for m in got[::2]] == [f"m{k}" for k in range(i + 1)]
        for m in got:  # a careless caller
            m.content = "changed by the caller"
            m.additional_kwargs["leak"] = True
    held = saver._log.last("c", "", "messages")
    assert held is not None and held.copies is not None and len(held.copies) <= codec._RUNS
    with SQLiteCheckpointer(tmp_path / "c.db") as fresh:
        want = chat_graph().compile(checkpointer=fresh).get_state(config).values
    assert graph.get_state(config).values == want
    assert not any(m.additional_kwargs for m in want["messages"])
    saver.close()


def test_reads_decode_fresh_objects(tmp_path: Path) -> None:
    """The process that wrote a thread reads what any other process would: values decoded from
    storage, never the objects it was given or handed out before."""
    saver, graph, config = _chatted(tmp_path, 3)
    first = graph.get_state(config).values["messages"]
    first[0].content = "changed by the caller"
    first.append(human("appended by the caller"))
    again = graph.get_state(config).values["messages"]
    assert len(again) == 6 and again[0].content == "m0"
    assert all(a is not b for a, b in zip(first, again, strict=False))
    with SQLiteCheckpointer(tmp_path / "c.db") as other:
        assert chat_graph().compile(checkpointer=other).get_state(config).values == (
            graph.get_state(config).values)
    saver.close()


async def test_caller_owned_aiosqlite_connection_stays_open(tmp_path: Path) -> None:
    import aiosqlite

    conn = await aiosqlite.connect(tmp_path / "own.db")
    try:
        saver = SQLiteCheckpointer(conn)
        graph = chat_graph().compile(checkpointer=saver)
        config = {"configurable": {"thread_id": "own"}}
        await graph.ainvoke({"messages": [human("hi")]}, config)
        assert len((await graph.aget_state(config)).values["messages"]) == 2
        await saver.aclose()
        rows = await conn.execute_fetchall("SELECT COUNT(*) FROM lgx_checkpoints")
        assert rows[0][0] == 3  # still usable: the connection is the caller's
    finally:
        await conn.close()


async def test_cancelled_write_does_not_stall_later_writes(tmp_path: Path) -> None:
    from langgraph.checkpoint.base import empty_checkpoint

    async with SQLiteCheckpointer.from_conn_string(tmp_path / "cancel.db") as cp:
        config = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}
        for _ in range(3):  # cancel at different points of the write
            task = asyncio.ensure_future(cp.aput(config, empty_checkpoint(), {}, {}))
            await asyncio.sleep(0)
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
        stored = await asyncio.wait_for(cp.aput(config, empty_checkpoint(), {}, {}), 10)
        assert await cp.aget_tuple(stored) is not None


def test_storage_migrations_upgrade_an_older_database(tmp_path: Path) -> None:
    import sqlite3

    db = tmp_path / "old.db"
    conn = sqlite3.connect(db)
    conn.execute("CREATE TABLE lgx_migrations (version INTEGER PRIMARY KEY, applied_at TEXT)")
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    conn.execute("INSERT INTO lgx_migrations VALUES (1, 'then')")
    conn.commit()
    conn.close()
    with SQLiteCheckpointer(db) as saver:
        assert saver.setup() == LATEST
    conn = sqlite3.connect(db)
    assert [r[0] for r in conn.execute("SELECT version FROM lgx_migrations ORDER BY 1")] == list(
        range(1, LATEST + 1)
    )
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type = 'index'")}
    assert "lgx_checkpoints_thread_order" in names
    conn.close()


def test_reads_of_stored_bytes_use_copies_never_stale_ones(tmp_path: Path) -> None:
    """A list this process stored is read back as unpickled copies of items it decoded from
    the very same bytes (no decoding again), and only while the stored bytes are those: a row
    changed in the database is decoded, as any other process would."""
    import sqlite3

    saver, graph, config = _chatted(tmp_path, 4)
    first = graph.get_state(config).values["messages"]
    decoded: list[Any] = []
    real = saver.serde.loads_typed

    def counting(typed: tuple[str, bytes]) -> Any:
        decoded.append(typed)
        return real(typed)

    saver.serde.loads_typed = counting  # type: ignore[method-assign]
    again = graph.get_state(config).values["messages"]
    assert again == first and all(a is not b for a, b in zip(first, again, strict=True))
    assert not [t for t in decoded if b"m3" in t[1]]  # the messages were not decoded again
    # A stored row rewritten behind our back (same length): read as stored, not from memory.
    rows = [b for b in _blob_rows(saver, "c") if b.channel == "messages"]
    target = next(r for r in rows if b"echo: m3" in r.data)
    conn = sqlite3.connect(tmp_path / "c.db")
    conn.execute("UPDATE lgx_blobs SET data = ? WHERE channel = 'messages' AND version = ?",
                 (target.data.replace(b"echo: m3", b"ECHO: M3"), target.version))
    conn.commit()
    conn.close()
    tampered = graph.get_state(config).values["messages"]
    assert tampered[-1].content == "ECHO: M3"
    saver.close()
