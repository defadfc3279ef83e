"""What the lifecycle tests share: a settable clock, configs, and threads written by a real
graph or by direct puts."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable
from typing import Any

from langchain_core.messages import HumanMessage
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6

from langgraph_ckpt_ext import Retention, ThreadDeletedError
from tests.support.graphs import chat_graph

DAY = 86400.0
T0 = 1_900_000_000.0


class Clock:
    """A settable clock, shared by a test and the stores it sets it on (`cp.clock = clock`)."""

    def __init__(self, now: float = T0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def later_id() -> str:
    """A checkpoint id that sorts after every id written so far, here or by another process.

    LangGraph's ids are time-ordered (uuid6): a fixed id in a test sorts before the real ids
    of a later day and stops being the newer one, so a test makes its ids from the clock too.
    Each call is later than the one before in this process, and unique across processes."""
    return str(uuid6())


def cfg(thread_id: str, **more: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread_id, "checkpoint_ns": "", **more}}


def chat(cp: Any, thread_id: str, turns: int = 1, **metadata: Any) -> None:
    """`turns` turns of the chat graph on the thread, with `metadata` on its config."""
    graph = chat_graph().compile(checkpointer=cp)
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id}, "metadata": metadata}
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"m{i}")]}, config)


def put_chain(cp: Any, thread_id: str, n: int, config: Any = None) -> Any:
    """`n` checkpoints of a growing list (append-deltas), each the child of the one before,
    by direct `put`s (after `config`'s checkpoint, if given); the last one's config."""
    config = config or cfg(thread_id)
    version = None
    for i in range(n):
        ckpt = empty_checkpoint()
        version = cp.get_next_version(version, None)
        ckpt["channel_values"] = {"items": list(range(i + 1))}
        ckpt["channel_versions"] = {"items": version}
        config = cp.put(config, ckpt, {"source": "loop", "step": i}, {"items": version})
    return config


def sweeps_beside_a_graph(cp: Any, sweep: Callable[[], object], turns: int = 12,
                          settle: Callable[[], object] | None = None) -> None:
    """Run `turns` turns of a thread on `cp` (its clock moved on so that every thread looks
    expired to the next pass) while `sweep` runs in a loop: no error (but a turn whose thread
    expired under it, refused by the tombstone rather than writing onto deleted rows),
    whatever is left reads back whole (a blob gone under a stored checkpoint raises), and
    the thread goes on.

    `settle` (a buffering checkpointer's `flush`) runs once the turns are done: a buffered
    turn is refused when it is written, which may be after its run returned, and the refusal
    is then raised to whatever next writes on its chain. Settled first, that is this flush
    (allowed, as in a turn), never the run after it, however the threads were scheduled."""
    clock = Clock()
    cp.clock = clock
    cp.retention = Retention(idle=1)
    stop = threading.Event()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            for _ in range(turns):
                # expired under the run: its late put refused
                with contextlib.suppress(ThreadDeletedError):
                    chat(cp, "busy")
                clock.advance(2)
        except BaseException as exc:  # reported below
            errors.append(exc)
        finally:
            stop.set()

    writer = threading.Thread(target=run)
    writer.start()
    passes = 0
    while not stop.is_set() or passes == 0:
        sweep()
        passes += 1
    writer.join()
    assert not errors
    if settle is not None:
        with contextlib.suppress(ThreadDeletedError):
            settle()
    for tup in cp.list(cfg("busy")):
        assert tup.checkpoint["channel_values"]
    chat(cp, "busy")
    latest = cp.get_tuple(cfg("busy"))
    assert latest is not None and latest.checkpoint["channel_values"]["messages"]
