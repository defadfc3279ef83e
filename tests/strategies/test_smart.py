"""SmartCheckpointer on its own terms: policies, the buffer and its reads, flushing, coalescing,
failures and metrics (the conformance suite and the graph scenarios run it too)."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage
from langgraph.checkpoint.base import BaseCheckpointSaver
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langgraph_ckpt_ext import (
    EveryStep,
    Hybrid,
    InvalidConfigError,
    OnEvents,
    Periodic,
    SmartCheckpointer,
)
from langgraph_ckpt_ext.strategies import AnyOf, ThreadActivity
from tests.support.graphs import approval_graph, chat_graph, human
from tests.support.savers import SaverHandle, open_saver, params


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def stored(inner: BaseCheckpointSaver[Any], thread: str) -> list[str]:
    return [t.checkpoint["id"] for t in inner.list(cfg(thread))]


def test_bad_policies_are_refused_when_built() -> None:
    with pytest.raises(InvalidConfigError, match="interval must be a number of seconds >= 0"):
        Periodic(-1)
    with pytest.raises(InvalidConfigError, match=r"unknown save event\(s\) \['lunch'\]"):
        OnEvents(events=frozenset({"interrupt", "lunch"}))
    with pytest.raises(InvalidConfigError, match="min_interval"):
        Hybrid(min_interval=5, max_interval=1)
    with pytest.raises(InvalidConfigError, match="max_interval"):
        OnEvents(max_interval=float("nan"))
    with pytest.raises(InvalidConfigError, match="policy must be a Policy"):
        SmartCheckpointer(InMemorySaver(), "every step")  # type: ignore[arg-type]
    with pytest.raises(InvalidConfigError, match="inner must be"):
        SmartCheckpointer(object())  # type: ignore[arg-type]


def test_policies_combine_and_hybrid_adapts() -> None:
    both = Periodic(10) | OnEvents(events=frozenset({"error"}))
    assert isinstance(both, AnyOf) and both.flush_on(["error"]) and not both.flush_on(["end"])
    idle = ThreadActivity(0, 1, rate=0.1)
    busy = ThreadActivity(0, 1, rate=50)
    assert both.max_age(idle) == 10
    hybrid = Hybrid(min_interval=1, max_interval=30)
    assert hybrid.max_age(idle) == 30 and hybrid.max_age(busy) == 1
    assert 1 < hybrid.max_age(ThreadActivity(0, 1, rate=5)) < 30


@pytest.mark.parametrize("backend", ["memory", "sqlite"])
def test_events_policy_buffers_a_run_and_serves_it(backend: str, tmp_path: Path) -> None:
    inner_h = open_saver(backend, tmp_path)
    inner = inner_h.saver
    smart = SmartCheckpointer(inner, OnEvents(events=frozenset({"interrupt"})))
    try:
        graph = chat_graph().compile(checkpointer=smart)
        graph.invoke({"messages": [human("one")]}, cfg("t"))
        graph.invoke({"messages": [human("two")]}, cfg("t"))
        assert stored(inner, "t") == []  # nothing written yet...
        state = graph.get_state(cfg("t"))  # ...and yet read back, in order
        assert state.values["turns"] == 2
        history = list(graph.get_state_history(cfg("t")))
        assert [s.metadata["step"] for s in history] == [4, 3, 2, 1, 0, -1]
        m = smart.metrics
        assert m.saves_requested == 6 and m.checkpoints_written == 0 and m.buffered >= 6
        assert m.oldest_unflushed_age > 0
        smart.flush()
        assert len(stored(inner, "t")) == 6
        assert [t.checkpoint["id"] for t in inner.list(cfg("t"))] == [
            s.config["configurable"]["checkpoint_id"] for s in history]
        m = smart.metrics
        assert m.batches == 1 and m.buffered == 0 and m.checkpoints_written == 6
    finally:
        smart.close()
        inner.close()
        inner_h.cleanup()


def test_an_interrupt_is_written_at_once_whatever_the_policy() -> None:
    inner = InMemorySaver()
    smart = SmartCheckpointer(inner, Periodic(3600))
    graph = approval_graph().compile(checkpointer=smart)
    graph.invoke({"request": "r", "log": []}, cfg("ask"))
    assert len(stored(inner, "ask")) >= 3  # the pause is durable before invoke returns
    pending = inner.get_tuple(cfg("ask"))
    assert pending is not None and any(w[1] == "__interrupt__" for w in pending.pending_writes)
    out = approval_graph().compile(checkpointer=inner).invoke(Command(resume="y"), cfg("ask"))
    assert out["log"][-1] == "acted on y"
    smart.close()


def test_every_step_and_events_write_when_they_should() -> None:
    inner = InMemorySaver()
    every = SmartCheckpointer(inner, EveryStep())
    chat_graph().compile(checkpointer=every).invoke({"messages": [human("x")]}, cfg("e"))
    assert every.metrics.buffered == 0 and len(stored(inner, "e")) == 3
    assert every.metrics.batches >= 3  # one per save: nothing batched

    events = SmartCheckpointer(inner)  # default: events, including the end of a run
    chat_graph().compile(checkpointer=events).invoke({"messages": [human("x")]}, cfg("f"))
    assert events.metrics.buffered == 0 and len(stored(inner, "f")) == 3
    assert events.metrics.batches == 1  # the whole run in one batch, at its end
    every.close()
    events.close()


def test_a_write_that_comes_after_its_run_ended_is_written_at_once() -> None:
    """LangGraph sends a step's writes from a background task: they may come after the
    run's last checkpoint, which the end-of-run event has written. They go at once too, so
    that nothing of the run is left buffered when it returns; a new run's wait again."""
    from langgraph.checkpoint.base import empty_checkpoint

    inner = InMemorySaver()
    smart = SmartCheckpointer(inner)  # OnEvents(): the end of a run is an event
    conf = {"configurable": {"thread_id": "late", "checkpoint_ns": ""}}
    conf0 = smart.put(conf, _checkpoint("c0"), {"source": "loop", "step": 0}, {})
    end = empty_checkpoint()
    end["id"] = "c1"
    conf1 = smart.put(conf0, end, {"source": "loop", "step": 1}, {})
    assert stored(inner, "late") == ["c1", "c0"] and smart.metrics.buffered == 0
    smart.put_writes(conf0, [("messages", ["late"])], "task-0")
    assert smart.metrics.buffered == 0
    tup = inner.get_tuple(cfg("late") | {"configurable": {
        "thread_id": "late", "checkpoint_ns": "", "checkpoint_id": "c0"}})
    assert tup is not None and [w[2] for w in tup.pending_writes] == [["late"]]
    conf2 = smart.put(conf1, _checkpoint("c2"), {"source": "input", "step": 2}, {})
    smart.put_writes(conf2, [("messages", ["next"])], "task-2")
    assert smart.metrics.buffered == 2  # a new run: its step waits for an event
    smart.close()


