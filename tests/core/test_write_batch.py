"""`Store.write_batch` on every backend: the same rows as the single-item methods called in
order (checkpoints with append-deltas, pending writes kept or replaced), a delta's base found
earlier in the batch or falling back to a whole value, and the batch atomic where the backend
promises a transaction (SQLite, PostgreSQL)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext.core import codec
from langgraph_ckpt_ext.core.appendlog import AppendLog
from langgraph_ckpt_ext.core.rows import BlobRow, CheckpointRow, ListQuery, Typed, WriteRow
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.store import BatchItem, Store
from tests.support.savers import open_saver, params

TRANSACTIONAL = ("sqlite", "sqlite-memory", "postgres")


def _run(cp: StoreCheckpointer, coro: Any) -> Any:
    return cp.run_sync(coro)


def _config(thread: str, ns: str = "", cid: str | None = None) -> Any:
    conf: dict[str, Any] = {"thread_id": thread, "checkpoint_ns": ns}
    if cid is not None:
        conf["checkpoint_id"] = cid
    return {"configurable": conf}


class Encoder:
    """Rows of checkpoints and writes of one thread, encoded as `StoreCheckpointer.aput` and
    `aput_writes` encode them (its own append log: list channels become append-deltas)."""

    def __init__(self, cp: StoreCheckpointer, thread: str) -> None:
        self.cp, self.thread = cp, thread
        self.log = AppendLog()
        self.versions: dict[tuple[str, str], float] = {}  # (ns, channel) -> last version
        self.parents: dict[str, str] = {}  # ns -> last checkpoint id
        self.step = 0
        self.blob_keys: dict[str, set[tuple[str, str]]] = {}  # ns -> (channel, version)
        self.checkpoint_ids: dict[str, list[str]] = {}

    def checkpoint(self, values: dict[str, Any], ns: str = "") -> tuple[CheckpointRow, list[BlobRow]]:
        """A checkpoint of `ns` whose channels hold `values`; the channels given get a new
        version (the others keep theirs, as a channel a step did not touch)."""
        self.step += 1
        cid = f"1ef00000-0000-6000-8000-{self.step:012d}"
        new_versions: dict[str, float] = {}
        for ch in values:
            old = self.versions.get((ns, ch))
            new_versions[ch] = self.versions[(ns, ch)] = (int(old) if old else 0) + 1 + self.step / 100
        ckpt = empty_checkpoint()
        ckpt["id"] = cid
        ckpt["channel_versions"] = {ch: v for (n, ch), v in self.versions.items() if n == ns}
        ckpt["channel_values"] = dict(values)
        header = codec.encode_header(self.cp.serde, ckpt)
        blobs, plans = codec.encode_blobs(
            self.cp.serde, self.log, self.thread, ns, ckpt["channel_values"], new_versions
        )
        for ch, plan in plans.items():  # as if stored: the caller checks the fallbacks
            self.log.commit(self.thread, ns, ch, plan)
        md = codec.dumps(self.cp.serde, {"source": "loop", "step": self.step}, "metadata")
        versions = codec.blob_keys(ckpt["channel_versions"]) if self.cp._row_versions else None
        row = CheckpointRow(
            self.thread, ns, cid, self.parents.get(ns), f"run-{self.step % 2}", header, md, versions
        )
        self.parents[ns] = cid
        self.blob_keys.setdefault(ns, set()).update((b.channel, b.version) for b in blobs)
        self.checkpoint_ids.setdefault(ns, []).append(cid)
        return row, blobs

    def writes(
        self, writes: Sequence[tuple[str, Any]], task_id: str, ns: str = "", task_path: str = ""
    ) -> list[WriteRow]:
        """Writes of a task on the last checkpoint of `ns` (special channels such as
        `__error__` get idx < 0: they replace)."""
        return codec.encode_writes(
            self.cp.serde, self.thread, ns, self.parents[ns], writes, task_id, task_path
        )


def _retarget(items: Sequence[BatchItem], thread: str) -> list[BatchItem]:
    """The same items for another thread (blob rows carry no thread id)."""
    out: list[BatchItem] = []
    for item in items:
        if isinstance(item, tuple):
            out.append((replace(item[0], thread_id=thread), item[1]))
        else:
            out.append([replace(w, thread_id=thread) for w in item])
    return out


async def _in_turn(store: Store, items: Sequence[BatchItem]) -> list[set[str]]:
    out = []
    for item in items:
        if isinstance(item, tuple):
            out.append(await store.write_checkpoint(*item))
        else:
            await store.write_writes(item)
    return out


async def _stored(store: Store, enc: Encoder, thread: str) -> dict[str, Any]:
    """Every row of `thread`, under the keys `enc` wrote (thread ids blanked)."""
    out: dict[str, Any] = {}
    for ns, keys in enc.blob_keys.items():
        rows = [replace(r, thread_id="") async for r in
                store.iter_checkpoints(ListQuery(thread_id=thread, checkpoint_ns=ns))]
        blobs = await store.read_blobs(thread, ns, keys)
        writes = await store.read_writes(thread, ns, enc.checkpoint_ids[ns])
        out[ns] = (
            rows,
            {k: (b.type, bytes(b.data), b.base_version) for k, b in blobs.items()},
            {cid: [replace(w, thread_id="", data=bytes(w.data)) for w in ws]
             for cid, ws in writes.items()},
        )
    return out


def _tuples(cp: StoreCheckpointer, thread: str, ns: str) -> list[Any]:
    """What the checkpointer reads back (config thread ids blanked): list and get_tuple."""
    def plain(tup: Any) -> Any:
        return (
            tup.config["configurable"]["checkpoint_id"],
            tup.checkpoint, tup.metadata,
            tup.parent_config and tup.parent_config["configurable"]["checkpoint_id"],
            tup.pending_writes,
        )

    listed = [plain(t) for t in cp.list(_config(thread, ns))]
    fetched = [plain(cp.get_tuple(_config(thread, ns, cid))) for cid, *_ in listed]
    assert listed == fetched
    return listed


def _history(enc: Encoder) -> tuple[list[BatchItem], list[BatchItem]]:
    """A thread's history: what is stored before the batch, and the batch. Channel `msgs`
    grows by appending (deltas on deltas; one delta's base is stored before the batch, the
    others come earlier in the batch), `n` changes at every step, `fixed` is written once;
    a subgraph namespace grows its own list. Writes: some kept (idx >= 0, the first stored
    wins), some replaced (`__error__`, `__interrupt__`: idx < 0, the last wins)."""
    msgs: list[str] = []

    def grow(k: int) -> list[str]:
        msgs.extend([f"m{len(msgs) + i}" for i in range(k)])
        return list(msgs)

    before: list[BatchItem] = [
        enc.checkpoint({"msgs": grow(2), "n": 0, "fixed": {"a": 1}}),
        enc.writes([("msgs", ["w0"]), ("n", 1)], "task-a"),
        enc.writes([("__error__", "old error")], "task-e"),
    ]
    batch: list[BatchItem] = [
        enc.writes([("msgs", ["again"]), ("n", 9)], "task-a"),  # kept: stored before
        enc.writes([("__error__", "new error")], "task-e"),  # replaces the stored one
        enc.checkpoint({"msgs": grow(1), "n": 1}),  # delta on the stored base
        enc.writes([("n", 2)], "task-b", task_path="~1"),
        enc.writes([("n", 3)], "task-b", task_path="~1"),  # kept: earlier in the batch
        enc.writes([("__interrupt__", "ask 1")], "task-i"),
        enc.writes([("__interrupt__", "ask 2")], "task-i"),  # replaces, in the batch
        enc.checkpoint({"msgs": grow(3), "n": 2}),
        enc.checkpoint({"sub": ["s0"]}, ns="child:1"),
        enc.checkpoint({"msgs": grow(1), "n": 3}),  # a delta on a delta of the batch
        enc.checkpoint({"sub": ["s0", "s1"]}, ns="child:1"),
        enc.writes([("sub", ["x"])], "task-c", ns="child:1"),
        enc.checkpoint({"msgs": grow(2), "n": 4}),
        enc.checkpoint({"msgs": grow(1)}),
        enc.writes([("msgs", ["y"]), ("__error__", "e")], "task-d"),
    ]
    return before, batch


def test_batch_stores_what_single_calls_store(saver: StoreCheckpointer) -> None:
    store: Store = saver._store
    _run(saver, saver.asetup())
    enc = Encoder(saver, "batch")
    before, batch = _history(enc)
    deltas = [b for item in batch if isinstance(item, tuple) for b in item[1] if b.base_version]
    assert len(deltas) >= 5  # the history does exercise append-deltas

    assert _run(saver, _in_turn(store, before)) == [set()]
    assert _run(saver, _in_turn(store, _retarget(before, "single"))) == [set()]
    got = _run(saver, store.write_batch(batch))
    want = _run(saver, _in_turn(store, _retarget(batch, "single")))
    assert got == want == [set()] * 7  # every base is stored, or earlier in the batch

    # Row for row what the single calls stored, and the same checkpoints read back.
    assert _run(saver, _stored(store, enc, "batch")) == _run(saver, _stored(store, enc, "single"))
    for ns in ("", "child:1"):
        assert _tuples(saver, "batch", ns) == _tuples(saver, "single", ns)

    latest = saver.get_tuple(_config("batch"))
    assert latest is not None
    assert latest.checkpoint["channel_values"] == {
        "msgs": [f"m{i}" for i in range(10)], "n": 4, "fixed": {"a": 1}
    }
    assert sorted(latest.pending_writes or []) == [
        ("task-d", "__error__", "e"), ("task-d", "msgs", ["y"])
    ]
    first = saver.get_tuple(_config("batch", "", enc.checkpoint_ids[""][0]))
    assert first is not None
    assert sorted(first.pending_writes or []) == sorted([
        ("task-a", "msgs", ["w0"]), ("task-a", "n", 1),
        ("task-e", "__error__", "new error"),
    ])
    second = saver.get_tuple(_config("batch", "", enc.checkpoint_ids[""][1]))
    assert second is not None
    assert sorted(second.pending_writes or []) == [
        ("task-b", "n", 2), ("task-i", "__interrupt__", "ask 2")
    ]
    sub = saver.get_tuple(_config("batch", "child:1"))
    assert sub is not None
    assert sub.checkpoint["channel_values"] == {"sub": ["s0", "s1"]}
    assert sub.pending_writes == [("task-c", "sub", ["x"])]


def _dumps(cp: StoreCheckpointer, value: Any) -> Typed:
    return codec.dumps(cp.serde, value, "test value")


def _item(
    cp: StoreCheckpointer,
    thread: str,
    cid: str,
    msgs: tuple[str, list[str]],
    delta: tuple[str, list[str]] | None = None,
    full: Callable[[], Typed] | None = None,
) -> tuple[CheckpointRow, list[BlobRow]]:
    """A checkpoint whose channel `msgs` is at version msgs[0], holding msgs[1]: whole, or as
    the items `delta[1]` appended to version delta[0]."""
    version, value = msgs
    ckpt = empty_checkpoint()
    ckpt["id"] = cid
    ckpt["channel_versions"] = {"msgs": version}
    row = CheckpointRow(
        thread, "", cid, None, None, codec.encode_header(cp.serde, ckpt),
        _dumps(cp, {"source": "loop", "step": 0}),
        {"msgs": version} if cp._row_versions else None,
    )
    if delta is None:
        return row, [BlobRow("msgs", version, *_dumps(cp, value))]
    base, items = delta
    return row, [BlobRow(
        "msgs", version, *_dumps(cp, items), base,
        full=full or (lambda: _dumps(cp, value)),
    )]


def _values(cp: StoreCheckpointer, thread: str, cid: str) -> Any:
    tup = cp.get_tuple(_config(thread, "", cid))
    assert tup is not None
    return tup.checkpoint["channel_values"].get("msgs")


def test_delta_falls_back_unless_its_base_is_stored_or_earlier(saver: StoreCheckpointer) -> None:
    store: Store = saver._store
    _run(saver, saver.asetup())
    cid = [f"1ef00000-0000-6000-8000-{i:012d}" for i in range(6)]
    _run(saver, store.write_checkpoint(*_item(saver, "t", cid[0], ("1.5", ["a"]))))
    batch: list[BatchItem] = [
        # on a base never stored: written whole
        _item(saver, "t", cid[1], ("2.5", ["a", "b"]), ("gone", ["b"])),
        # on the whole value just written, and on a delta of the batch: deltas
        _item(saver, "t", cid[2], ("3.5", ["a", "b", "c"]), ("2.5", ["c"])),
        _item(saver, "t", cid[3], ("4.5", ["a", "b", "c", "d"]), ("3.5", ["d"])),
        # on the base stored before the batch: a delta
        _item(saver, "t", cid[4], ("5.5", ["a", "e"]), ("1.5", ["e"])),
        # on a base that a later item writes: not there yet, so written whole
        _item(saver, "t", cid[5], ("7.5", ["a", "b", "f"]), ("6.5", ["f"])),
        _item(saver, "t", "1ef00000-0000-6000-8000-999999999999", ("6.5", ["x"])),
    ]
    assert _run(saver, store.write_batch(batch)) == [{"msgs"}, set(), set(), set(), {"msgs"}, set()]
    stored = _run(saver, store.read_blobs("t", "", [("msgs", v) for v in
                                                    ("2.5", "3.5", "4.5", "5.5", "7.5")]))
    assert {k[1]: b.base_version for k, b in stored.items()} == {  # with the bases they need
        "1.5": None, "2.5": None, "3.5": "2.5", "4.5": "3.5", "5.5": "1.5", "7.5": None
    }
    assert _values(saver, "t", cid[1]) == ["a", "b"]
    assert _values(saver, "t", cid[3]) == ["a", "b", "c", "d"]
    assert _values(saver, "t", cid[4]) == ["a", "e"]
    assert _values(saver, "t", cid[5]) == ["a", "b", "f"]


def test_empty_batch_is_a_no_op(saver: StoreCheckpointer) -> None:
    _run(saver, saver.asetup())
    assert _run(saver, saver._store.write_batch([])) == []
    assert _run(saver, saver._store.write_batch([[]])) == []
    assert _run(saver, saver._store.thread_ids()) == []


def _raise() -> Typed:
    raise RuntimeError("cannot encode")


def _bad_batch(cp: StoreCheckpointer, thread: str) -> list[BatchItem]:
    """Good items, then a delta on a missing base whose whole value cannot be made."""
    cid = [f"1ef00000-0000-6000-8000-{i:012d}" for i in range(3)]
    return [
        _item(cp, thread, cid[0], ("1.5", ["a"])),
        [WriteRow(thread, "", cid[0], "task", 0, "msgs", *_dumps(cp, ["w"]))],
        _item(cp, thread, cid[1], ("2.5", ["a", "b"]), ("1.5", ["b"])),
        _item(cp, thread, cid[2], ("3.5", ["a", "b", "c"]), ("gone", ["c"]), full=_raise),
    ]


async def _nothing_of(store: Store, thread: str) -> bool:
    cids = [f"1ef00000-0000-6000-8000-{i:012d}" for i in range(3)]
    return (
        await store.read_checkpoint(thread, "", None) is None
        and not await store.read_blobs(thread, "", [("msgs", v) for v in ("1.5", "2.5", "3.5")])
        and not await store.read_writes(thread, "", cids)
    )


@pytest.fixture
def only(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreCheckpointer]:
    """The saver of the backend a test is parametrized with (`kind`)."""
    kind = request.node.callspec.params["kind"]
    cp_h = open_saver(kind, tmp_path)
    cp = cp_h.saver
    yield cp
    cp.close()
    cp_h.cleanup()


@pytest.mark.parametrize("kind", params(sorted(TRANSACTIONAL)))
def test_failed_batch_leaves_nothing(only: StoreCheckpointer, kind: str) -> None:
    saver = only
    store: Store = saver._store
    _run(saver, saver.asetup())
    with pytest.raises(RuntimeError, match="cannot encode"):
        _run(saver, store.write_batch(_bad_batch(saver, "t")))
    assert _run(saver, _nothing_of(store, "t"))

    # A good batch committed together with a failing one (SQLite's group commit) still lands.
    async def both() -> tuple[Any, Any]:
        return await asyncio.gather(
            store.write_batch(_bad_batch(saver, "bad")),
            store.write_batch(_bad_batch(saver, "good")[:3]),
            return_exceptions=True,
        )

    bad, good = _run(saver, both())
    assert isinstance(bad, RuntimeError) and good == [set(), set()]
    assert _run(saver, _nothing_of(store, "bad"))
    assert _values(saver, "good", "1ef00000-0000-6000-8000-000000000001") == ["a", "b"]


@pytest.mark.parametrize("kind", params(["postgres"]))
def test_postgres_batch_rejected_by_the_server_leaves_nothing(
    only: StoreCheckpointer, kind: str
) -> None:
    saver = only
    store: Store = saver._store
    _run(saver, saver.asetup())
    batch = _bad_batch(saver, "t")[:3]
    batch.append([WriteRow("t", "", "1ef00000-0000-6000-8000-000000000001", "ta\0sk", 0,
                           "msgs", *_dumps(saver, ["w"]))])
    with pytest.raises(Exception, match="0x00"):
        _run(saver, store.write_batch(batch))
    assert _run(saver, _nothing_of(store, "t"))


@pytest.mark.parametrize("kind", params(["postgres"]))
def test_postgres_batch_is_one_statement(
    only: StoreCheckpointer, kind: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """N checkpoints with their writes: one statement (one round trip, no BEGIN/COMMIT);
    two when a delta's base is missing."""
    saver = only
    import asyncpg

    store: Store = saver._store
    _run(saver, saver.asetup())
    _run(saver, store.write_checkpoint(*_item(saver, "t", "1ef0-0", ("1.5", ["a"]))))
    calls: list[str] = []
    for name in ("execute", "executemany", "fetch", "fetchrow", "fetchval"):
        method = getattr(asyncpg.Connection, name)

        def counted(self: Any, *args: Any, _m: Any = method, _n: str = name, **kw: Any) -> Any:
            calls.append(_n)
            return _m(self, *args, **kw)

        monkeypatch.setattr(asyncpg.Connection, name, counted)

    batch: list[BatchItem] = []
    for i in range(1, 9):
        cid = f"1ef0-{i}"
        values = ["a", *(str(k) for k in range(1, i + 1))]
        batch.append(_item(saver, "t", cid, (f"{i + 1}.5", values), (f"{i}.5", [str(i)])))
        batch.append([WriteRow("t", "", cid, "task", 0, "n", *_dumps(saver, i)),
                      WriteRow("t", "", cid, "task", -1, "__error__", *_dumps(saver, "e"))])
    assert _run(saver, store.write_batch(batch)) == [set()] * 8
    assert calls == ["fetch"]

    calls.clear()
    lost = [_item(saver, "t", "1ef0-x", ("20.5", ["a", "z"]), ("gone", ["z"])), *batch]
    assert _run(saver, store.write_batch(lost)) == [{"msgs"}] + [set()] * 8
    assert calls == ["fetch", "fetch"]
    assert _values(saver, "t", "1ef0-8") == ["a", *(str(k) for k in range(1, 9))]


