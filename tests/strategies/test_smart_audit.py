"""A SmartCheckpointer buffering several runs before one flush: what reaches the store is what
LangGraph put, so every checkpoint a flush writes to an audited store verifies clean.

LangGraph starts a run from the checkpoint it reads and updates that checkpoint's channel
versions in place; read from the buffer, the checkpoint must not share them with the buffered
one (else the flush stores the next run's versions under the previous run's checkpoint)."""

from __future__ import annotations

import copy
import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import ChannelVersions, Checkpoint, CheckpointMetadata
from langgraph.types import Command

from langgraph_ckpt_ext import SmartCheckpointer
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.strategies.policies import Periodic
from tests.core.test_audit import assert_clean, verify_fresh
from tests.support.common import LoopThread, conf
from tests.support.graphs import approval_graph, chat_graph, fan_graph, human, subgraph_graph
from tests.support.savers import SaverHandle, open_saver, params

BACKENDS = ["memory", "sqlite", "postgres", "redis"]


class Recording(SmartCheckpointer):
    """A SmartCheckpointer noting each checkpoint's record as it was put (a deep copy)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.put_records: dict[str, dict[str, Any]] = {}

    def _note(self, checkpoint: Checkpoint) -> None:
        self.put_records[checkpoint["id"]] = {
            "channel_versions": copy.deepcopy(checkpoint["channel_versions"]),
            "versions_seen": copy.deepcopy(checkpoint["versions_seen"]),
        }

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        self._note(checkpoint)
        return super().put(config, checkpoint, metadata, new_versions)

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        self._note(checkpoint)
        return await super().aput(config, checkpoint, metadata, new_versions)


@pytest.fixture(params=params(BACKENDS))
def store_backend(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def audited_store_handle(store_backend: str, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(store_backend, tmp_path, audit=True) as h:
        yield h


@pytest.fixture
def audited_store(audited_store_handle: SaverHandle) -> StoreCheckpointer:
    """An audited checkpointer of `store_backend` (its storage in `audited_store_handle`)."""
    return audited_store_handle.inner


def assert_stored_as_put(inner: StoreCheckpointer, smart: Recording, threads: list[str],
                         every: bool = True) -> None:
    """Every stored checkpoint's versions are those it had when it was put (`every`: and each
    one put is stored)."""
    seen = 0
    for thread in threads:
        for tup in inner.list(conf(thread)):
            want = smart.put_records[tup.checkpoint["id"]]
            assert tup.checkpoint["channel_versions"] == want["channel_versions"], thread
            assert tup.checkpoint["versions_seen"] == want["versions_seen"], thread
            seen += 1
    assert (seen == len(smart.put_records)) if every else seen > 0


def test_two_runs_in_one_flush_verify_clean(
    audited_store: StoreCheckpointer, audited_store_handle: SaverHandle, store_backend: str,
    tmp_path: Path
) -> None:
    """The reported case: two turns buffered, then one flush."""
    smart = Recording(audited_store, Periodic(3600))
    chat = chat_graph().compile(checkpointer=smart)
    for i in range(2):
        chat.invoke({"messages": [human(f"hi {i}")]}, conf("two"))
    smart.flush()
    assert_clean(audited_store.verify("two"), 6)
    assert_clean(smart.verify("two"), 6)  # type: ignore[attr-defined]
    assert_clean(verify_fresh(audited_store_handle, audited_store, "two"), 6)
    assert_stored_as_put(audited_store, smart, ["two"])
    smart.close()


def test_buffered_runs_store_the_checkpoints_as_put(store_backend: str, tmp_path: Path) -> None:
    """Audit off: a flush after several runs stores each checkpoint's versions as put (the
    previous run's last checkpoint does not take the next run's input version)."""
    inner_h = open_saver(store_backend, tmp_path)
    inner = inner_h.saver
    try:
        smart = Recording(inner, Periodic(3600))
        chat = chat_graph().compile(checkpointer=smart)
        for i in range(3):
            chat.invoke({"messages": [human(f"hi {i}")]}, conf("plain"))
        smart.flush()
        assert_stored_as_put(inner, smart, ["plain"])
        # read from the store: no checkpoint of a step holds the input of a later run
        stored = list(inner.list(conf("plain")))
        loop = [t for t in stored if t.metadata["source"] == "loop"]
        assert len(stored) == 9 and len(loop) == 6
        assert not [t for t in loop if "__start__" in t.checkpoint["channel_values"]]
        smart.close()
    finally:
        inner.close()
        inner_h.cleanup()


class Turns:
    """Per-thread turns of real graphs: chat, an interrupt answered, fan-out, a subgraph
    paused inside (its own namespace)."""

    def __init__(self, smart: SmartCheckpointer, prefix: str) -> None:
        self.graphs = {
            "chat": chat_graph().compile(checkpointer=smart),
            "approval": approval_graph().compile(checkpointer=smart),
            "fan": fan_graph().compile(checkpointer=smart),
            "sub": subgraph_graph().compile(checkpointer=smart),
        }
        self.threads = {name: f"{prefix}{name}" for name in self.graphs}
        self.count: dict[str, int] = dict.fromkeys(self.graphs, 0)

    def next(self, name: str) -> tuple[Any, Any, RunnableConfig]:
        """The graph, input and config of the thread's next turn."""
        n = self.count[name]
        self.count[name] += 1
        cfg: RunnableConfig = conf(self.threads[name])  # type: ignore[assignment]
        if name == "chat":
            return self.graphs[name], {"messages": [human(f"hello {n}")]}, cfg
        if name == "fan":
            return self.graphs[name], {"items": list(range(2 + n % 3)), "results": []}, cfg
        if name == "approval":
            inp = ({"request": f"deploy {n}", "log": []} if n % 2 == 0
                   else Command(resume="yes" if n % 4 == 1 else "no"))
            return self.graphs[name], inp, cfg
        inp = {"text": "x", "trail": []} if n % 2 == 0 else Command(resume=f"fine {n}")
        return self.graphs[name], inp, cfg


