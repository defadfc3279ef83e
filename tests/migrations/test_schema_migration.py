"""State-schema migration on every backend: threads written by a v1 graph, read, resumed and
forked by a v3 graph with the upcaster chain; then migrated eagerly, once."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.types import Command

from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.migrations import SchemaChain, SchemaVersionError
from tests.support.common import conf
from tests.support.savers import PERSISTENT, SaverHandle, open_saver
from tests.support.schema_graphs import CHAIN, graph_v1, graph_v3, is_v3, v1_message, v1_to_v2, v2_to_v3


def reopen(h: SaverHandle, first: StoreCheckpointer, **kw: Any) -> StoreCheckpointer:
    """`h`'s storage (which `first` writes) under a checkpointer given `kw` (a new one where
    storage persists)."""
    if h.backend not in PERSISTENT:
        for k, v in kw.items():
            setattr(first, k, v)
        return first
    return h.reopen(**kw)


def write_v1_threads(saver: StoreCheckpointer) -> None:
    g1 = graph_v1().compile(checkpointer=saver)
    g1.invoke({"messages": [v1_message("human", "hello")]}, conf("done"))
    g1.invoke({"messages": [v1_message("human", "again")]}, conf("done"))
    g1.invoke({"messages": [v1_message("human", "ship it")]}, conf("paused"))
    state = g1.get_state(conf("paused"))
    assert state.next == ("ask",) and state.interrupts  # paused, with note's writes pending
    assert "objective" in state.values and isinstance(state.values["messages"][0], dict)


@pytest.fixture
def stored_v1_handle(backend: str, tmp_path: Path) -> Iterator[SaverHandle]:
    """The storage of `stored_v1`: closed and dropped after the test."""
    with open_saver(backend, tmp_path) as h:
        yield h


@pytest.fixture
def stored_v1(stored_v1_handle: SaverHandle, backend: str) -> Any:
    """Threads stored by a v1 graph (no chain), and the v3 checkpointer over the same storage."""
    v1 = stored_v1_handle.saver
    write_v1_threads(v1)
    if backend in PERSISTENT:
        v1.close()
    v3 = reopen(stored_v1_handle, v1, schema_chain=CHAIN)
    yield v3
    v3.close()


def test_v3_graph_reads_resumes_and_forks_v1_threads(
    stored_v1: StoreCheckpointer, stored_v1_handle: SaverHandle, backend: str, tmp_path: Path
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
        fresh = reopen(stored_v1_handle, saver)
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

    # written before chains had names: unstamped, migrated when asked for
    assert saver.migrate_threads(dry_run=True).threads_skipped_unstamped == 2
    dry = saver.migrate_threads(dry_run=True, include_unstamped=True)
    assert dry.dry_run and dry.threads_migrated == 2 and dry.checkpoints_migrated > 0
    assert any("goal" in c.added and "objective" in c.removed for c in dry.changes)
    assert dry.writes_migrated >= 2  # note's pending writes on the paused thread
    assert "would migrate" in dry.summary()
    assert saver.migration_log() == []  # a dry run writes nothing

    seen: list[Any] = []
    report = saver.migrate_threads(progress=seen.append, include_unstamped=True)
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

    again = saver.migrate_threads()  # now stamped with the chain's name: its own
    assert again.checkpoints_migrated == 0 and again.threads_migrated == 0
    assert again.threads_skipped_unstamped == 0
    assert len(saver.migration_log()) == len(log)

    # the migrated paused thread still resumes, with note's (rewritten) writes
    out = g3.invoke(Command(resume="no"), conf("paused"))
    assert [m.content for m in out["messages"]] == [
        "ship it", "echo: ship it", "decision: no", "noted"]

    # code that knows only v2 refuses what is stored at v3: versions never go down
    saver.schema_chain = SchemaChain(current=2, upcasters={1: lambda v: v}, name="echo")
    with pytest.raises(SchemaVersionError, match="newer than the 2 this code knows"):
        g3.get_state(conf("done"))
    with pytest.raises(SchemaVersionError, match="newer"):
        saver.migrate_threads()
    saver.schema_chain = CHAIN


def test_chosen_threads_only(stored_v1: StoreCheckpointer) -> None:
    saver = stored_v1
    assert saver.migrate_threads(["paused"]).threads_skipped_unstamped == 1
    report = saver.migrate_threads(["paused"], include_unstamped=True)
    assert report.threads_migrated == 1
    assert {m.thread_id for m in saver.migration_log()} == {"paused"}
    assert saver.migrate_threads(["paused"]).checkpoints_migrated == 0
    assert saver.migrate_threads(include_unstamped=True).threads_migrated == 1  # "done" is left


def test_new_checkpoints_are_stamped_and_need_no_upgrade(backend: str, tmp_path: Path) -> None:
    saver_h = open_saver(backend, tmp_path, schema_chain=CHAIN)
    saver = saver_h.saver
    try:
        g3 = graph_v3().compile(checkpointer=saver)
        g3.invoke({"messages": [HumanMessage("hi")]}, conf("fresh"))
        assert all(t.metadata["schema_version"] == 3 for t in saver.list(conf("fresh")))
        assert saver.migrate_threads().checkpoints_migrated == 0
        with pytest.raises(Exception, match="schema_chain"):
            open_saver("memory", tmp_path).saver.migrate_threads()
    finally:
        saver.close()
        saver_h.cleanup()


async def test_async_paths(stored_v1: StoreCheckpointer) -> None:
    saver = stored_v1
    g3 = graph_v3().compile(checkpointer=saver)
    state = await g3.aget_state(conf("done"))
    assert is_v3(state.values)
    out = await g3.ainvoke(Command(resume="later"), conf("paused"))
    assert [m.content for m in out["messages"]][-2:] == ["decision: later", "noted"]
    assert all(isinstance(m, AIMessage) for m in out["messages"][1:])
    report = await saver.amigrate_threads(include_unstamped=True)
    assert report.threads_migrated == 2
    assert len(await saver.amigration_log()) == report.checkpoints_migrated


# -- scope: a chain migrates the threads it owns ---------------------------------------------


def v1_chain(name: str) -> SchemaChain:
    """What a graph's checkpointer had at v1: its chain's name, no upcaster yet."""
    return SchemaChain(current=1, name=name)


def write_mixed_store(saver: StoreCheckpointer) -> None:
    """Two graphs' threads in one store, all at schema v1 (the same shape, so that a migration
    of the wrong thread shows): `echo-1` of the `echo` chain, `billing-1` of `billing`, and
    `legacy-1` written before chains had names (no name stamped)."""
    g1 = graph_v1().compile(checkpointer=saver)
    for thread, chain in (("echo-1", v1_chain("echo")), ("billing-1", v1_chain("billing")),
                          ("legacy-1", None)):
        saver.schema_chain = chain
        g1.invoke({"messages": [v1_message("human", "hello")]}, conf(thread))
    saver.schema_chain = None


def stored_values(saver: StoreCheckpointer, thread: str) -> list[tuple[Any, Any]]:
    """Every stored checkpoint of a thread as written (no chain): metadata and values."""
    chain, saver.schema_chain = saver.schema_chain, None
    try:
        return [(t.metadata, t.checkpoint["channel_values"]) for t in saver.list(conf(thread))]
    finally:
        saver.schema_chain = chain


@pytest.fixture
def mixed(backend: str, tmp_path: Path) -> Any:
    saver_h = open_saver(backend, tmp_path)
    saver = saver_h.saver
    write_mixed_store(saver)
    saver.schema_chain = CHAIN  # the echo graph's code, now at v3
    yield saver
    saver.close()
    saver_h.cleanup()


def test_new_checkpoints_carry_the_chain_name(mixed: StoreCheckpointer) -> None:
    assert CHAIN.name == "echo"
    stamps = {t: {(md.get("schema_name"), md["schema_version"]) for md, _ in stored_values(mixed, t)}
              for t in ("echo-1", "billing-1")}
    assert stamps == {"echo-1": {("echo", 1)}, "billing-1": {("billing", 1)}}
    assert all("schema_name" not in md for md, _ in stored_values(mixed, "legacy-1"))


def test_eager_migration_touches_only_the_chains_threads(mixed: StoreCheckpointer) -> None:
    billing, legacy = stored_values(mixed, "billing-1"), stored_values(mixed, "legacy-1")

    dry = mixed.migrate_threads(dry_run=True)
    assert dry.threads == ["echo-1"] and dry.threads_migrated == 1
    assert (dry.threads_skipped_other, dry.threads_skipped_unstamped) == (1, 1)
    assert {(s.thread_id, s.reason, s.schema_name) for s in dry.skipped} == {
        ("billing-1", "other chain", "billing"), ("legacy-1", "unstamped", None)}
    text = dry.summary()
    assert "would migrate 3 checkpoint(s) of 1 thread(s) to schema version 3 of chain 'echo'" in text
    assert "echo-1" in text and "billing-1" in text and "legacy-1" in text
    assert "include_unstamped" in text

    report = mixed.migrate_threads()
    assert report.threads == ["echo-1"] and report.checkpoints_migrated == 3
    assert {m.thread_id for m in mixed.migration_log()} == {"echo-1"}
    assert all(md["schema_name"] == "echo" and md["schema_version"] == 3 and is_v3(v)
               for md, v in stored_values(mixed, "echo-1"))
    assert stored_values(mixed, "billing-1") == billing  # another graph's: never touched
    assert stored_values(mixed, "legacy-1") == legacy  # unstamped: not asked for

    # The same when the threads are named: another chain's thread is skipped, and counted.
    named = mixed.migrate_threads(["billing-1", "legacy-1", "echo-1"])
    assert named.checkpoints_migrated == 0 and named.threads_skipped_other == 1
    assert stored_values(mixed, "billing-1") == billing


def test_include_unstamped_adopts_threads_written_before_names(mixed: StoreCheckpointer) -> None:
    """An upgrade from a release without chain names: the existing threads carry a version and
    no name. `include_unstamped=True` migrates them too, and stamps them with the chain's name,
    so that the next migration finds them as its own."""
    billing = stored_values(mixed, "billing-1")
    report = mixed.migrate_threads(include_unstamped=True)
    assert sorted(report.threads) == ["echo-1", "legacy-1"] and report.threads_skipped_other == 1
    assert report.threads_skipped_unstamped == 0
    assert all(md["schema_name"] == "echo" and is_v3(v)
               for md, v in stored_values(mixed, "legacy-1"))
    assert stored_values(mixed, "billing-1") == billing


def test_read_time_upgrade_leaves_another_chains_thread_alone(mixed: StoreCheckpointer) -> None:
    g3 = graph_v3().compile(checkpointer=mixed)
    assert is_v3(g3.get_state(conf("echo-1")).values)  # its own: upgraded on read
    assert is_v3(g3.get_state(conf("legacy-1")).values)  # unstamped: as before names
    other = mixed.get_tuple(conf("billing-1"))
    assert other is not None and other.metadata["schema_name"] == "billing"
    assert other.metadata["schema_version"] == 1
    assert "objective" in other.checkpoint["channel_values"]
    assert "priority" not in other.checkpoint["channel_values"]
    # a thread of another chain at a version this chain has never heard of is not refused
    mixed.schema_chain = SchemaChain(current=7, upcasters={i: lambda v: v for i in range(1, 7)},
                                     name="billing")
    graph_v1().compile(checkpointer=mixed).invoke(
        {"messages": [v1_message("human", "later")]}, conf("billing-1"))
    mixed.schema_chain = CHAIN
    assert mixed.get_tuple(conf("billing-1")).metadata["schema_version"] == 7  # type: ignore[union-attr]


def test_an_unnamed_chain_must_be_told_what_to_migrate(mixed: StoreCheckpointer) -> None:
    from langgraph_ckpt_ext.core.errors import InvalidConfigError

    mixed.schema_chain = SchemaChain(current=3, upcasters={1: v1_to_v2, 2: v2_to_v3})
    with pytest.raises(InvalidConfigError, match=r"no name.*include_unstamped=True"):
        mixed.migrate_threads()
    with pytest.raises(InvalidConfigError, match="include_unstamped"):
        mixed.migrate_threads(["legacy-1"], dry_run=True)
    report = mixed.migrate_threads(include_unstamped=True)
    assert report.threads == ["legacy-1"] and report.threads_skipped_other == 2
    assert all("schema_name" not in md and md["schema_version"] == 3
               for md, _ in stored_values(mixed, "legacy-1"))
    with pytest.raises(Exception, match="name must be"):
        SchemaChain(current=1, name="")
    with pytest.raises(InvalidConfigError, match="include_unstamped is True or False, got 'yes'"):
        mixed.migrate_threads(include_unstamped="yes")  # type: ignore[arg-type]
