"""The store operations behind state-schema migration: `rewrite_checkpoint` and the migration
log, on every backend, below the checkpointer (rows in, rows out)."""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any

from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext.core.rows import BlobRow, MigrationEntry, WriteRow
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.store import Store
from tests.support.savers import open_saver


def _run(cp: StoreCheckpointer, coro: Any) -> Any:
    return cp.run_sync(coro)


def _seed(cp: StoreCheckpointer, thread: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two checkpoints of `thread` (ns '' and 'child:1'), with writes on the first."""
    c1 = empty_checkpoint()
    c1["channel_values"] = {"a": "old", "msgs": ["x"]}
    c1["channel_versions"] = {"a": 1.5, "msgs": 1.25}
    conf1 = cp.put(
        {"configurable": {"thread_id": thread, "checkpoint_ns": ""}},
        c1, {"source": "loop", "step": 0}, {"a": 1.5, "msgs": 1.25},
    )
    cp.put_writes(conf1, [("a", "w1"), ("msgs", ["y"])], "task-1")
    cp.put_writes(conf1, [("__interrupt__", "ask")], "task-2")
    c2 = empty_checkpoint()
    c2["channel_values"] = {"a": "sub"}
    c2["channel_versions"] = {"a": 1.75}
    cp.put(
        {"configurable": {"thread_id": thread, "checkpoint_ns": "child:1"}},
        c2, {"source": "loop", "step": 0}, {"a": 1.75},
    )
    return conf1, c1


def test_rewrite_replaces_row_blobs_and_writes_once(saver: StoreCheckpointer) -> None:
    store: Store = saver._store
    _run(saver, saver.asetup())
    conf1, c1 = _seed(saver, "t-1")
    _seed(saver, "t-2")
    cid = conf1["configurable"]["checkpoint_id"]
    row = _run(saver, store.read_checkpoint("t-1", "", cid))
    assert row is not None

    # The new checkpoint reads channel 'a' at a new version, and 'b' (new); 'msgs' unchanged.
    c1b = dict(c1, channel_versions={"a": 2.5, "b": 2.5, "msgs": 1.25})
    header = saver.serde.dumps_typed({k: v for k, v in c1b.items() if k != "channel_values"})
    metadata = saver.serde.dumps_typed({"source": "loop", "step": 0, "schema_version": 2})
    versions = {"a": "2.5", "b": "2.5", "msgs": "1.25"}
    new_row = replace(row, checkpoint=header, metadata=metadata, versions=versions)
    blobs = [
        BlobRow("a", "2.5", *saver.serde.dumps_typed("new")),
        BlobRow("b", "2.5", *saver.serde.dumps_typed(7)),
    ]
    writes = [
        WriteRow("t-1", "", cid, "task-1", 0, "a", *saver.serde.dumps_typed("W1")),
        WriteRow("t-1", "", cid, "task-2", -1, "__interrupt__", *saver.serde.dumps_typed("ask")),
    ]
    now = time.time()
    entry = MigrationEntry("t-1", "", cid, 1, 2, now)
    assert _run(saver, store.rewrite_checkpoint(new_row, blobs, writes, entry)) is True

    tup = saver.get_tuple(conf1)
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": "new", "b": 7, "msgs": ["x"]}
    assert tup.metadata["schema_version"] == 2
    assert sorted((t, c, v) for t, c, v in tup.pending_writes) == [
        ("task-1", "a", "W1"), ("task-2", "__interrupt__", "ask"),
    ]
    # The same entry again changes nothing, even with other content.
    other = replace(new_row, metadata=saver.serde.dumps_typed({"schema_version": 99}))
    assert _run(saver, store.rewrite_checkpoint(other, [], [], entry)) is False
    assert saver.get_tuple(conf1).metadata["schema_version"] == 2  # type: ignore[union-attr]
    assert len(saver.get_tuple(conf1).pending_writes) == 2  # type: ignore[union-attr]

    # writes=None leaves the writes alone; a later version is a new entry.
    entry3 = MigrationEntry("t-1", "", cid, 2, 3, now + 1)
    row3 = replace(new_row, metadata=saver.serde.dumps_typed({"schema_version": 3}))
    assert _run(saver, store.rewrite_checkpoint(row3, [], None, entry3)) is True
    tup = saver.get_tuple(conf1)
    assert tup is not None and tup.metadata["schema_version"] == 3
    assert len(tup.pending_writes) == 2

    # A checkpoint that is not stored is neither written nor logged.
    ghost = replace(new_row, checkpoint_id="1f0-not-there")
    gone = MigrationEntry("t-1", "", "1f0-not-there", 1, 2, now)
    assert _run(saver, store.rewrite_checkpoint(ghost, [], None, gone)) is False
    ghost_conf = {"configurable": {"thread_id": "t-1", "checkpoint_id": "1f0-not-there"}}
    assert saver.get_tuple(ghost_conf) is None

    # The subgraph's checkpoint is logged under its namespace.
    sub = _run(saver, store.read_checkpoint("t-2", "child:1", None))
    sub_entry = MigrationEntry("t-2", "child:1", sub.checkpoint_id, 1, 2, now + 2)
    assert _run(saver, store.rewrite_checkpoint(sub, [], None, sub_entry)) is True

    assert _run(saver, store.read_migrations("t-1")) == [entry, entry3]
    assert _run(saver, store.read_migrations()) == [entry, entry3, sub_entry]
    assert _run(saver, store.read_migrations("nobody")) == []

    # Deleting a thread deletes its log; the other thread's stays.
    saver.delete_thread("t-1")
    assert _run(saver, store.read_migrations("t-1")) == []
    assert _run(saver, store.read_migrations()) == [sub_entry]


def test_rewrite_entry_survives_a_new_checkpointer(backend: str, tmp_path: Any) -> None:
    """The log is stored, not held in the process (except on the in-memory backend)."""

    if backend in ("memory", "sqlite-memory"):
        return
    first_h = open_saver(backend, tmp_path)
    first = first_h.saver
    try:
        _run(first, first.asetup())
        _seed(first, "t-1")
        row = _run(first, first._store.read_checkpoint("t-1", "", None))
        entry = MigrationEntry("t-1", "", row.checkpoint_id, 1, 2, 1234.5)
        assert _run(first, first._store.rewrite_checkpoint(row, [], None, entry))
        first.close()
        second = first_h.reopen()
        try:
            assert _run(second, second._store.read_migrations()) == [entry]
            assert not _run(second, second._store.rewrite_checkpoint(row, [], None, entry))
        finally:
            second.close()
    finally:
        first_h.cleanup()


def test_rewrite_stores_deltas_on_a_present_base_and_whole_values_otherwise(
    saver: StoreCheckpointer,
) -> None:
    store: Store = saver._store
    conf1, c1 = _seed(saver, "t-d")
    cid = conf1["configurable"]["checkpoint_id"]
    row = _run(saver, store.read_checkpoint("t-d", "", cid))
    dumps = saver.serde.dumps_typed
    # 'msgs' at 3.5 is a delta on the stored 1.25 (["x"]); 'other' at 3.5 a delta on a base
    # that does not exist, so it must land whole.
    blobs = [
        BlobRow("msgs", "3.5", *dumps(["y", "z"]), base_version="1.25",
                full=lambda: dumps(["x", "y", "z"])),
        BlobRow("other", "3.5", *dumps([2]), base_version="9.99", full=lambda: dumps([1, 2])),
    ]
    c = dict(c1, channel_versions={"a": 1.5, "msgs": 3.5, "other": 3.5})
    new_row = replace(
        row,
        checkpoint=dumps({k: v for k, v in c.items() if k != "channel_values"}),
        versions={"a": "1.5", "msgs": "3.5", "other": "3.5"},
    )
    entry = MigrationEntry("t-d", "", cid, 1, 2, time.time())
    assert _run(saver, store.rewrite_checkpoint(new_row, blobs, None, entry)) is True
    tup = saver.get_tuple(conf1)
    assert tup is not None
    assert tup.checkpoint["channel_values"] == {"a": "old", "msgs": ["x", "y", "z"],
                                                "other": [1, 2]}


def test_thread_ids_lists_every_thread_once_sorted(saver: StoreCheckpointer) -> None:
    store: Store = saver._store
    assert _run(saver, store.thread_ids()) == []
    for thread in ("t-2", "t-1", "a b}{", "t-10"):
        _seed(saver, thread)  # two namespaces each
    assert _run(saver, store.thread_ids()) == ["a b}{", "t-1", "t-10", "t-2"]
    saver.delete_thread("t-1")
    assert _run(saver, store.thread_ids()) == ["a b}{", "t-10", "t-2"]