@pytest.mark.parametrize(("seed", "coalesce"), [(1, False), (2, False), (3, True)])
def test_random_turns_and_flush_points_verify_clean(
    audited_store: StoreCheckpointer, audited_store_handle: SaverHandle, store_backend: str,
    tmp_path: Path, seed: int, coalesce: bool
) -> None:
    """Property: whatever the buffer holds at a flush (several runs, interrupts, several
    threads, a subgraph's namespace), every checkpoint verifies clean and is stored as put
    (coalescing: each one kept)."""
    rng = random.Random(seed)
    smart = Recording(audited_store, Periodic(3600), coalesce=coalesce)
    turns = Turns(smart, f"r{seed}-")
    for _ in range(12):
        graph, inp, cfg = turns.next(rng.choice(list(turns.graphs)))
        graph.invoke(inp, cfg)
        if rng.random() < 0.25:
            smart.flush()
    smart.close()
    threads = [turns.threads[n] for n in turns.graphs if turns.count[n]]
    for thread in threads:
        assert_clean(audited_store.verify(thread))
        assert_clean(verify_fresh(audited_store_handle, audited_store, thread))
    assert_stored_as_put(audited_store, smart, threads, every=not coalesce)


@pytest.mark.parametrize("seed", [4, 5])
def test_random_async_turns_verify_clean(
    audited_store: StoreCheckpointer, audited_store_handle: SaverHandle, store_backend: str,
    tmp_path: Path, seed: int,
    loop_thread: LoopThread,
) -> None:
    """The same property through `ainvoke` and `aflush`."""
    rng = random.Random(seed)
    smart = Recording(audited_store, Periodic(3600))
    turns = Turns(smart, f"a{seed}-")
    for _ in range(10):
        graph, inp, cfg = turns.next(rng.choice(list(turns.graphs)))
        loop_thread.run(graph.ainvoke(inp, cfg))
        if rng.random() < 0.25:
            loop_thread.run(smart.aflush())
    loop_thread.run(smart.aclose())
    threads = [turns.threads[n] for n in turns.graphs if turns.count[n]]
    for thread in threads:
        assert_clean(loop_thread.run(audited_store.averify(thread)))
    assert_stored_as_put(audited_store, smart, threads)
