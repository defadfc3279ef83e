"""SmartCheckpointer and the checkpointer it wraps: how a buffer is written to each kind
(rows, a batch call, op by op, chosen once from `core.inner`'s protocols), sync use of
LangGraph's own savers, sync calls that never suspend (they run even on a thread whose event
loop is running), and sync listings that close what they read when the caller stops early."""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.types import Command

from langgraph_ckpt_ext import InMemoryCheckpointer, Periodic, SmartCheckpointer
from langgraph_ckpt_ext.core.inner import BatchSaver, Op, RowSaver
from tests.support.graphs import approval_graph, chat_graph, human


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def run_graphs(cp: SmartCheckpointer) -> None:
    """A chat turn and an approval that pauses and resumes, on two threads."""
    chat = chat_graph().compile(checkpointer=cp)
    assert chat.invoke({"messages": [human("hi")]}, cfg("c"))["turns"] == 1
    approval = approval_graph().compile(checkpointer=cp)
    approval.invoke({"request": "deploy"}, cfg("a"))
    assert approval.get_state(cfg("a")).next == ("ask",)
    out = approval.invoke(Command(resume="yes"), cfg("a"))
    assert out["decision"] == "yes"


class Recording(InMemorySaver):
    """A LangGraph saver that counts the calls it gets."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: list[str] = []

    def put(self, *args: Any, **kwargs: Any) -> Any:
        self.calls.append("put")
        return super().put(*args, **kwargs)

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        self.calls.append("put_writes")
        super().put_writes(*args, **kwargs)


class Batching(Recording):
    """One that also stores a batch in one call (a `BatchSaver`)."""

    def put_batch(self, ops: Sequence[Op]) -> None:
        self.calls.append(f"put_batch:{len(ops)}")
        for op in ops:
            if op[0] == "put":
                InMemorySaver.put(self, *op[1:])
            else:
                InMemorySaver.put_writes(self, *op[1:])

    async def aput_batch(self, ops: Sequence[Op]) -> None:
        self.put_batch(ops)


def test_the_protocols_tell_the_kinds_apart() -> None:
    ours, plain, batching = InMemoryCheckpointer(), Recording(), Batching()
    assert isinstance(ours, RowSaver) and isinstance(ours, BatchSaver)
    assert not isinstance(plain, BatchSaver)
    assert isinstance(batching, BatchSaver) and not isinstance(batching, RowSaver)
    smart = SmartCheckpointer(ours)
    assert not isinstance(smart, BatchSaver)  # a smart one is written to op by op
    smart.close()


def test_a_batch_saver_gets_one_call_per_flush_and_a_plain_one_each_op() -> None:
    for inner, batched in ((Batching(), True), (Recording(), False)):
        smart = SmartCheckpointer(inner, Periodic(3600))
        graph = chat_graph().compile(checkpointer=smart)
        graph.invoke({"messages": [human("hi")]}, cfg("t"))
        assert inner.calls == []
        smart.flush()
        if batched:
            assert len(inner.calls) == 1 and inner.calls[0].startswith("put_batch:")
        else:
            assert "put" in inner.calls and not any(c.startswith("put_batch") for c in inner.calls)
        assert [t.checkpoint["id"] for t in inner.list(cfg("t"))] == [
            t.checkpoint["id"] for t in smart.list(cfg("t"))]
        smart.close()


def test_sync_use_of_langgraphs_savers(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "official.db", check_same_thread=False)
    for inner in (InMemorySaver(), SqliteSaver(conn)):
        with SmartCheckpointer(inner, Periodic(3600)) as smart:
            run_graphs(smart)
            assert smart.metrics.buffered > 0
            buffered = [t.checkpoint["id"] for t in smart.list(cfg("c"))]
            smart.flush()
            assert [t.checkpoint["id"] for t in inner.list(cfg("c"))] == buffered
            smart.delete_thread("a")
            assert smart.get_tuple(cfg("a")) is None and inner.get_tuple(cfg("a")) is None
    conn.close()


@pytest.mark.parametrize("inner", ["ours", "langgraph"])
def test_sync_calls_do_not_need_or_touch_the_running_loop(inner: str) -> None:
    """A sync call made from a coroutine (say, a sync tool inside an async app) runs to its
    end there: its coroutine never suspends, so it needs no event loop."""
    saver: Any = InMemoryCheckpointer() if inner == "ours" else InMemorySaver()
    smart = SmartCheckpointer(saver, Periodic(3600))

    async def main() -> None:
        run_graphs(smart)
        smart.flush()
        assert smart.metrics.buffered == 0
        assert len(list(smart.list(cfg("c")))) >= 2
        smart.close()

    asyncio.run(main())


class Listing(InMemorySaver):
    """Records whether a listing it handed out was closed."""

    def __init__(self) -> None:
        super().__init__()
        self.open = 0

    def list(self, *args: Any, **kwargs: Any) -> Iterator[Any]:
        self.open += 1
        try:
            yield from super().list(*args, **kwargs)
        finally:
            self.open -= 1


@pytest.mark.parametrize("in_loop", [False, True])
def test_a_sync_listing_stopped_early_closes_the_inner_one(in_loop: bool) -> None:
    inner = Listing()
    smart = SmartCheckpointer(inner)  # events: the run is written at its end
    graph = chat_graph().compile(checkpointer=smart)
    graph.invoke({"messages": [human("hi")]}, cfg("t"))
    assert smart.metrics.buffered == 0

    def look() -> None:
        listing = smart.list(cfg("t"))
        assert next(listing) is not None
        assert inner.open == 1
        listing.close()  # as a `for` that breaks, or a dropped iterator
        assert inner.open == 0

    if in_loop:
        async def main() -> None:
            look()

        asyncio.run(main())
    else:
        look()
    smart.close()


def test_an_allowlisted_copy_writes_and_reads_through_its_own_inner_copy() -> None:
    inner = InMemoryCheckpointer()
    smart = SmartCheckpointer(inner, Periodic(3600))
    copy = smart.with_allowlist([("tests.graphs", "Extra")])
    assert copy is not smart and copy.inner is not inner
    graph = chat_graph().compile(checkpointer=copy)
    graph.invoke({"messages": [human("hi")]}, cfg("t"))
    assert smart.metrics.buffered > 0  # one buffer for both
    copy.flush()
    assert smart.metrics.buffered == 0 and inner.get_tuple(cfg("t")) is not None
    smart.close()


def test_async_delete_waits_for_a_flush_on_its_own_loop() -> None:
    """`adelete_thread` while an async flush of that thread is writing, on the same loop: the
    delete waits for the flush by yielding to the loop (it once slept in a loop that blocked
    the very flush it waited for, forever), and the thread is gone afterwards."""
    import threading

    from langgraph.checkpoint.base import empty_checkpoint

    class Slow(InMemorySaver):
        async def aput(self, *a: Any, **k: Any) -> Any:
            await asyncio.sleep(0.2)
            return self.put(*a, **k)

    inner = Slow()
    errors: list[BaseException] = []
    config: Any = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}

    async def main() -> None:
        smart = SmartCheckpointer(inner, Periodic(3600))
        await smart.aput(config, empty_checkpoint(), {}, {})
        flush = asyncio.create_task(smart.aflush())
        await asyncio.sleep(0.05)  # the flush is writing
        await smart.adelete_thread("t")
        await flush
        assert await smart.aget_tuple(config) is None

    def run() -> None:
        try:
            asyncio.run(main())
        except BaseException as exc:
            errors.append(exc)

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(10)
    assert not t.is_alive(), "adelete_thread hung behind the flush it waits for"
    assert not errors, errors