def test_tool_calls_and_plan_changes_are_events() -> None:
    inner = InMemorySaver()
    smart = SmartCheckpointer(inner, OnEvents(events=frozenset({"tool_call", "plan_change"})))
    conf = smart.put(cfg("x") | {"configurable": {"thread_id": "x", "checkpoint_ns": ""}},
                     _checkpoint("c1"), {"source": "loop", "step": 0}, {})
    assert stored(inner, "x") == []
    smart.put_writes(conf, [("messages", [AIMessage("", tool_calls=[
        {"id": "1", "name": "send_email", "args": {}}])])], "task-1")
    assert stored(inner, "x") == ["c1"]  # saved before the tool with side effects runs
    conf2 = smart.put(conf, _checkpoint("c2"), {"source": "loop", "step": 1}, {})
    assert stored(inner, "x") == ["c1"]
    smart.put_writes(conf2, [("plan", ["new step"])], "task-2")
    assert stored(inner, "x") == ["c2", "c1"]
    smart.close()


def _checkpoint(cid: str) -> Any:
    from langgraph.checkpoint.base import empty_checkpoint

    cp = empty_checkpoint()
    cp["id"] = cid
    cp["channel_values"] = {"branch:to:agent": None}
    cp["channel_versions"] = {"branch:to:agent": 1}
    return cp


