"""Several Python processes on one SQLite file."""

from __future__ import annotations

from pathlib import Path

import pytest

from langgraph_ckpt_ext import PostgresCheckpointer, SQLiteCheckpointer
from langgraph_ckpt_ext.backends.sqlite.migrations import LATEST
from tests.support.forked import Forked, start
from tests.support.graphs import approval_graph
from tests.support.savers import PG_DSN, drop_pg_schemas, pg_schema


def _spawn(*args: str) -> Forked:
    return start("tests.support.proc_worker", *args)


def _finish(proc: Forked) -> str:
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    return out


def test_interrupt_in_one_process_resumed_by_another(tmp_path: Path) -> None:
    db = str(tmp_path / "shared.db")
    assert "PAUSED approve refund?" in _finish(_spawn("start", db, "t-1"))
    assert "DONE proposed refund|human said yes|acted on yes" in _finish(_spawn("resume", db, "t-1"))
    with SQLiteCheckpointer(db) as saver:
        graph = approval_graph().compile(checkpointer=saver)
        state = graph.get_state({"configurable": {"thread_id": "t-1"}})
        assert state.next == () and state.values["decision"] == "yes"
        assert len(list(graph.get_state_history({"configurable": {"thread_id": "t-1"}}))) == 5


def test_processes_share_one_file(tmp_path: Path) -> None:
    """Four processes set up and write the same new file at once; nothing is lost."""
    db = str(tmp_path / "busy.db")
    procs = [_spawn("chat", db, f"p{i}") for i in range(4)]
    outs = [_finish(p) for p in procs]
    assert all("CHAT 25" in out for out in outs)
    with SQLiteCheckpointer(db) as saver:
        threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
        assert threads == {"p0-chat", "p1-chat", "p2-chat", "p3-chat"}
        for i in range(4):
            latest = saver.get_tuple({"configurable": {"thread_id": f"p{i}-chat"}})
            assert latest is not None
            assert len(latest.checkpoint["channel_values"]["messages"]) == 50
        assert saver.setup() == LATEST  # each storage version applied once


@pytest.mark.postgres
def test_postgres_processes_share_a_database() -> None:
    """Two processes run different threads at once (the first also pauses one for a human);
    a third resumes the paused thread."""
    schema = pg_schema()
    target = f"postgres:{schema}"
    try:
        first = _spawn("start+chat", target, "a")
        second = _spawn("chat", target, "b")
        out_first, out_second = _finish(first), _finish(second)
        assert "PAUSED approve refund?" in out_first and "CHAT 25" in out_first
        assert "CHAT 25" in out_second
        assert "DONE proposed refund|human said yes|acted on yes" in _finish(
            _spawn("resume", target, "a")
        )
        with PostgresCheckpointer(PG_DSN, schema=schema) as saver:
            threads = {t.config["configurable"]["thread_id"] for t in saver.list(None)}
            assert threads == {"a", "a-chat", "b-chat"}
            state = approval_graph().compile(checkpointer=saver).get_state(
                {"configurable": {"thread_id": "a"}}
            )
            assert state.next == () and state.values["decision"] == "yes"
    finally:
        drop_pg_schemas(schema)
