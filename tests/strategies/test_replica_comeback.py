"""A replica whose server comes back empty after an outage: the writes it refuses (their bases are
gone) prove it answers, so it is up again at once and `repair()` can mend it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import CheckpointTuple

from langgraph_ckpt_ext import RedisCheckpointer, ReplicatedCheckpointer, SQLiteCheckpointer
from tests.support.graphs import chat_graph, human
from tests.support.redis_servers import redis_server
from tests.support.savers import unique_prefix

pytestmark = pytest.mark.redis

PROBE_THREAD = "__lgckpt_probe__"  # the worker's probe of a replica it saw down


class HeldProbe(RedisCheckpointer):
    """Holds the worker's probe until `release` is set, so that only the writes it applies can
    tell it the replica is back."""

    release = threading.Event()

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        if config["configurable"].get("thread_id") == PROBE_THREAD:
            self.release.wait(30)
        return super().get_tuple(config)


def wait_for(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def ids(saver: Any, thread: str) -> list[str]:
    return [t.checkpoint["id"] for t in saver.list({"configurable": {"thread_id": thread}})]


def test_a_replica_refusing_writes_after_a_restart_is_up(tmp_path: Path) -> None:
    with redis_server() as server:
        primary = SQLiteCheckpointer(tmp_path / "primary.db")
        replica = HeldProbe(server.url, key_prefix=unique_prefix(), cluster=False)
        cp = ReplicatedCheckpointer(primary, [replica])
        config: RunnableConfig = {"configurable": {"thread_id": "a"}}
        try:
            chat = chat_graph().compile(checkpointer=cp)
            for turn in range(2):
                chat.invoke({"messages": [human(f"turn {turn}")]}, config)
            assert cp.flush(10) and ids(replica, "a") == ids(primary, "a")

            server.stop()
            chat.invoke({"messages": [human("while it is away")]}, config)
            wait_for(lambda: not cp.status().replicas[0].up)
            server.start()  # the same port, no data: the queued deltas' bases are gone
            wait_for(lambda: cp.status().replicas[0].queued == 0)

            back = cp.status().replicas[0]
            assert back.up, back  # it answered every write it was sent
            assert back.needs_repair and "MissingBaseError" in (back.last_error or "")
            report = cp.repair()
            assert report.replicas[0].error is None, report.summary()
            assert report.replicas[0].checkpoints_copied > 0
            assert ids(replica, "a") == ids(primary, "a")
            assert not cp.status().replicas[0].needs_repair
        finally:
            HeldProbe.release.set()
            cp.close(timeout=5)
            replica.close()
            primary.close()