def test_periodic_timer_flushes_on_its_own() -> None:
    inner = InMemorySaver()
    smart2 = SmartCheckpointer(inner, Periodic(0.1))
    g2 = chat_graph().compile(checkpointer=smart2)
    g2.invoke({"messages": [human("x")]}, cfg("q"), durability="exit")
    deadline = time.monotonic() + 5
    while stored(inner, "q") == [] and time.monotonic() < deadline:
        time.sleep(0.02)
    assert stored(inner, "q") != []
    smart2.close()


class Flaky(InMemorySaver):
    def __init__(self) -> None:
        super().__init__()
        self.fail = True

    def put(self, *args: Any, **kwargs: Any) -> Any:
        if self.fail:
            raise ConnectionError("database went away")
        return super().put(*args, **kwargs)


def test_a_failed_flush_keeps_the_buffer_and_reports() -> None:
    inner = Flaky()
    smart = SmartCheckpointer(inner, Periodic(3600))
    graph = chat_graph().compile(checkpointer=smart)
    graph.invoke({"messages": [human("x")]}, cfg("f"))
    with pytest.raises(ConnectionError, match="went away"):
        smart.flush()
    m = smart.metrics
    assert m.flush_failures == 1 and isinstance(m.last_error, ConnectionError)
    assert m.buffered >= 3 and graph.get_state(cfg("f")).values["turns"] == 1
    inner.fail = False
    smart.flush()
    assert len(stored(inner, "f")) == 3 and smart.metrics.buffered == 0
    smart.close()


def test_coalesce_keeps_the_newest_checkpoint_reparented() -> None:
    inner = InMemorySaver()
    smart = SmartCheckpointer(inner, Periodic(3600), coalesce=True)
    graph = chat_graph().compile(checkpointer=smart)
    graph.invoke({"messages": [human("a")]}, cfg("c"))
    smart.flush()
    first = stored(inner, "c")
    assert len(first) == 1
    graph.invoke({"messages": [human("b")]}, cfg("c"))
    graph.invoke({"messages": [human("c")]}, cfg("c"))
    smart.flush()
    rows = list(inner.list(cfg("c")))
    assert len(rows) == 2 and rows[0].parent_config["configurable"]["checkpoint_id"] == first[0]
    plain = chat_graph().compile(checkpointer=inner)
    values = plain.get_state(cfg("c")).values
    assert values["turns"] == 3 and [m.content for m in values["messages"]][-2:] == [
        "c", "echo: c"]
    out = plain.invoke({"messages": [human("d")]}, cfg("c"))
    assert out["turns"] == 4
    smart.close()


def test_bounded_buffer_flushes_early() -> None:
    inner = InMemorySaver()
    smart = SmartCheckpointer(inner, Periodic(3600), max_checkpoints=4)
    graph = chat_graph().compile(checkpointer=smart)
    for i in range(3):
        graph.invoke({"messages": [human(str(i))]}, cfg("b"))
    assert len(stored(inner, "b")) > 0 and smart.metrics.buffered <= 4 * 2
    tiny = SmartCheckpointer(inner, Periodic(3600), max_bytes=100)
    chat_graph().compile(checkpointer=tiny).invoke({"messages": [human("x" * 500)]}, cfg("y"))
    assert stored(inner, "y")
    smart.close()
    tiny.close()


# -- a batch that does not wait for the one before it ---------------------------------------


class GatedStore:
    """A real store whose `write_batch` calls can be held at a gate before they go out (each
    call takes the next gate; past the last, calls go straight through), or made to fail."""

    def __init__(self, store: Any, gates: int) -> None:
        self._inner = store
        self.gates = [asyncio.Event() for _ in range(gates)]
        self.fail: set[int] = set()  # calls (0-based) that raise instead of writing
        self.calls = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    async def write_batch(self, items: Any, guards: Any = None) -> Any:
        n = self.calls
        self.calls += 1
        if n < len(self.gates):
            await self.gates[n].wait()
        if n in self.fail:
            raise ConnectionError(f"batch {n} lost")
        return await self._inner.write_batch(items, guards)


