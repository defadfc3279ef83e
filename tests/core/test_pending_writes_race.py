"""Pending writes of parallel tasks for one checkpoint, stored at once from many threads (the
interleaving of langgraph#8115, at the saver): none drops another, on every backend and
through SmartCheckpointer."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from tests.support.savers import SaverHandle, open_saver, params

KINDS = ["memory", "sqlite", "postgres", "redis", "redis-cluster", "smart:sqlite",
         "smart:postgres"]
TASKS, CALLS = 16, 5


@pytest.fixture(params=params(KINDS))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    wrapper, _, kind = request.param.rpartition(":")
    with open_saver(kind, tmp_path, wrapper=wrapper or None) as h:
        yield h


def test_parallel_tasks_writes_are_all_kept(handle: SaverHandle) -> None:
    cp = handle.saver
    config: Any = {"configurable": {"thread_id": "race", "checkpoint_ns": ""}}
    config = cp.put(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
    barrier = threading.Barrier(TASKS)
    errors: list[BaseException] = []

    def task(n: int) -> None:
        try:
            barrier.wait()
            for i in range(CALLS):  # one task per call: the calls of all threads interleave
                cp.put_writes(config, [(f"ch{n % 3}", {"task": n, "i": i}),
                                       ("log", f"{n}.{i}")], f"task-{n:02d}-{i}",
                              task_path=f"~__pregel_pull, node{n}")
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=task, args=(n,)) for n in range(TASKS)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    found = cp.get_tuple(config)
    assert found is not None
    kept = sorted(value for _, channel, value in found.pending_writes if channel == "log")
    assert kept == sorted(f"{n}.{i}" for n in range(TASKS) for i in range(CALLS))
    assert len(found.pending_writes) == 2 * TASKS * CALLS
    # a task that stores its writes again (a retry) changes nothing: the first are kept
    cp.put_writes(config, [("ch0", "again"), ("log", "again")], "task-00-0")
    again = cp.get_tuple(config)
    assert again is not None and len(again.pending_writes) == 2 * TASKS * CALLS
    assert all(value != "again" for *_, value in again.pending_writes)
