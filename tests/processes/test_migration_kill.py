"""An eager state-schema migration killed halfway (SIGKILL) and started again: every checkpoint
of every thread of the chain is migrated exactly once, nothing is lost, and the thread of
another chain sharing the store is never touched."""

from __future__ import annotations

from pathlib import Path

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext.migrations import SchemaChain
from tests.support.forked import start
from tests.support.migrate_worker import open_target
from tests.support.savers import drop_pg_schemas, drop_redis_prefixes, params, pg_schema, redis_prefix
from tests.support.schema_graphs import CHAIN, graph_v1, graph_v3, is_v3, v1_message

THREADS = 40
OTHER = {"configurable": {"thread_id": "x-billing"}}  # sorted after the chain's threads


@pytest.fixture(params=params(["sqlite", "postgres", "redis"]))
def kill_target(request: pytest.FixtureRequest, tmp_path: Path):  # type: ignore[no-untyped-def]
    kind = request.param
    if kind == "sqlite":
        yield f"sqlite:{tmp_path / 'kill.db'}"
    elif kind == "postgres":
        schema = pg_schema()
        yield f"postgres:{schema}"
        drop_pg_schemas(schema)
    else:
        prefix = redis_prefix()
        yield f"redis:{prefix}"
        drop_redis_prefixes(prefix)


def test_killed_migration_resumes_and_migrates_each_checkpoint_once(kill_target: str) -> None:
    with open_target(kill_target, schema_chain=SchemaChain(1, name=CHAIN.name)) as v1:  # v1 code
        g1 = graph_v1().compile(checkpointer=v1)
        for i in range(THREADS):
            text = f"ship {i}" if i % 5 == 0 else f"hello {i}"  # every fifth pauses
            g1.invoke({"messages": [v1_message("human", text)]},
                      {"configurable": {"thread_id": f"t{i:03}"}})
        everything = {(t.config["configurable"]["thread_id"], t.config["configurable"]["checkpoint_ns"],
                       t.checkpoint["id"]) for t in v1.list(None)}
        v1.schema_chain = SchemaChain(1, name="billing")  # another graph's thread, same store
        g1.invoke({"messages": [v1_message("human", "bill")]}, OTHER)
        billing = [(t.metadata, t.checkpoint) for t in v1.list(OTHER)]

    proc = start("tests.support.migrate_worker", kill_target, "0.05")
    assert proc.stdout is not None
    try:
        for line in proc.stdout:
            if line.startswith("PROGRESS") and int(line.split()[1]) >= THREADS // 2:
                proc.kill()  # SIGKILL: no cleanup, no flush, mid-run
                break
        else:
            pytest.fail(f"the worker ended before halfway: {proc.stderr.read() if proc.stderr else ''}")
    finally:
        proc.wait(30)
    assert proc.returncode == -9

    with open_target(kill_target, schema_chain=CHAIN) as v3:
        partial = v3.migration_log()
        assert THREADS // 2 <= len({m.thread_id for m in partial}) < THREADS

        report = v3.migrate_threads()
        assert report.threads_migrated == THREADS - len({m.thread_id for m in partial})
        assert report.threads_skipped_other == 1 and report.skipped[0].thread_id == "x-billing"
        log = v3.migration_log()
        keys = [(m.thread_id, m.checkpoint_ns, m.checkpoint_id) for m in log]
        assert len(keys) == len(set(keys))  # each checkpoint once
        assert set(keys) == everything  # and every one of them
        assert v3.migrate_threads().checkpoints_migrated == 0

        # Nothing lost: with no chain at all, every thread reads back whole, in the v3 shape;
        # the other chain's thread is as it was written.
        v3.schema_chain = None
        assert [(t.metadata, t.checkpoint) for t in v3.list(OTHER)
                ] == billing
        g3 = graph_v3().compile(checkpointer=v3)
        for i in range(THREADS):
            config = {"configurable": {"thread_id": f"t{i:03}"}}
            state = g3.get_state(config)
            assert is_v3(state.values) and state.values["turns"] == 1
            text = f"ship {i}" if i % 5 == 0 else f"hello {i}"
            assert [m.content for m in state.values["messages"]][:2] == [text, f"echo: {text}"]
            if i % 5 == 0:
                assert state.next == ("ask",)
                out = g3.invoke(Command(resume="ok"), config)
                assert [m.content for m in out["messages"]][-2:] == ["decision: ok", "noted"]