def _gated(kind: str, tmp_path: Path, gates: int) -> tuple[SaverHandle, GatedStore]:
    """A backend's saver (in its handle) whose store writes batches through a `GatedStore`.
    `writers="last_wins"`: a batch carries the one still out only then (a carried batch
    written twice would not chain onto the head the second time: see `Buffer.take`)."""
    inner_h = open_saver(kind, tmp_path, writers="last_wins")
    inner = inner_h.saver
    inner.setup()
    gated = GatedStore(inner._store, gates)
    inner._store = gated  # type: ignore[assignment]
    return inner_h, gated


async def _run_two_batches(smart: SmartCheckpointer) -> tuple[asyncio.Task[None], Any]:
    """Checkpoint c1 and a plan change (an event: batch 1, whose write is held), then c2 and
    another plan change (batch 2). Returns batch 1's task and c2's config."""
    conf = {"configurable": {"thread_id": "g", "checkpoint_ns": ""}}
    conf1 = await smart.aput(conf, _checkpoint("c1"), {"source": "loop", "step": 0}, {})
    first = asyncio.create_task(smart.aput_writes(conf1, [("plan", ["a"])], "task-1"))
    await asyncio.sleep(0.05)
    assert not first.done()
    conf2 = await smart.aput(conf1, _checkpoint("c2"), {"source": "loop", "step": 1}, {})
    return first, conf2


async def _closing(inner: Any, main: Any) -> None:
    """Run `main`, then close the inner checkpointer's clients of this loop before it goes."""
    try:
        await main
    finally:
        await inner.aclose()


def _stored_plan(inner: Any) -> list[tuple[str, list[Any]]]:
    return [(t.checkpoint["id"], [w[2] for w in t.pending_writes or []])
            for t in inner.list(cfg("g"))]


async def _astored_plan(inner: Any) -> list[tuple[str, list[Any]]]:
    return [(t.checkpoint["id"], [w[2] for w in t.pending_writes or []])
            async for t in inner.alist(cfg("g"))]


@pytest.mark.parametrize("kind", params(["memory", "sqlite", "postgres", "redis"]))
def test_a_batch_carries_the_one_still_out_instead_of_waiting(kind: str, tmp_path: Path) -> None:
    inner_h, gated = _gated(kind, tmp_path, gates=1)
    inner = inner_h.saver
    smart = SmartCheckpointer(inner, OnEvents())

    async def main() -> None:
        first, conf2 = await _run_two_batches(smart)
        # Batch 2 goes out while batch 1 is held, with batch 1's rows: one statement for both.
        await asyncio.wait_for(smart.aput_writes(conf2, [("plan", ["b"])], "task-2"), 10)
        assert not first.done()
        assert smart.metrics.buffered == 0 and smart.metrics.batches == 1
        gated.gates[0].set()
        await asyncio.wait_for(first, 10)  # batch 1 lands too: the same rows, upserted
        assert await _astored_plan(inner) == [("c2", [["b"]]), ("c1", [["a"]])]
        assert smart.metrics.flush_failures == 0

    try:
        asyncio.run(_closing(inner, main()))
    finally:
        smart.close()
        inner_h.cleanup()


@pytest.mark.parametrize("kind", params(["sqlite", "postgres"]))
def test_a_lost_batch_carried_by_a_stored_one_is_not_written_again(
    kind: str, tmp_path: Path
) -> None:
    inner_h, gated = _gated(kind, tmp_path, gates=1)
    inner = inner_h.saver
    gated.fail = {0}
    smart = SmartCheckpointer(inner, OnEvents())

    async def main() -> None:
        first, conf2 = await _run_two_batches(smart)
        await asyncio.wait_for(smart.aput_writes(conf2, [("plan", ["b"])], "task-2"), 10)
        gated.gates[0].set()
        await first  # its rows are stored (by batch 2): its caller gets no error
        await smart.aflush()
        m = smart.metrics
        assert m.flush_failures == 1 and m.buffered == 0 and gated.calls == 2
        assert isinstance(m.last_error, ConnectionError)
        assert await _astored_plan(inner) == [("c2", [["b"]]), ("c1", [["a"]])]

    try:
        asyncio.run(_closing(inner, main()))
    finally:
        smart.close()
        inner_h.cleanup()


