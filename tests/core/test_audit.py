"""The audit trail on every backend: real graphs verify clean; tampering with the stored rows
directly (a value, a deleted checkpoint, two swapped checkpoints) is reported at the right
checkpoint; two checkpointers taking turns on one thread; a schema chain; audit off."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext.core.errors import InvalidConfigError, ThreadNotFoundError
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.versions import version_key
from langgraph_ckpt_ext.timetravel.audit import (
    ALTERED,
    BROKEN_LINK,
    CUT,
    MISSING_PARENT,
    UNHASHED,
    Auditor,
    AuditReport,
)
from tests.support.common import LoopThread, conf
from tests.support.graphs import approval_graph, chat_graph, fan_graph, human, subgraph_graph
from tests.support.savers import PERSISTENT, SaverHandle, open_saver, params
from tests.support.schema_graphs import CHAIN, graph_v1, graph_v3, v1_message


def reopen(h: SaverHandle, **kw: Any) -> StoreCheckpointer:
    """A checkpointer that knows nothing of what `h.saver` wrote, over the same storage (for
    in-process storage: `h.saver` itself with its caches dropped)."""
    cp = h.saver
    if h.backend not in PERSISTENT:
        cp._auditor = Auditor(cp._store)
        if kw.get("audit", True):
            cp.enable_audit()
        cp._log.forget()
        cp.schema_chain = kw.get("schema_chain")
        return cp
    return h.reopen(**kw)


@pytest.fixture
def audited_handle(backend: str, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(backend, tmp_path, audit=True) as h:
        yield h


@pytest.fixture
def audited(audited_handle: SaverHandle) -> StoreCheckpointer:
    return audited_handle.inner


def verify_fresh(h: SaverHandle, cp: StoreCheckpointer, thread: str) -> AuditReport:
    """Verify from storage alone (`h`'s, which `cp` writes), with a checkpointer that did not
    write the thread."""
    fresh = reopen(h, audit=True, schema_chain=cp.schema_chain)
    try:
        return fresh.verify(thread)
    finally:
        if fresh is not cp:
            fresh.close()


def run_graphs(cp: StoreCheckpointer, prefix: str = "") -> dict[str, int]:
    """Real graphs, several turns each: messages, an interrupt, parallel branches, a subgraph
    paused inside; returns thread -> number of checkpoints."""
    chat = chat_graph().compile(checkpointer=cp)
    for i in range(4):
        chat.invoke({"messages": [human(f"hello {i}")]}, conf(prefix + "chat"))
    approval = approval_graph().compile(checkpointer=cp)
    for i, answer in enumerate(["yes", "no"]):
        approval.invoke({"request": f"deploy {i}", "log": []}, conf(prefix + "approval"))
        approval.invoke(Command(resume=answer), conf(prefix + "approval"))
    fan = fan_graph().compile(checkpointer=cp)
    for n in (3, 6):
        fan.invoke({"items": list(range(n)), "results": []}, conf(prefix + "fan"))
    sub = subgraph_graph().compile(checkpointer=cp)
    sub.invoke({"text": "x", "trail": []}, conf(prefix + "sub"))
    sub.invoke(Command(resume="fine"), conf(prefix + "sub"))
    assert sub.get_state(conf(prefix + "sub")).values["text"] == "x+outer+inner(fine)"
    threads = [prefix + t for t in ("chat", "approval", "fan", "sub")]
    return {t: len(list(cp.list(conf(t)))) for t in threads}  # every namespace


def assert_clean(report: AuditReport, at_least: int = 1) -> None:
    assert report.ok, str(report)
    assert report.first is None and report.problems == []
    assert report.checked >= at_least
    assert "intact" in str(report)


# -- untouched threads verify clean -------------------------------------------------------------


def test_real_graphs_verify_clean(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    counts = run_graphs(audited)
    for thread, n in counts.items():
        assert_clean(audited.verify(thread), n)
        assert_clean(verify_fresh(audited_handle, audited, thread), n)
    # subgraph checkpoints (their own namespace) are checked too
    namespaces = {t.config["configurable"]["checkpoint_ns"] for t in audited.list(conf("sub"))}
    assert len(namespaces) == 2 and verify_fresh(audited_handle, audited, "sub").checked == (
        counts["sub"])
    tup = audited.get_tuple(conf("chat"))
    assert tup is not None
    record = tup.metadata["audit"]  # type: ignore[typeddict-item]
    assert record["v"] == 1 and len(record["hash"]) == 64 and len(record["prev"]) == 64
    assert all(len(w) == 16 for w in record["writes"])


def test_async_graphs_verify_clean(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str, loop_thread: LoopThread
) -> None:
    chat = chat_graph().compile(checkpointer=audited)
    fan = fan_graph().compile(checkpointer=audited)
    approval = approval_graph().compile(checkpointer=audited)
    for i in range(3):
        loop_thread.run(chat.ainvoke({"messages": [human(f"hi {i}")]}, conf("achat")))
        loop_thread.run(fan.ainvoke({"items": [1, 2, 3, 4], "results": []}, conf("afan")))
        loop_thread.run(approval.ainvoke({"request": f"r{i}", "log": []}, conf("aok")))
        loop_thread.run(approval.ainvoke(Command(resume="yes"), conf("aok")))
    for thread in ("achat", "afan", "aok"):
        assert_clean(loop_thread.run(audited.averify(thread)))
        assert_clean(verify_fresh(audited_handle, audited, thread))


def test_long_chat_with_small_caches_and_frequent_snapshots(backend: str, tmp_path: Path) -> None:
    """Append-deltas merged and snapshotted often, and caches too small to hold anything: every
    put reads what it hashes from storage, and still matches `verify`."""
    h = open_saver(backend, tmp_path, audit=True, snapshot_every=4)
    cp = h.saver
    try:
        cp._auditor = Auditor(cp._store, size=4)
        chat = chat_graph().compile(checkpointer=cp)
        for i in range(12):
            chat.invoke({"messages": [human(f"turn {i}")]}, conf("long"))
        run_graphs(cp, "small-")
        assert len(chat.get_state(conf("long")).values["messages"]) == 24
        assert_clean(verify_fresh(h, cp, "long"), 36)
        for thread in ("small-chat", "small-approval", "small-fan", "small-sub"):
            assert_clean(cp.verify(thread))
    finally:
        cp.close()
        h.cleanup()


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_two_checkpointers_taking_turns(backend: str, tmp_path: Path) -> None:
    """Two checkpointer objects on one storage write the same threads in turn (each resumes
    what the other paused): neither one's caches may make a wrong hash."""
    h = open_saver(backend, tmp_path, audit=True)
    a = h.saver
    b = reopen(h, audit=True)
    try:
        chats = [chat_graph().compile(checkpointer=cp) for cp in (a, b)]
        approvals = [approval_graph().compile(checkpointer=cp) for cp in (a, b)]
        fans = [fan_graph().compile(checkpointer=cp) for cp in (a, b)]
        subs = [subgraph_graph().compile(checkpointer=cp) for cp in (a, b)]
        for i in range(6):
            me, other = i % 2, 1 - i % 2
            chats[me].invoke({"messages": [human(f"turn {i}")]}, conf("chat"))
            approvals[me].invoke({"request": f"r{i}", "log": []}, conf("approval"))
            approvals[other].invoke(Command(resume=f"answer {i}"), conf("approval"))
            fans[me].invoke({"items": list(range(i + 1)), "results": []}, conf("fan"))
            subs[me].invoke({"text": f"t{i}", "trail": []}, conf("sub"))
            subs[other].invoke(Command(resume=f"a{i}"), conf("sub"))
        assert chats[0].get_state(conf("chat")).values["turns"] == 6
        for thread in ("chat", "approval", "fan", "sub"):
            assert_clean(verify_fresh(h, a, thread), 6)
            assert_clean(a.verify(thread))
    finally:
        b.close()
        a.close()
        h.cleanup()


def test_thread_written_under_a_schema_chain(backend: str, tmp_path: Path) -> None:
    """A v1 thread resumed by a v3 graph through the upcaster chain (values upgraded on read and
    stored by the next put) verifies clean: `verify` hashes what is stored, not upgraded; an
    eager migration then rewrites the checkpoints, which breaks the chain (documented)."""
    h = open_saver(backend, tmp_path, audit=True)
    v1 = h.saver
    g1 = graph_v1().compile(checkpointer=v1)
    g1.invoke({"messages": [v1_message("human", "hello")]}, conf("s"))
    g1.invoke({"messages": [v1_message("human", "ship it")]}, conf("s"))  # paused at ask
    if backend in PERSISTENT:
        v1.close()
    v3 = reopen(h, audit=True, schema_chain=CHAIN)
    try:
        g3 = graph_v3().compile(checkpointer=v3)
        g3.invoke(Command(resume="yes"), conf("s"))
        g3.invoke({"messages": [human("more")]}, conf("s"))
        assert g3.get_state(conf("s")).values["priority"] == "normal"
        assert_clean(v3.verify("s"), 6)
        assert_clean(verify_fresh(h, v3, "s"), 6)
        report = v3.migrate_threads(["s"])
        assert report.checkpoints_migrated > 0
        broken = verify_fresh(h, v3, "s")
        assert not broken.ok and broken.first is not None and broken.first.kind == ALTERED
    finally:
        v3.close()
        h.cleanup()


def test_audit_off_is_reported_unhashed(backend: str, tmp_path: Path) -> None:
    h = open_saver(backend, tmp_path)
    cp = h.saver
    try:
        chat = chat_graph().compile(checkpointer=cp)
        for i in range(2):
            chat.invoke({"messages": [human(f"hi {i}")]}, conf("plain"))
        ids = sorted(t.checkpoint["id"] for t in cp.list(conf("plain")))
        report = cp.verify("plain")
        assert not report.ok and report.checked == len(ids)
        assert [p.kind for p in report.problems] == [UNHASHED] * len(ids)
        assert report.first is not None and report.first.checkpoint_id == ids[0]
        assert "audit off" in report.first.detail and "unhashed" in str(report)
        # turning audit on later: the old checkpoints stay unhashed, the new ones chain on
        on = reopen(h, audit=True)
        chat = chat_graph().compile(checkpointer=on)
        chat.invoke({"messages": [human("audited now")]}, conf("plain"))
        later = on.verify("plain")
        assert {p.checkpoint_id for p in later.problems} == set(ids)
        if on is not cp:
            on.close()
    finally:
        cp.close()
        h.cleanup()


# -- auditing is a property of the store --------------------------------------------------------


def _chat_turn(cp: StoreCheckpointer, thread: str, text: str) -> None:
    chat_graph().compile(checkpointer=cp).invoke({"messages": [human(text)]}, conf(thread))


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis", "redis-cluster"]))
def test_audit_is_a_property_of_the_store(backend: str, tmp_path: Path) -> None:
    """audit=True on one checkpointer turns auditing on for the store: one opened after it
    without the flag, and one opened before it (which reads the setting again before a write,
    `audit_refresh` 0 here), seal what they write; verify passes."""
    h = open_saver(backend, tmp_path)  # opened while the store was not audited
    early = h.saver
    early.audit_refresh = 0
    on = reopen(h, audit=True)
    plain = reopen(h)
    try:
        for i, cp in enumerate((plain, early, on, plain, early)):
            _chat_turn(cp, "shared", f"turn {i}")
        run_graphs(plain, "p-")
        for thread in ("shared", "p-chat", "p-approval", "p-fan", "p-sub"):
            assert_clean(verify_fresh(h, early, thread), 3)
        status = plain.audit_status()
        assert status.enabled and [s.enabled for s in status.log] == [True]
        assert "audit=True" in status.log[0].reason and status.turned_off == []
    finally:
        for cp in (plain, on, early):
            cp.close()
        h.cleanup()


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_audit_false_does_not_turn_it_off(backend: str, tmp_path: Path) -> None:
    """A checkpointer opened with audit=False on an audited store still seals: only
    `disable_audit` turns auditing off."""
    h = open_saver(backend, tmp_path, audit=True)
    on = h.saver
    off = reopen(h, audit=False)
    try:
        for i in range(2):
            _chat_turn(off, "t", f"hi {i}")
        assert_clean(verify_fresh(h, on, "t"), 6)
        off.copy_thread("t", "t-copy")  # a copy by it is sealed again too
        assert_clean(verify_fresh(h, on, "t-copy"), 6)
        status = off.audit_status()
        assert status.enabled and len(status.log) == 1
    finally:
        off.close()
        on.close()
        h.cleanup()


@pytest.mark.parametrize("backend", params(["sqlite", "postgres", "redis"]))
def test_smart_checkpointer_over_an_audited_store(backend: str, tmp_path: Path) -> None:
    """A SmartCheckpointer whose inner checkpointer was opened without audit=True, on an
    audited store: its flushed batches are sealed, and verify passes."""
    from langgraph_ckpt_ext import SmartCheckpointer

    h = open_saver(backend, tmp_path, audit=True)
    on = h.saver
    inner = reopen(h)
    try:
        with SmartCheckpointer(inner) as smart:
            for i in range(3):
                _chat_turn(smart, "smart", f"hi {i}")  # type: ignore[arg-type]
            run_graphs(smart, "s-")  # type: ignore[arg-type]
        for thread in ("smart", "s-chat", "s-approval", "s-fan", "s-sub"):
            assert_clean(verify_fresh(h, on, thread))
    finally:
        inner.close()
        on.close()
        h.cleanup()


def test_turning_audit_off_is_explicit_logged_and_recorded(
    backend: str, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """`disable_audit` needs a reason, logs a warning and records when and why in the store;
    checkpoints stored while off are reported unhashed with that reason, those before and
    after (once turned on again) verify."""
    h = open_saver(backend, tmp_path, audit=True)
    cp = h.saver
    try:
        _chat_turn(cp, "t", "sealed")
        sealed = {t.checkpoint["id"] for t in cp.list(conf("t"))}
        for reason in ("", "  ", None):
            with pytest.raises(InvalidConfigError, match="disable_audit needs a reason"):
                cp.disable_audit(reason=reason)  # type: ignore[arg-type]
        assert cp.audit_status().enabled
        with caplog.at_level(logging.WARNING, logger="langgraph_ckpt_ext.audit"):
            status = cp.disable_audit(reason="bulk load, ticket 42")
        assert any("turned off" in r.getMessage() and "ticket 42" in r.getMessage()
                   for r in caplog.records if r.levelno == logging.WARNING)
        assert not status.enabled and [s.enabled for s in status.log] == [True, False]
        assert status.turned_off == status.log[-1:]
        assert status.log[-1].reason == "bulk load, ticket 42"
        assert len(cp.disable_audit(reason="again").log) == 2  # off already: nothing new
        _chat_turn(cp, "t", "unsealed")
        unsealed = {t.checkpoint["id"] for t in cp.list(conf("t"))} - sealed
        fresh = reopen(h, audit=False)  # stays off
        try:
            report = fresh.verify("t")
            assert not fresh.audit_status().enabled
        finally:
            if fresh is not cp:
                fresh.close()
        assert {p.checkpoint_id for p in report.problems} == unsealed
        assert {p.kind for p in report.problems} == {UNHASHED}
        assert report.first is not None and "turned off" in report.first.detail
        assert "ticket 42" in report.first.detail and "turned off at" in str(report)
        assert cp.enable_audit(reason="load done").enabled
        _chat_turn(cp, "t", "sealed again")
        again = verify_fresh(h, cp, "t")
        assert {p.checkpoint_id for p in again.problems} == unsealed
        assert [s.reason for s in again.switches][1:] == ["bulk load, ticket 42", "load done"]
    finally:
        cp.close()
        h.cleanup()


def test_unknown_thread_is_a_clear_error(audited: StoreCheckpointer) -> None:
    with pytest.raises(ThreadNotFoundError, match="'nobody' has no stored checkpoint") as info:
        audited.verify("nobody")
    assert isinstance(info.value, KeyError) and str(info.value).startswith("thread 'nobody'")


# -- tampering with storage directly ------------------------------------------------------------


class Raw:
    """A backend's stored rows, reached around the checkpointer, to tamper with them."""

    def __init__(self, h: SaverHandle) -> None:
        self.h, self.backend, self.cp = h, h.backend, h.saver
        self.client: Any = None

    def close(self) -> None:
        if self.client is not None:
            self.client.close()

    def _sqlite(self, fn: Callable[[Any], Any]) -> Any:
        return self.cp.run_sync(self.cp._store._commits.submit(fn))  # type: ignore[attr-defined]

    def _pg(self, fn: Callable[[Any], Any]) -> Any:
        return self.cp.run_sync(self.cp._store._run(fn, tx=True))  # type: ignore[attr-defined]

    def _redis(self, thread: str) -> tuple[Any, dict[str, str]]:
        from langgraph_ckpt_ext.backends.redis.layout import THREAD_KEYS, thread_keys

        keys = thread_keys(self.h.prefix, thread)
        if self.client is None:
            self.client = self.h.redis_client()
        return self.client, dict(zip(THREAD_KEYS, keys, strict=True))

    def blob(self, thread: str, channel: str, version: str) -> tuple[str, bytes, str | None]:
        if self.backend == "memory":
            b = self.cp._store.blobs[(thread, "")][(channel, version)]  # type: ignore[attr-defined]
            return b.type, b.data, b.base_version
        if self.backend.startswith("sqlite"):
            return self._sqlite(lambda c: tuple(c.execute(  # type: ignore[no-any-return]
                "SELECT type, data, base_version FROM lgx_blobs WHERE thread_id = ? AND "
                "checkpoint_ns = '' AND channel = ? AND version = ?",
                (thread, channel, version)).fetchone()))
        if self.backend == "postgres":
            async def get(c: Any) -> Any:
                r = await c.fetchrow(
                    "SELECT type, data, base_version FROM lgx_blobs WHERE thread_id = $1 AND "
                    "checkpoint_ns = '' AND channel = $2 AND version = $3", thread, channel, version)
                return (r[0], bytes(r[1]), r[2])

            return self._pg(get)  # type: ignore[no-any-return]
        client, keys = self._redis(thread)
        raw = client.hget(keys["bl"], f"\0{channel}\0{version}".encode())
        base, type_, data = raw.split(b"\0", 2)
        return type_.decode(), data, base.decode() or None

    def set_blob(self, thread: str, channel: str, version: str, typed: tuple[str, bytes]) -> None:
        if self.backend == "memory":
            blobs = self.cp._store.blobs[(thread, "")]  # type: ignore[attr-defined]
            blobs[(channel, version)] = replace(
                blobs[(channel, version)], type=typed[0], data=typed[1])
        elif self.backend.startswith("sqlite"):
            self._sqlite(lambda c: c.execute(
                "UPDATE lgx_blobs SET type = ?, data = ? WHERE thread_id = ? AND "
                "checkpoint_ns = '' AND channel = ? AND version = ?",
                (*typed, thread, channel, version)))
        elif self.backend == "postgres":
            self._pg(lambda c: c.execute(
                "UPDATE lgx_blobs SET type = $1, data = $2 WHERE thread_id = $3 AND "
                "checkpoint_ns = '' AND channel = $4 AND version = $5",
                *typed, thread, channel, version))
        else:
            client, keys = self._redis(thread)
            field = f"\0{channel}\0{version}".encode()
            base = client.hget(keys["bl"], field).split(b"\0", 1)[0]
            client.hset(keys["bl"], field, base + b"\0" + typed[0].encode() + b"\0" + typed[1])

    def delete_checkpoint(self, thread: str, cid: str) -> None:
        if self.backend == "memory":
            del self.cp._store.checkpoints[(thread, "")][cid]  # type: ignore[attr-defined]
        elif self.backend.startswith("sqlite"):
            self._sqlite(lambda c: c.execute(
                "DELETE FROM lgx_checkpoints WHERE thread_id = ? AND checkpoint_ns = '' AND "
                "checkpoint_id = ?", (thread, cid)))
        elif self.backend == "postgres":
            self._pg(lambda c: c.execute(
                "DELETE FROM lgx_checkpoints WHERE thread_id = $1 AND checkpoint_ns = '' AND "
                "checkpoint_id = $2", thread, cid))
        else:
            client, keys = self._redis(thread)
            client.hdel(keys["cp"], f"\0{cid}".encode())
            client.zrem(keys["ix"], f"\0{cid}".encode())
            client.zrem(keys["ord"], f"{cid}\0".encode())

    def delete_write(self, thread: str, cid: str, task_id: str, idx: int) -> None:
        if self.backend == "memory":
            del self.cp._store.writes[(thread, "", cid)][(task_id, idx)]  # type: ignore[attr-defined]
        elif self.backend.startswith("sqlite"):
            self._sqlite(lambda c: c.execute(
                "DELETE FROM lgx_writes WHERE thread_id = ? AND checkpoint_ns = '' AND "
                "checkpoint_id = ? AND task_id = ? AND idx = ?", (thread, cid, task_id, idx)))
        elif self.backend == "postgres":
            self._pg(lambda c: c.execute(
                "DELETE FROM lgx_writes WHERE thread_id = $1 AND checkpoint_ns = '' AND "
                "checkpoint_id = $2 AND task_id = $3 AND idx = $4", thread, cid, task_id, idx))
        else:
            client, keys = self._redis(thread)
            field = f"\0{cid}\0{task_id}\0{idx}".encode()
            assert client.hdel(keys["wr"], field) == 1
            client.zrem(keys["wx"], field)

    def swap(self, thread: str, a: str, b: str) -> None:
        """Exchange two checkpoints' stored contents (the checkpoint record and metadata; in
        Redis the whole stored row)."""
        if self.backend == "memory":
            rows = self.cp._store.checkpoints[(thread, "")]  # type: ignore[attr-defined]
            ra, rb = rows[a], rows[b]
            rows[a] = replace(ra, checkpoint=rb.checkpoint, metadata=rb.metadata)
            rows[b] = replace(rb, checkpoint=ra.checkpoint, metadata=ra.metadata)
        elif self.backend.startswith("sqlite"):
            cols = "type, checkpoint, metadata_type, metadata"
            where = "WHERE thread_id = ? AND checkpoint_ns = '' AND checkpoint_id = ?"

            def op(c: Any) -> None:
                va = c.execute(f"SELECT {cols} FROM lgx_checkpoints {where}", (thread, a)).fetchone()
                vb = c.execute(f"SELECT {cols} FROM lgx_checkpoints {where}", (thread, b)).fetchone()
                sets = "type = ?, checkpoint = ?, metadata_type = ?, metadata = ?"
                c.execute(f"UPDATE lgx_checkpoints SET {sets} {where}", (*vb, thread, a))
                c.execute(f"UPDATE lgx_checkpoints SET {sets} {where}", (*va, thread, b))

            self._sqlite(op)
        elif self.backend == "postgres":
            cols = "type, checkpoint, metadata_type, metadata"
            where = "WHERE thread_id = $1 AND checkpoint_ns = '' AND checkpoint_id = $2"

            async def pg_op(c: Any) -> None:
                va = await c.fetchrow(f"SELECT {cols} FROM lgx_checkpoints {where}", thread, a)
                vb = await c.fetchrow(f"SELECT {cols} FROM lgx_checkpoints {where}", thread, b)
                sets = "type = $3, checkpoint = $4, metadata_type = $5, metadata = $6"
                await c.execute(f"UPDATE lgx_checkpoints SET {sets} {where}", thread, a, *vb)
                await c.execute(f"UPDATE lgx_checkpoints SET {sets} {where}", thread, b, *va)

            self._pg(pg_op)
        else:
            client, keys = self._redis(thread)
            fa, fb = f"\0{a}".encode(), f"\0{b}".encode()
            va, vb = client.hget(keys["cp"], fa), client.hget(keys["cp"], fb)
            client.hset(keys["cp"], mapping={fa: vb, fb: va})


def test_delta_channels_prune_and_copy(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    """LangGraph's DeltaChannel (values left out of most puts, rebuilt from writes) verifies
    clean; a copy in an audited store is sealed again under its own thread id; pruning breaks
    the chain where documented, as a cut the store recorded (not tampering)."""
    from tests.core.test_core import _delta_graph

    graph = _delta_graph().compile(checkpointer=audited)
    for _ in range(9):
        graph.invoke({"events": ["in"]}, conf("dc"))
    assert_clean(verify_fresh(audited_handle, audited, "dc"), 27)
    audited.copy_thread("dc", "dc-copy")
    assert_clean(verify_fresh(audited_handle, audited, "dc-copy"), 27)
    graph.invoke({"events": ["more"]}, conf("dc-copy"))  # the copy's chain goes on
    assert_clean(verify_fresh(audited_handle, audited, "dc-copy"), 30)
    audited.prune(["dc"], strategy="keep_latest")
    kept = sorted(t.checkpoint["id"] for t in audited.list(conf("dc")))
    pruned = verify_fresh(audited_handle, audited, "dc")
    assert pruned.first is not None and pruned.checked == len(kept)
    assert (pruned.first.kind, pruned.first.checkpoint_id) == (CUT, kept[0])
    assert len(pruned.problems) == 1 and pruned.ok and "history cut on purpose" in str(pruned)


def test_sweep_cuts_are_recorded_and_verify_as_cut(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    """A sweep keeping the newest 3 checkpoints of an audited thread: `verify` reports the cut
    (its oldest kept checkpoint lost its parent and the writes its hash covers) and stays ok;
    a checkpoint deleted behind the checkpointer's back in another thread is still tampering."""
    from langgraph_ckpt_ext import Retention

    graph = fan_graph().compile(checkpointer=audited)
    for i in range(3):
        graph.invoke({"items": [i, i + 1], "results": [], "total": 0}, conf("kept3"))
    audited.retention = Retention(keep=3)
    report = audited.sweep()
    assert report.trimmed.get("kept3")
    verdict = verify_fresh(audited_handle, audited, "kept3")
    assert verdict.checked == 3 and verdict.ok, str(verdict)
    assert {p.kind for p in verdict.problems} == {CUT}
    assert [e.action for e in audited.lifecycle_log("kept3")] == ["trim"]


def test_erasure_is_reported_as_such(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    """An erased thread verifies as erased (when, how many checkpoints, why), not as missing or
    tampered; a thread deleted without a record is still unknown."""
    chat = chat_graph().compile(checkpointer=audited)
    chat.invoke({"messages": [human("hi")]}, {**conf("gone"), "metadata": {"user_id": "u-1"}})
    chat.invoke({"messages": [human("hi")]}, conf("deleted"))
    report = audited.erase({"user_id": "u-1"}, reason="request 9")
    assert report.threads == ["gone"]
    verdict = audited.verify("gone")
    assert verdict.erased and verdict.ok and verdict.checked == 0
    assert "erased at" in str(verdict) and "request 9" in str(verdict)
    audited.delete_thread("deleted")
    with pytest.raises(ThreadNotFoundError):
        audited.verify("deleted")


def test_fork_of_an_audited_thread(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    """A fork copies a chain through `put` (the source's audit records are not carried over):
    it verifies clean, also when made by a checkpointer opened with audit=False (the store is
    audited: that flag turns nothing off)."""
    from langgraph_ckpt_ext.timetravel import fork

    chat = chat_graph().compile(checkpointer=audited)
    for i in range(3):
        chat.invoke({"messages": [human(f"hi {i}")]}, conf("src"))
    middle = sorted(t.checkpoint["id"] for t in audited.list(conf("src")))[4]
    fork(audited, conf("src", middle), "forked")
    chat.invoke({"messages": [human("on the fork")]}, conf("forked"))
    assert_clean(verify_fresh(audited_handle, audited, "forked"), 5)
    plain = reopen(audited_handle, audit=False)
    try:
        fork(plain, conf("src", middle), "forked-plain")
        assert_clean(plain.verify("forked-plain"), 5)
        assert plain.audit_status().enabled
    finally:
        if plain is not audited:
            plain.close()


def test_answering_an_old_interrupt_again(
    audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    """Resuming an old interrupt again replaces its special writes (not covered): the first
    answer's checkpoints still verify."""
    graph = approval_graph().compile(checkpointer=audited)
    graph.invoke({"request": "x", "log": []}, conf("again"))
    paused = audited.get_tuple(conf("again"))
    assert paused is not None
    graph.invoke(Command(resume="yes"), conf("again"))
    graph.invoke(Command(resume="no"), conf("again", paused.checkpoint["id"]))
    assert_clean(verify_fresh(audited_handle, audited, "again"), 6)


@pytest.fixture
def chat_thread(audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str) -> Iterator[Any]:
    """An audited chat thread of five turns (15 checkpoints, one namespace, oldest first), its
    checkpoints' channel versions, and raw access to its storage."""
    chat = chat_graph().compile(checkpointer=audited)
    for i in range(5):
        chat.invoke({"messages": [human(f"message {i}")]}, conf("t"))
    tuples = list(reversed(list(audited.list(conf("t")))))
    ids = [t.checkpoint["id"] for t in tuples]
    versions = [
        {ch: version_key(v) for ch, v in t.checkpoint["channel_versions"].items()} for t in tuples
    ]
    assert [t.parent_config["configurable"]["checkpoint_id"] for t in tuples[1:]] == ids[:-1]  # type: ignore[index]
    assert_clean(verify_fresh(audited_handle, audited, "t"), len(ids))
    raw = Raw(audited_handle)
    yield ids, versions, raw
    raw.close()


def check_first(h: SaverHandle, checkpoint_id: str, kind: str) -> AuditReport:
    """Both a fresh checkpointer and the writer find the problem at `checkpoint_id` first."""
    cp = h.saver
    for report in (verify_fresh(h, cp, "t"), cp.verify("t")):
        assert not report.ok
        first = report.first
        assert first is not None, str(report)
        assert (first.checkpoint_id, first.kind) == (checkpoint_id, kind), str(report)
        assert report.problems[0] is first and checkpoint_id in str(report)
    return report


@pytest.mark.parametrize("channel", ["turns", "messages"])
def test_altered_value_is_reported_at_its_first_reader(
    chat_thread: Any, audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str, channel: str
) -> None:
    ids, versions, raw = chat_thread
    # a value stored in the middle of the thread: re-encoded, so that it still decodes (the
    # messages are an append-delta there: the items it appends, one of them changed)
    version = versions[6][channel]
    type_, data, base = raw.blob("t", channel, version)
    assert (base is None) == (channel == "turns")
    value = audited.serde.loads_typed((type_, bytes(data)))
    if channel == "turns":
        forged = value + 100
    else:
        forged = [*value[:-1], value[-1].model_copy(update={"content": "forged"})]
    raw.set_blob("t", channel, version, audited.serde.dumps_typed(forged))
    first_reader = next(j for j, v in enumerate(versions) if v.get(channel) == version)
    report = check_first(audited_handle, ids[first_reader], ALTERED)
    assert "does not match its hash" in report.problems[0].detail
    # the checkpoints before it are untouched
    assert all(p.checkpoint_id >= ids[first_reader] for p in report.problems)


def test_deleted_checkpoint_is_reported_at_its_child(
    chat_thread: Any, audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    ids, _, raw = chat_thread
    raw.delete_checkpoint("t", ids[6])
    report = check_first(audited_handle, ids[7], MISSING_PARENT)
    assert ids[6] in report.problems[0].detail and "deleted" in report.problems[0].detail
    assert report.checked == len(ids) - 1


def test_swapped_checkpoints_are_reported_at_the_older(
    chat_thread: Any, audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    ids, _, raw = chat_thread
    raw.swap("t", ids[3], ids[9])
    report = check_first(audited_handle, ids[3], ALTERED)
    flagged = {p.checkpoint_id for p in report.problems}
    assert ids[9] in flagged  # the newer one does not match either
    assert ids[4] in flagged or ids[10] in flagged  # and a child no longer links up
    assert {p.kind for p in report.problems} <= {ALTERED, BROKEN_LINK}


def test_deleted_pending_write_is_reported_at_the_child(
    chat_thread: Any, audited: StoreCheckpointer, audited_handle: SaverHandle, backend: str
) -> None:
    ids, _, raw = chat_thread
    parent = audited.get_tuple(conf("t", ids[7]))
    assert parent is not None and parent.pending_writes
    child = audited.get_tuple(conf("t", ids[8]))
    assert child is not None and len(child.metadata["audit"]["writes"]) == len(  # type: ignore[typeddict-item]
        parent.pending_writes)
    task_id = parent.pending_writes[0][0]
    raw.delete_write("t", ids[7], task_id, 0)
    report = check_first(audited_handle, ids[8], ALTERED)
    assert "1 pending write(s) of its parent that it covers are gone" in report.problems[0].detail
