"""SmartCheckpointer's durability where it matters, with the process SIGKILLed."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext import SQLiteCheckpointer
from tests.support.forked import Forked, start
from tests.support.graphs import approval_graph, chat_graph, human


def _spawn(*args: str) -> Forked:
    return start("tests.support.smart_worker", *args)


@pytest.mark.parametrize("policy", ["periodic", "events"])
def test_a_pause_survives_a_kill_at_once(policy: str, tmp_path: Path) -> None:
    db = tmp_path / "pause.db"
    proc = _spawn("pause", str(db), policy)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.kill()  # at once: no flush, no atexit
    proc.wait(30)
    assert line.strip() == "PAUSED", proc.stderr.read() if proc.stderr else ""
    with SQLiteCheckpointer(db) as cp:  # a new process would do just this
        graph = approval_graph().compile(checkpointer=cp)
        state = graph.get_state({"configurable": {"thread_id": "p"}})
        assert state.next == ("ask",)
        out = graph.invoke(Command(resume="yes"), {"configurable": {"thread_id": "p"}})
        assert out["log"] == ["proposed refund", "human said yes", "acted on yes"]


def test_a_kill_mid_run_loses_at_most_the_window_and_leaves_a_prefix(tmp_path: Path) -> None:
    db, window = tmp_path / "chat.db", 0.3
    proc = _spawn("chat", str(db), str(window))
    assert proc.stdout is not None
    done: dict[int, float] = {}
    for line in proc.stdout:
        _, turn, at = line.split()
        done[int(turn)] = float(at)
        if int(turn) >= 40:
            break
    killed_at = time.time()
    proc.kill()
    proc.wait(30)
    with SQLiteCheckpointer(db) as cp:
        config = {"configurable": {"thread_id": "c"}}
        history = list(cp.list(config))
        assert history
        ids = {t.checkpoint["id"] for t in history}
        for t in history:  # a consistent prefix: every parent there, every value whole
            parent = t.parent_config
            assert parent is None or parent["configurable"]["checkpoint_id"] in ids
            values = t.checkpoint["channel_values"]
            turns = values.get("turns", 0)
            assert len(values.get("messages", [])) in (2 * turns, 2 * turns + 1)
        graph = chat_graph().compile(checkpointer=cp)
        saved = graph.get_state(config).values["turns"]
        # every turn finished more than the window (plus a margin for a busy machine) before
        # the kill is stored
        settled = [t for t, at in done.items() if at < killed_at - window - 1.0]
        assert saved >= max(settled, default=0)
        assert saved <= max(done) + 1
        if graph.get_state(config).next:  # the kill cut a run short: it goes on from there
            saved = graph.invoke(None, config)["turns"]
        out = graph.invoke({"messages": [human("after")]}, config)
        # (a kill between a task's writes and its step's checkpoint leaves writes that the
        # state shows but a new input starts over from, with any saver: one turn fewer)
        assert out["turns"] in (saved, saved + 1)
        assert [m.content for m in out["messages"][-2:]] == ["after", "echo: after"]



def test_what_is_buffered_is_written_at_interpreter_exit(tmp_path: Path) -> None:
    db = tmp_path / "exit.db"
    proc = _spawn("exit", str(db), "3")
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert int(out.split()[1]) >= 9  # three turns of three checkpoints, all still buffered
    with SQLiteCheckpointer(db) as cp:
        state = chat_graph().compile(checkpointer=cp).get_state({"configurable": {"thread_id": "x"}})
        assert state.values["turns"] == 3
