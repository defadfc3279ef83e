"""The helpers every checkpointer of ours has (time travel, sizes, audit, state-schema
migration) on `SmartCheckpointer` and `ReplicatedCheckpointer`, on every backend: the smart one
reads its buffer or writes it first, the replicated one reads the primary, and its migration
reaches the replicas."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    Periodic,
    ReplicatedCheckpointer,
    SmartCheckpointer,
)
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from tests.support.common import LoopThread, conf
from tests.support.graphs import chat_graph, human
from tests.support.savers import open_saver, params
from tests.support.schema_graphs import CHAIN, graph_v1, graph_v3, is_v3, v1_message

BACKENDS = ["memory", "sqlite", "postgres", "redis"]
WRAPPERS = ["smart", "replicated"]


class Setup:
    """A backend's checkpointer inside one of the wrappers (a replicated one with an
    in-memory replica), and an event loop for its async calls; closed and dropped at the end
    of the test."""

    def __init__(self, backend: str, wrapper: str, tmp_path: Path, **options: Any) -> None:
        self.backend, self.kind = backend, wrapper
        self.loop = LoopThread()
        self.handle = open_saver(backend, tmp_path, **options)
        self.inner = self.handle.saver
        self.replica: StoreCheckpointer | None = None
        self.cp: Any
        if wrapper == "smart":  # nothing is written before a thread is an hour old
            self.cp = SmartCheckpointer(self.inner, Periodic(3600))
        else:
            self.replica = InMemoryCheckpointer(**options)
            self.cp = ReplicatedCheckpointer(self.inner, [self.replica])

    def stored(self, thread: str) -> int:
        """Checkpoints of `thread` in the inner (primary) storage."""
        return len(list(self.inner.list(conf(thread))))

    def run(self, coro: Any) -> Any:
        return self.loop.run(coro)

    def close(self) -> None:
        self.cp.close()
        self.inner.close()
        self.loop.stop()
        self.handle.cleanup()


@pytest.fixture(params=params(BACKENDS))
def inner_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(params=WRAPPERS)
def wrapper(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def wrapped_setup(inner_backend: str, wrapper: str, tmp_path: Path) -> Iterator[Setup]:
    s = Setup(inner_backend, wrapper, tmp_path, audit=True)
    yield s
    s.close()


def run(coro: Any) -> Any:
    """(Only for calls that fail before any I/O: a store's async calls need one long-lived loop
    here; see `Setup.run`.)"""
    return asyncio.run(coro)


async def collect(it: Any) -> list[Any]:
    return [x async for x in it]


# -- time travel ------------------------------------------------------------------------------


def test_time_travel_methods(wrapped_setup: Setup) -> None:
    cp = wrapped_setup.cp
    graph = chat_graph().compile(checkpointer=cp)
    for turn in range(2):
        graph.invoke({"messages": [human(f"turn {turn}")]}, conf("t"))
    if wrapped_setup.kind == "smart":  # the whole thread is still buffered: read through the buffer
        assert wrapped_setup.stored("t") == 0
    listed = [t.config["configurable"]["checkpoint_id"] for t in cp.list(conf("t"))]

    entries = list(cp.history("t"))
    assert [e.checkpoint_id for e in entries] == listed
    assert [e.checkpoint_id for e in wrapped_setup.run(collect(cp.ahistory("t")))] == listed
    page = cp.history_page("t", size=2)
    assert [e.checkpoint_id for e in page.entries] == listed[:2]
    apage = wrapped_setup.run(cp.ahistory_page("t", size=2))
    assert [e.checkpoint_id for e in apage.entries] == listed[:2]

    newest, oldest = entries[0], entries[-1]
    assert cp.inspect(newest.config).values["turns"] == 2
    assert wrapped_setup.run(cp.ainspect(newest.config)).values["turns"] == 2
    d = cp.diff(entries[2].config, newest.config)
    assert d and d.apply(cp.inspect(entries[2].config).values) == (
        cp.inspect(newest.config).values)
    assert wrapped_setup.run(cp.adiff(entries[2].config, newest.config))

    assert len(cp.replay(oldest.config, newest.config)) == len(entries) - 1
    assert len(wrapped_setup.run(cp.areplay(oldest.config, newest.config))) == len(entries) - 1

    head = cp.fork(entries[2].config, "t-fork")
    assert cp.get_tuple(head) is not None
    assert wrapped_setup.run(cp.afork(entries[2].config, "t-afork")) is not None
    tree = cp.lineage("t")
    assert {c.thread_id for c in tree.children} == {"t-fork", "t-afork"}
    assert wrapped_setup.run(cp.alineage("t-fork")).thread_id == "t"
    graph.invoke({"messages": [human("on the fork")]}, head)
    assert graph.get_state(conf("t")).values["turns"] == 2  # the source is untouched
    if wrapped_setup.kind == "replicated":  # the forks were replicated
        assert cp.flush(10)
        assert wrapped_setup.replica is not None
        assert len(list(wrapped_setup.replica.list(conf("t-fork")))) == wrapped_setup.stored("t-fork")


# -- storage and audit ------------------------------------------------------------------------


def test_storage_and_audit_methods(wrapped_setup: Setup) -> None:
    cp = wrapped_setup.cp
    graph = chat_graph().compile(checkpointer=cp)
    for turn in range(3):
        graph.invoke({"messages": [human(f"turn {turn}")]}, conf("t"))
    graph.invoke({"messages": [human("u")]}, conf("u"))

    # Each reads stored rows: the smart checkpointer writes that thread's buffer first.
    sizes = cp.sizes("t")
    assert wrapped_setup.stored("t") == len(list(cp.list(conf("t"))))
    assert sizes == wrapped_setup.inner.sizes("t") and sum(s.rows for s in sizes) > 0
    assert wrapped_setup.run(cp.asizes("t")) == sizes
    report = cp.verify("t")
    assert report.checked == wrapped_setup.stored("t") and report == wrapped_setup.inner.verify("t")
    assert wrapped_setup.run(cp.averify("t")) == report
    if wrapped_setup.kind == "replicated":  # (a smart one's batches break the chain: see the report)
        assert report.ok, report
    assert cp.prune_plan("t") == wrapped_setup.inner.prune_plan("t") != []
    assert wrapped_setup.run(cp.aprune_plan("t", strategy="delete")) == wrapped_setup.inner.prune_plan(
        "t", strategy="delete")
    assert cp.thread_ids() == ["t", "u"] == wrapped_setup.run(cp.athread_ids())
    assert wrapped_setup.stored("u") > 0
    assert cp.storage_version() == wrapped_setup.inner.storage_version()
    assert wrapped_setup.run(cp.astorage_version()) == wrapped_setup.inner.storage_version()
    assert cp.migration_log() == [] == wrapped_setup.run(cp.amigration_log("t"))

    # The store's audit setting: read and switched on the inner (primary) store.
    assert cp.audit_status().enabled and cp.audit_status() == wrapped_setup.inner.audit_status()
    graph.invoke({"messages": [human("buffered")]}, conf("u"))
    off = cp.disable_audit(reason="a test")
    assert not off.enabled and off == wrapped_setup.inner.audit_status() == wrapped_setup.run(
        cp.aaudit_status())
    assert wrapped_setup.stored("u") == len(list(cp.list(conf("u"))))  # the buffer went first
    assert wrapped_setup.run(cp.aenable_audit(reason="back")).enabled
    assert not wrapped_setup.run(cp.adisable_audit(reason="again")).enabled
    assert cp.enable_audit().enabled and wrapped_setup.inner.audit_status().enabled


def test_a_method_the_inner_checkpointer_lacks_says_so(wrapper: str) -> None:
    inner, replica = InMemorySaver(), InMemorySaver()
    cp: Any = (SmartCheckpointer(inner) if wrapper == "smart"
               else ReplicatedCheckpointer(inner, [replica]))
    try:
        with pytest.raises(NotImplementedError, match=r"sizes\(\) needs one of this package's "
                                                      r"checkpointers.*InMemorySaver"):
            cp.sizes("t")
        with pytest.raises(NotImplementedError, match="verify"):
            run(cp.averify("t"))
        assert list(cp.history("t")) == []  # time travel needs only the saver interface
    finally:
        cp.close()


@pytest.mark.redis
def test_an_unforwarded_method_names_where_to_call_it(wrapper: str, tmp_path: Path) -> None:
    inner_h = open_saver("redis", tmp_path)
    inner = inner_h.saver
    cp: Any = (SmartCheckpointer(inner) if wrapper == "smart"
               else ReplicatedCheckpointer(inner, [InMemoryCheckpointer()]))
    where = "inner" if wrapper == "smart" else "primary"
    try:
        with pytest.raises(AttributeError, match=rf"call checkpointer\.{where}\.setup\(\.\.\.\)"):
            cp.setup()
        assert not hasattr(cp, "no_such_method")
    finally:
        cp.close()
        inner.close()
        inner_h.cleanup()


# -- state-schema migration -------------------------------------------------------------------


def write_v1(saver: Any) -> None:
    g1 = graph_v1().compile(checkpointer=saver)
    g1.invoke({"messages": [v1_message("human", "hello")]}, conf("done"))
    g1.invoke({"messages": [v1_message("human", "again")]}, conf("done"))
    g1.invoke({"messages": [v1_message("human", "ship it")]}, conf("paused"))


def test_migration_methods(inner_backend: str, wrapper: str, tmp_path: Path) -> None:
    s = Setup(inner_backend, wrapper, tmp_path)
    try:
        cp = s.cp
        if wrapper == "smart":
            write_v1(s.inner)  # stored under v1 ...
        else:
            write_v1(cp)  # ... on the primary and the replica alike
            assert cp.flush(10)
        s.inner.schema_chain = CHAIN  # the code now knows v3
        if wrapper == "smart":
            # A v3 turn on an old thread, still buffered: migrating must not lose it.
            g3 = graph_v3().compile(checkpointer=cp)
            g3.invoke({"messages": [human("more")]}, conf("done"))
            assert s.stored("done") < len(list(cp.list(conf("done"))))

        dry = cp.migrate_threads(dry_run=True, include_unstamped=True)
        assert dry.dry_run and dry.checkpoints_migrated > 0
        report = cp.migrate_threads(thread_ids=["done"], include_unstamped=True)
        assert report.threads_migrated == 1 and report.checkpoints_migrated > 0
        rest = s.run(cp.amigrate_threads(include_unstamped=True))
        assert rest.threads_migrated == 1
        assert cp.migrate_threads(include_unstamped=True).checkpoints_migrated == 0

        log = cp.migration_log("done")
        assert log and log == s.inner.migration_log("done") == s.run(cp.amigration_log("done"))
        assert {e.thread_id for e in cp.migration_log()} == {"done", "paused"}
        stored = [t.checkpoint["channel_values"] for t in s.inner.list(conf("done"))]
        assert all(is_v3(v) for v in stored if v.get("messages")), stored
        if wrapper == "smart":  # the buffered turn was written first, and read back whole
            values = s.inner.get_tuple(conf("done")).checkpoint["channel_values"]
            assert [m.content for m in values["messages"]][-2:] == ["more", "echo: more"]
        else:  # the replica holds the migrated threads, equal to the primary
            assert s.replica is not None
            for thread in ("done", "paused"):
                ours = [t.checkpoint for t in s.replica.list(conf(thread))]
                assert ours == [t.checkpoint for t in s.inner.list(conf(thread))], thread
            assert not any(r.needs_repair for r in cp.status().replicas), cp.status()
    finally:
        s.close()
