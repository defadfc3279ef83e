"""State-schema migration on every backend: threads written by a v1 graph, read, resumed and
forked by a v3 graph with the upcaster chain; then migrated eagerly, once."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.types import Command

from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.migrations import SchemaChain, SchemaVersionError
from tests.conftest import PERSISTENT, cleanup, conf, make_saver, reopen_saver
from tests.schema_graphs import CHAIN, graph_v1, graph_v3, is_v3, v1_message


def reopen(backend: str, first: StoreCheckpointer, tmp_path: Path, **kw: Any) -> StoreCheckpointer:
    """The same storage under a checkpointer given `kw` (a new one where storage persists)."""
    if backend not in PERSISTENT:
        for k, v in kw.items():
            setattr(first, k, v)
        return first
    return reopen_saver(backend, first, tmp_path, **kw)


def write_v1_threads(saver: StoreCheckpointer) -> None:
    g1 = graph_v1().compile(checkpointer=saver)
    g1.invoke({"messages": [v1_message("human", "hello")]}, conf("done"))
    g1.invoke({"messages": [v1_message("human", "again")]}, conf("done"))
    g1.invoke({"messages": [v1_message("human", "ship it")]}, conf("paused"))
    state = g1.get_state(conf("paused"))
    assert state.next == ("ask",) and state.interrupts  # paused, with note's writes pending
    assert "objective" in state.values and isinstance(state.values["messages"][0], dict)


@pytest.fixture
def stored_v1(backend: str, tmp_path: Path) -> Any:
    """Threads stored by a v1 graph (no chain), and the v3 checkpointer over the same storage."""
    v1 = make_saver(backend, tmp_path)
    write_v1_threads(v1)
    if backend in PERSISTENT:
        v1.close()
    v3 = reopen(backend, v1, tmp_path, schema_chain=CHAIN)
    yield v3
    v3.close()
    cleanup(backend, v3)


def test_v3_graph_reads_resumes_and_forks_v1_threads(
    stored_v1: StoreCheckpointer, backend: str, tmp_path: Path
) -> None:
    saver = stored_v1
    g3 = graph_v3().compile(checkpointer=saver)

    # get_state: the current schema, lazily (nothing was rewritten)
    state = g3.get_state(conf("done"))
    assert is_v3(state.values), state.values
    assert state.values["goal"] == "hello" and state.values["turns"] == 2
    assert [m.content for m in state.values["messages"]] == [
        "hello", "echo: hello", "again", "echo: again"]
    assert state.metadata["schema_version"] == 3
    assert saver.migration_log() == []

    # history: every checkpoint of the old thread, in the v3 shape
    history = list(g3.get_state_history(conf("done")))
    assert len(history) >= 6
    assert all(is_v3(s.values) for s in history if s.values)

    # a finished v1 thread goes on under v3; messages are not duplicated (ids kept)
    out = g3.invoke({"messages": [HumanMessage("more", id="h-more")]}, conf("done"))
    assert out["turns"] == 3 and out["goal"] == "hello" and out["priority"] == "normal"
    assert [m.content for m in out["messages"]] == [
        "hello", "echo: hello", "again", "echo: again", "more", "echo: more"]
    assert len({m.id for m in out["messages"]}) == 6

    # a thread paused at interrupt() under v1 resumes under v3; note's pending writes (v1
    # messages and `objective`) are upgraded and applied, not lost and not re-run
    paused = g3.get_state(conf("paused"))
    assert paused.next == ("ask",) and paused.interrupts[0].value == {"question": "ship it?"}
    out = g3.invoke(Command(resume="yes"), conf("paused"))
    # (the step's writes apply in task order: `ask` before `note`, as on any checkpointer)
    assert [m.content for m in out["messages"]] == [
        "ship it", "echo: ship it", "decision: yes", "noted"]
    assert all(isinstance(m, BaseMessage) for m in out["messages"])
    assert out["goal"] == "ship the release" and "objective" not in out

    # a fork of an old checkpoint: v3 values, and it runs on
    first_turn = next(s for s in reversed(list(g3.get_state_history(conf("done"))))
                      if s.values.get("turns") == 1)
    fork = g3.update_state(first_turn.config, {"goal": "forked"})
    forked = g3.get_state(fork)
    assert is_v3(forked.values) and forked.values["goal"] == "forked"
    assert [m.content for m in forked.values["messages"]] == ["hello", "echo: hello"]
    out = g3.invoke({"messages": [HumanMessage("branch")]}, fork)
    assert out["turns"] == 2 and out["goal"] == "forked"
    assert [m.content for m in out["messages"]][-2:] == ["branch", "echo: branch"]

    # replaying from the input checkpoint of a v1 turn: its input is upgraded too
    start = next(s for s in reversed(list(g3.get_state_history(conf("done"))))
                 if s.metadata.get("source") == "input")
    out = g3.invoke(None, start.config)
    assert [m.content for m in out["messages"]] == ["hello", "echo: hello"]
    assert all(isinstance(m, BaseMessage) for m in out["messages"])

    # the branch that went on to turn 3 is still there, next to the fork
    turns = [s.values.get("turns") for s in g3.get_state_history(conf("done"))]
    assert 3 in turns and turns[0] == 1

    # what the v3 runs wrote is stored whole: values the upgrade changed on read were stored
    # with the first checkpoint holding them (read here by a process with no chain and no
    # memory of those runs)
    if backend in PERSISTENT:
        fresh = reopen(backend, saver, tmp_path)
        try:
            g = graph_v3().compile(checkpointer=fresh)
            for thread in ("paused", "done"):
                latest = g.get_state(conf(thread))
                assert latest.metadata["schema_version"] == 3 and is_v3(latest.values)
                assert latest.values["goal"] and latest.values["turns"] >= 1
        finally:
            fresh.close()


def test_eager_migration_rewrites_every_thread_once(stored_v1: StoreCheckpointer) -> None:
    saver = stored_v1
    g3 = graph_v3().compile(checkpointer=saver)
    before = {t: [(s.config, s.values, s.next) for s in g3.get_state_history(conf(t))]
              for t in ("done", "paused")}

    dry = saver.migrate_threads(dry_run=True)
    assert dry.dry_run and dry.threads_migrated == 2 and dry.checkpoints_migrated > 0
    assert any("goal" in c.added and "objective" in c.removed for c in dry.changes)
    assert dry.writes_migrated >= 2  # note's pending writes on the paused thread
    assert "would migrate" in dry.summary()
    assert saver.migration_log() == []  # a dry run writes nothing

    seen: list[Any] = []
    report = saver.migrate_threads(progress=seen.append)
    assert report.checkpoints_migrated == dry.checkpoints_migrated
    assert report.threads_migrated == 2 and report.writes_migrated == dry.writes_migrated
    assert [p.threads_done for p in seen] == [1, 2] and seen[-1].threads_total == 2

    log = saver.migration_log()
    assert len(log) == report.checkpoints_migrated
    assert len({m.key for m in log}) == len(log)  # each checkpoint once
    assert {(m.from_version, m.to_version) for m in log} == {(1, 3)}
    assert {m.thread_id for m in log} == {"done", "paused"}
    assert len(saver.migration_log("paused")) + len(saver.migration_log("done")) == len(log)

    # storage now holds v3: read with no chain at all, the values are the ones the lazy
    # upgrade gave before (same checkpoints, same values, same next nodes)
    saver.schema_chain = None
    for tup in saver.list(None):
        assert tup.metadata["schema_version"] == 3
    after = {t: [(s.config, s.values, s.next) for s in g3.get_state_history(conf(t))]
             for t in ("done", "paused")}
    assert after == before
    saver.schema_chain = CHAIN

    again = saver.migrate_threads()
    assert again.checkpoints_migrated == 0 and again.threads_migrated == 0
    assert len(saver.migration_log()) == len(log)

    # the migrated paused thread still resumes, with note's (rewritten) writes
    out = g3.invoke(Command(resume="no"), conf("paused"))
    assert [m.content for m in out["messages"]] == [
        "ship it", "echo: ship it", "decision: no", "noted"]

    # code that knows only v2 refuses what is stored at v3: versions never go down
    saver.schema_chain = SchemaChain(current=2, upcasters={1: lambda v: v})
    with pytest.raises(SchemaVersionError, match="newer than the 2 this code knows"):
        g3.get_state(conf("done"))
    with pytest.raises(SchemaVersionError, match="newer"):
        saver.migrate_threads()
    saver.schema_chain = CHAIN


def test_chosen_threads_only(stored_v1: StoreCheckpointer) -> None:
    saver = stored_v1
    report = saver.migrate_threads(["paused"])
    assert report.threads_migrated == 1
    assert {m.thread_id for m in saver.migration_log()} == {"paused"}
    assert saver.migrate_threads(["paused"]).checkpoints_migrated == 0
    assert saver.migrate_threads().threads_migrated == 1  # "done" is left


def test_new_checkpoints_are_stamped_and_need_no_upgrade(backend: str, tmp_path: Path) -> None:
    saver = make_saver(backend, tmp_path, schema_chain=CHAIN)
    try:
        g3 = graph_v3().compile(checkpointer=saver)
        g3.invoke({"messages": [HumanMessage("hi")]}, conf("fresh"))
        assert all(t.metadata["schema_version"] == 3 for t in saver.list(conf("fresh")))
        assert saver.migrate_threads().checkpoints_migrated == 0
        with pytest.raises(Exception, match="schema_chain"):
            make_saver("memory", tmp_path).migrate_threads()
    finally:
        saver.close()
        cleanup(backend, saver)


async def test_async_paths(stored_v1: StoreCheckpointer) -> None:
    saver = stored_v1
    g3 = graph_v3().compile(checkpointer=saver)
    state = await g3.aget_state(conf("done"))
    assert is_v3(state.values)
    out = await g3.ainvoke(Command(resume="later"), conf("paused"))
    assert [m.content for m in out["messages"]][-2:] == ["decision: later", "noted"]
    assert all(isinstance(m, AIMessage) for m in out["messages"][1:])
    report = await saver.amigrate_threads()
    assert report.threads_migrated == 2
    assert len(await saver.amigration_log()) == report.checkpoints_migrated