def test_one_key_twice_in_a_batch(saver: StoreCheckpointer) -> None:
    """Of writes with one key, in one list or across items: the first kept (idx >= 0), the
    last replacing (idx < 0), in a batch as in single calls."""
    store: Store = saver._store
    _run(saver, saver.asetup())

    def items(thread: str) -> list[BatchItem]:
        cid = "1ef00000-0000-6000-8000-000000000000"
        row, blobs = _item(saver, thread, cid, ("1.5", ["a"]))

        def w(idx: int, channel: str, value: Any) -> WriteRow:
            return WriteRow(thread, "", cid, "task", idx, channel, *_dumps(saver, value))

        return [
            (row, blobs),
            [w(0, "n", 1), w(0, "n", 2), w(-3, "__interrupt__", "i1"),
             w(-3, "__interrupt__", "i2")],
            [w(0, "n", 3), w(-3, "__interrupt__", "i3"), w(1, "n", 4)],
            (row, blobs),
        ]

    assert _run(saver, store.write_batch(items("batch"))) == [set(), set()]
    assert _run(saver, _in_turn(store, items("single"))) == [set(), set()]
    for thread in ("batch", "single"):
        tup = saver.get_tuple(_config(thread))
        assert tup is not None
        assert tup.pending_writes == [
            ("task", "__interrupt__", "i3"), ("task", "n", 1), ("task", "n", 4)
        ]
