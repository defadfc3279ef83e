"""The append log's memory budget: an option of every checkpointer (`append_log_bytes`), and
what a process holds under many threads stays within it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import InMemoryCheckpointer, connect
from langgraph_ckpt_ext.core.appendlog import DEFAULT_MAX_BYTES
from tests.support.common import conf
from tests.support.graphs import chat_graph
from tests.support.savers import open_saver, params

MiB = 1 << 20
ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("backend", params(["memory", "sqlite", "postgres", "redis"]))
def test_every_checkpointer_takes_the_budget(backend: str, tmp_path: Path) -> None:
    cp_h = open_saver(backend, tmp_path, append_log_bytes=3 * MiB)
    cp = cp_h.saver
    try:
        assert cp._log.max_bytes == 3 * MiB
    finally:
        cp.close()
        cp_h.cleanup()
    assert InMemoryCheckpointer()._log.max_bytes == DEFAULT_MAX_BYTES == 64 * MiB
    assert connect("memory://", append_log_bytes=MiB)._log.max_bytes == MiB  # holds nothing


@pytest.mark.parametrize("bad", [-1, 1.5, "64MiB", True])
def test_a_budget_that_is_not_a_number_of_bytes_is_refused(bad: Any) -> None:
    with pytest.raises(ValueError, match="append_log_bytes"):
        InMemoryCheckpointer(append_log_bytes=bad)


def _based(cp: InMemoryCheckpointer) -> list[bool]:
    """Per stored `messages` row, oldest first: whether it is an append-delta."""
    rows = [b for blobs in cp.store.blobs.values() for b in blobs.values()]
    return [b.base_version is not None for b in sorted(rows, key=lambda b: b.version)
            if b.channel == "messages"]


def test_a_zero_budget_stores_every_list_whole_and_reads_the_same() -> None:
    graph_of = {n: InMemoryCheckpointer(append_log_bytes=n) for n in (0, DEFAULT_MAX_BYTES)}
    values = {}
    for n, cp in graph_of.items():
        graph = chat_graph().compile(checkpointer=cp)
        for turn in range(4):
            graph.invoke({"messages": [HumanMessage(f"turn {turn}", id=f"h{turn}")]}, conf("t"))
        values[n] = graph.get_state(conf("t")).values
        assert cp._log.held_bytes == 0 if n == 0 else cp._log.held_bytes > 0
    assert not any(_based(graph_of[0]))
    assert any(_based(graph_of[DEFAULT_MAX_BYTES]))
    strip = [(type(m), m.content) for m in values[0]["messages"]]
    assert strip == [(type(m), m.content) for m in values[DEFAULT_MAX_BYTES]["messages"]]


def test_many_threads_keep_the_log_within_a_small_budget() -> None:
    """200 threads of 20 turns, ~10 KB a message (see `appendlog_workload`): unbounded, the log
    would hold ~80 MB; with 2 MiB it holds at most that, and the process grows by about that."""
    budget = 2 * MiB
    out = subprocess.run(
        [sys.executable, "-m", "tests.support.appendlog_workload", str(budget)],
        cwd=ROOT, capture_output=True, text=True, timeout=120, check=True,
    )
    got = json.loads(out.stdout)
    print(f"\nappend log, budget 2 MiB: held at most {got['held_max'] / MiB:.2f} MiB, "
          f"RSS grew {got['rss_growth'] / MiB:.1f} MiB over {got['puts']} puts "
          f"({got['seconds']} s)")
    assert budget / 2 < got["held_max"] <= budget  # used, and bounded
    assert got["rss_growth"] < budget + 8 * MiB