@pytest.mark.parametrize("first_fails", [True, False])
def test_when_the_carrying_batch_fails_everything_goes_back_in_order(
    first_fails: bool, tmp_path: Path
) -> None:
    inner_h, gated = _gated("sqlite", tmp_path, gates=1)
    inner = inner_h.saver
    gated.fail = {0, 1} if first_fails else {1}
    smart = SmartCheckpointer(inner, OnEvents())

    async def main() -> None:
        first, conf2 = await _run_two_batches(smart)
        with pytest.raises(ConnectionError, match="batch 1 lost"):
            await smart.aput_writes(conf2, [("plan", ["b"])], "task-2")
        # Nothing stored, both batches back in the queue, still served from it.
        assert _stored_plan(inner) == []
        tup = await smart.aget_tuple(cfg("g"))
        assert tup is not None and tup.checkpoint["id"] == "c2"
        gated.gates[0].set()
        if first_fails:
            with pytest.raises(ConnectionError, match="batch 0 lost"):
                await first
        else:
            await first
        assert smart.metrics.buffered == 4
        await smart.aflush()
        assert smart.metrics.buffered == 0
        assert await _astored_plan(inner) == [("c2", [["b"]]), ("c1", [["a"]])]

    try:
        asyncio.run(_closing(inner, main()))
    finally:
        smart.close()


