"""The append log's memory under many threads: `python -m tests.support.appendlog_workload BUDGET`
prints one JSON line (run in a process of its own, so that its RSS is its own).

THREADS threads, one after another, of TURNS turns each; a turn appends a human message of
SIZE bytes and a short answer to the thread's `messages` and puts the checkpoint, the way a
graph's step would (`aput`, channel versions from the checkpointer). The rows go to a store
that keeps nothing: what the process holds then is the checkpointer's own memory, which the
append log's budget (`append_log_bytes`) bounds.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time
from collections.abc import Sequence
from typing import Any

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext.backends.memory import MemoryStore
from langgraph_ckpt_ext.core.rows import BlobRow, CheckpointRow
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.store import BatchItem

THREADS, TURNS, SIZE = 200, 20, 10_000


class DiscardingStore(MemoryStore):
    """Takes every write and keeps none of it."""

    async def write_checkpoint(self, row: CheckpointRow, blobs: Sequence[BlobRow],
                               guard: Any = None) -> set[str]:
        return set()

    async def write_batch(self, items: Sequence[BatchItem], guards: Any = None
                          ) -> list[set[str]]:
        return [set() for item in items if isinstance(item, tuple)]


def rss() -> int:
    """This process's resident memory, in bytes."""
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


async def _thread(cp: StoreCheckpointer, thread_id: str, turns: int, size: int) -> None:
    messages: list[Any] = []
    version: Any = None
    parent: str | None = None
    for turn in range(turns):
        messages = [*messages, HumanMessage(os.urandom(size // 2).hex(), id=f"h{turn}"),
                    AIMessage(f"answer {turn}", id=f"a{turn}")]
        version = cp.get_next_version(version)
        ckpt = empty_checkpoint()
        ckpt["id"] = f"{turn + 1:08d}"
        ckpt["channel_values"] = {"messages": messages}
        ckpt["channel_versions"] = {"messages": version}
        config = {"configurable": {"thread_id": thread_id, "checkpoint_ns": "",
                                   "checkpoint_id": parent}}
        await cp.aput(config, ckpt, {"step": turn}, {"messages": version})  # type: ignore[arg-type]
        parent = ckpt["id"]


async def run(budget: int, threads: int = THREADS, turns: int = TURNS, size: int = SIZE
              ) -> dict[str, Any]:
    """The workload; what the log held at most and at the end, and how the RSS grew."""
    cp = StoreCheckpointer(DiscardingStore(), append_log_bytes=budget)
    log = cp._log
    before, start = rss(), time.perf_counter()
    held_max = rss_max = 0
    for t in range(threads):
        await _thread(cp, f"thread-{t}", turns, size)
        held_max, rss_max = max(held_max, log.held_bytes), max(rss_max, rss())
    return {"budget": budget, "held_max": held_max, "held_end": log.held_bytes,
            "rss_growth": rss_max - before, "puts": threads * turns,
            "seconds": round(time.perf_counter() - start, 2)}


if __name__ == "__main__":
    budget, *rest = (int(a) for a in sys.argv[1:])
    print(json.dumps(asyncio.run(run(budget, *rest))))