class GatedSaver(InMemorySaver):
    """Not ours: its batches cannot carry others, so a flush waits for the one still out."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = asyncio.Event()
        self.held = False

    async def aput_writes(self, *args: Any, **kwargs: Any) -> None:
        if not self.held:
            self.held = True
            await self.gate.wait()
        super().put_writes(*args, **kwargs)


def test_a_checkpointer_that_cannot_carry_waits_for_the_batch_still_out() -> None:
    inner = GatedSaver()
    smart = SmartCheckpointer(inner, OnEvents())

    async def main() -> None:
        first, conf2 = await _run_two_batches(smart)
        second = asyncio.create_task(smart.aput_writes(conf2, [("plan", ["b"])], "task-2"))
        await asyncio.sleep(0.1)
        assert not second.done() and stored(inner, "g") == ["c1"]
        inner.gate.set()
        await asyncio.wait_for(asyncio.gather(first, second), 10)

    asyncio.run(main())
    assert _stored_plan(inner) == [("c2", [["b"]]), ("c1", [["a"]])]
    smart.close()


class PutGate(InMemorySaver):
    """Holds each `put` until its gate opens."""

    def __init__(self) -> None:
        super().__init__()
        self.gate = threading.Event()
        self.entered = threading.Event()

    def put(self, *args: Any, **kwargs: Any) -> Any:
        self.entered.set()
        self.gate.wait(10)
        return super().put(*args, **kwargs)


def test_writes_stored_before_their_checkpoint_stay_visible_while_it_is_written() -> None:
    """An interrupt's writes may come (and be written) before their checkpoint. A read that
    finds the checkpoint still being written serves those writes with it, even when the
    checkpoint's write ends between the read's look at the buffer and its answer."""
    inner = PutGate()
    smart = SmartCheckpointer(inner, Periodic(3600))
    conf = {"configurable": {"thread_id": "o", "checkpoint_ns": "", "checkpoint_id": "c1"}}
    smart.put_writes(conf, [("__interrupt__", ["approve?"])], "task-1")
    putter = threading.Thread(target=smart.put, args=(
        {"configurable": {"thread_id": "o", "checkpoint_ns": ""}}, _checkpoint("c1"),
        {"source": "loop", "step": 0}, {}))
    putter.start()
    assert inner.entered.wait(10)
    snapshot = smart._snapshot

    def settle_meanwhile(thread_id: str | None) -> Any:
        items = snapshot(thread_id)
        inner.gate.set()  # the checkpoint's write ends right after the read looked
        putter.join(10)
        return items

    smart._snapshot = settle_meanwhile  # type: ignore[method-assign]
    tup = smart.get_tuple(cfg("o"))
    assert tup is not None and tup.checkpoint["id"] == "c1"
    assert [(w[1], w[2]) for w in tup.pending_writes] == [("__interrupt__", ["approve?"])]
    smart.close()


class TwoGates(InMemorySaver):
    """Holds each `put_writes` and each `put` until its gate opens (cannot carry a batch: a
    flush of the thread waits for the one still out)."""

    def __init__(self) -> None:
        super().__init__()
        self.writes_gate, self.put_gate = threading.Event(), threading.Event()
        self.writing, self.putting = threading.Event(), threading.Event()

    def put_writes(self, *args: Any, **kwargs: Any) -> None:
        self.writing.set()
        self.writes_gate.wait(10)
        super().put_writes(*args, **kwargs)

    def put(self, *args: Any, **kwargs: Any) -> Any:
        self.putting.set()
        self.put_gate.wait(10)
        return super().put(*args, **kwargs)


def test_writes_stored_while_their_checkpoint_waits_behind_them_stay_visible() -> None:
    """The interrupt's writes go out first; their checkpoint comes while they are being written
    and queues behind them. Once the writes are stored (the checkpoint still buffered), a read
    served from the buffer has them: it is what `get_state` reads right after the run."""
    inner = TwoGates()
    smart = SmartCheckpointer(inner, Periodic(3600))
    thread = {"configurable": {"thread_id": "q", "checkpoint_ns": ""}}
    conf = {"configurable": {**thread["configurable"], "checkpoint_id": "c1"}}
    writer = threading.Thread(target=smart.put_writes,
                              args=(conf, [("__interrupt__", ["approve?"])], "task-1"))
    writer.start()
    assert inner.writing.wait(10)
    putter = threading.Thread(target=smart.put, args=(
        thread, _checkpoint("c1"), {"source": "loop", "step": 0}, {}))
    putter.start()
    # the checkpoint is queued (urgent: its writes were an interrupt) behind the writes
    deadline = time.monotonic() + 10
    while smart.metrics.buffered < 2 and time.monotonic() < deadline:
        time.sleep(0.005)
    assert smart.metrics.buffered == 2
    inner.writes_gate.set()
    writer.join(10)
    assert inner.putting.wait(10)  # the writes are stored, the checkpoint's write is out
    for tup in (smart.get_tuple(cfg("q")), smart.get_tuple(conf), next(smart.list(cfg("q")))):
        assert tup is not None and tup.checkpoint["id"] == "c1"
        assert [(w[1], w[2]) for w in tup.pending_writes] == [("__interrupt__", ["approve?"])]
    inner.put_gate.set()
    putter.join(10)
    tup = smart.get_tuple(cfg("q"))
    assert tup is not None and [(w[1], w[2]) for w in tup.pending_writes] == [
        ("__interrupt__", ["approve?"])]
    assert smart._buffer.orphans == {}  # forgotten once the checkpoint is stored
    smart.close()


@pytest.mark.parametrize("flushed", [False, True])
def test_a_checkpoint_keeps_exactly_its_keys(flushed: bool) -> None:
    """What LangGraph put comes back with exactly its keys, buffered or stored (LangGraph's
    `copy_checkpoint` would add `pending_sends`; its own tests compare whole checkpoints)."""
    inner = InMemorySaver()
    smart = SmartCheckpointer(inner, Periodic(3600))
    put = _checkpoint("c1")
    put.pop("pending_sends", None)  # type: ignore[misc]
    smart.put({"configurable": {"thread_id": "k", "checkpoint_ns": ""}}, put,
              {"source": "loop", "step": 0}, {})
    if flushed:
        smart.flush()
    tup = smart.get_tuple(cfg("k"))
    assert tup is not None and set(tup.checkpoint) == set(put)
    smart.close()
