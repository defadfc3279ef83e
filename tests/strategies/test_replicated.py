"""ReplicatedCheckpointer on its own terms, on real backends: every write kind replicated in
order, repair, status and lag, quorum writes, queue overflow, bad input, and reads failing over
(the conformance suite and the graph scenarios run it too; server faults are in
test_replicated_faults.py)."""

from __future__ import annotations

import socket
import sqlite3
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import BaseCheckpointSaver, copy_checkpoint, create_checkpoint
from langgraph.checkpoint.memory import InMemorySaver
from langgraph.types import Command

from langgraph_ckpt_ext import (
    InvalidConfigError,
    PrimaryUnavailableError,
    QuorumUnavailableError,
    RedisCheckpointer,
    ReplicatedCheckpointer,
    ReplicationError,
    SQLiteCheckpointer,
    StoreUnavailableError,
)
from tests.support.common import LoopThread
from tests.support.graphs import approval_graph, chat_graph, human, subgraph_graph
from tests.support.savers import SaverHandle, open_saver, param, params, unique_prefix

# -- helpers ----------------------------------------------------------------------------------


def cfg(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def free_port() -> int:
    """A loopback port nothing listens on (bound by us, then closed)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stores:
    """The checkpointers of one test: made on fresh files, schemas and key prefixes, closed
    and dropped at its end (the wrappers first)."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.made: list[SaverHandle] = []
        self.unreachables: list[RedisCheckpointer] = []
        self.wrappers: list[ReplicatedCheckpointer] = []

    def new(self, kind: str, **options: Any) -> Any:
        directory = self.tmp_path / f"store-{len(self.made)}"
        directory.mkdir()
        self.made.append(open_saver(kind, directory, **options))
        return self.made[-1].saver

    def handle(self, cp: Any) -> SaverHandle:
        """The handle of a checkpointer `new` made: where its storage lives."""
        return next(h for h in self.made if h.saver is cp)

    def unreachable(self) -> RedisCheckpointer:
        """A Redis checkpointer pointed at a loopback port nothing listens on."""
        cp = RedisCheckpointer(f"redis://127.0.0.1:{free_port()}/0", key_prefix=unique_prefix(),
                               setup=False, cluster=False)
        self.unreachables.append(cp)
        return cp

    def replicated(self, primary: Any, replicas: list[Any], consistency: str = "async",
                   **options: Any) -> ReplicatedCheckpointer:
        cp = ReplicatedCheckpointer(primary, replicas, consistency, **options)  # type: ignore[arg-type]
        self.wrappers.append(cp)
        return cp

    def close(self) -> None:
        for w in self.wrappers:
            w.close(timeout=5)
        for h in self.made:
            h.close()
        for cp in self.unreachables:
            cp.close()


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores(tmp_path)
    yield s
    s.close()


def _writes_key(w: tuple[str, str, Any]) -> tuple[str, str, str]:
    return (str(w[0]), w[1], repr(w[2]))


def snapshot(saver: BaseCheckpointSaver[Any], thread: str) -> list[tuple[Any, ...]]:
    """A thread checkpoint by checkpoint: namespace, id, parent, versions, values, metadata,
    pending writes (in an order that does not depend on the backend)."""
    out = []
    for t in saver.list(cfg(thread)):
        c = t.config["configurable"]
        parent = None if t.parent_config is None else t.parent_config["configurable"][
            "checkpoint_id"]
        metadata = {k: v for k, v in (t.metadata or {}).items() if k != "audit"}
        out.append((
            c.get("checkpoint_ns", ""), c["checkpoint_id"], parent,
            t.checkpoint["channel_versions"], t.checkpoint["channel_values"], metadata,
            sorted(t.pending_writes or [], key=_writes_key),
        ))
    return sorted(out, key=lambda row: (row[0], row[1]))


def assert_same(primary: Any, replica: Any) -> None:
    """The replica holds exactly the primary's threads, checkpoints and writes."""
    threads = primary.thread_ids()
    assert replica.thread_ids() == threads
    for thread in threads:
        assert snapshot(replica, thread) == snapshot(primary, thread), thread


def wait_for(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def a_checkpoint(saver: Any, thread: str, step: int, parent: Any = None, **values: Any
                 ) -> tuple[dict[str, Any], Any, dict[str, Any], dict[str, Any]]:
    """The arguments of a put: a checkpoint of `thread` (child of the tuple `parent`) whose
    channels hold `values`."""
    base = parent.checkpoint if parent is not None else None
    if base is None:
        from langgraph.checkpoint.base import empty_checkpoint

        checkpoint = empty_checkpoint()
    else:
        checkpoint = create_checkpoint(base, None, step)
    new_versions = {}
    for ch, value in values.items():
        current = checkpoint["channel_versions"].get(ch)
        new_versions[ch] = saver.get_next_version(current, None)
        checkpoint["channel_versions"][ch] = new_versions[ch]
        checkpoint["channel_values"][ch] = value
    config = parent.config if parent is not None else cfg(thread, checkpoint_ns="")
    return config, checkpoint, {"source": "loop", "step": step}, new_versions


# -- every write kind, in order ---------------------------------------------------------------

MIXES = {
    "postgres>redis+sqlite": ("postgres", ["redis", "sqlite"]),
    "sqlite>memory+postgres": ("sqlite", ["memory", "postgres"]),
    # the replicas given as URLs: applied by the replicator process
    "sqlite>redis+postgres:process": ("sqlite", ["redis", "postgres"]),
}


class Calls:
    """The wrapper's calls, through its sync or its async API."""

    def __init__(self, cp: ReplicatedCheckpointer, mode: str, loop: LoopThread) -> None:
        self.cp, self.mode, self.loop = cp, mode, loop

    def invoke(self, graph: Any, inp: Any, config: dict[str, Any]) -> Any:
        if self.mode == "async":
            return self.loop.run(graph.ainvoke(inp, config))
        return graph.invoke(inp, config)

    def __getattr__(self, name: str) -> Callable[..., Any]:
        if self.mode == "async":
            method = getattr(self.cp, f"a{name}")
            return lambda *a, **kw: self.loop.run(method(*a, **kw))
        return getattr(self.cp, name)  # type: ignore[no-any-return]


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("mix", [param(k, MIXES[k][0], *MIXES[k][1]) for k in MIXES])
def test_every_write_kind_replicates_in_order(
    mix: str, mode: str, stores: Stores, loop_thread: LoopThread
) -> None:
    primary_kind, replica_kinds = MIXES[mix]
    primary = stores.new(primary_kind)
    replicas = [stores.new(k) for k in replica_kinds]
    specs = [stores.handle(r).replica_spec() for r in replicas] if (
        mix.endswith(":process")) else replicas
    cp = stores.replicated(primary, specs)
    api = Calls(cp, mode, loop_thread)
    chat = chat_graph().compile(checkpointer=cp)
    approval = approval_graph().compile(checkpointer=cp)
    nested = subgraph_graph().compile(checkpointer=cp)

    def replicated() -> None:
        assert api.flush(10) is True
        for r in replicas:
            assert_same(primary, r)
        for r in cp.status().replicas:
            assert r.up and r.queued == 0 and not r.needs_repair and r.last_error is None

    # put and put_writes: turns of a chat (two runs), a pause with its interrupt, a subgraph
    for turn, run_id in enumerate(["run-1", "run-2", "run-3"]):
        api.invoke(chat, {"messages": [human(f"turn {turn}")]}, cfg("a", run_id=run_id))
    api.invoke(approval, {"request": "r", "log": []}, cfg("h"))
    api.invoke(nested, {"text": "s", "trail": []}, cfg("n"))
    latest = cp.get_tuple(cfg("a"))
    api.put_writes(latest.config, [("extra", {"k": [1, 2]}), ("other", "v")], "task-1")
    replicated()
    assert any(w[0] == "task-1" for w in replicas[0].get_tuple(cfg("a")).pending_writes)
    assert {t.config["configurable"]["checkpoint_ns"] for t in replicas[1].list(cfg("n"))} != {""}

    api.copy_thread("a", "c")  # then the source changes: the copy is of what it held before
    api.invoke(chat, {"messages": [human("after copy")]}, cfg("a", run_id="run-4"))
    replicated()
    assert len(list(replicas[0].list(cfg("c")))) == 9

    api.delete_thread("h")  # then written again: the replica ends with the new checkpoints
    api.invoke(approval, {"request": "again", "log": []}, cfg("h"))
    api.invoke(approval, Command(resume="yes"), cfg("h"))
    replicated()
    assert replicas[1].get_tuple(cfg("h")).checkpoint["channel_values"]["log"][0] == (
        "proposed again")

    api.delete_for_runs(["run-2"])
    replicated()
    assert {t.metadata.get("run_id") for t in replicas[0].list(cfg("a"))} == {
        "run-1", "run-3", "run-4"}

    api.prune(["a"], strategy="keep_latest")
    api.prune(["c"], strategy="delete")
    replicated()
    assert replicas[0].thread_ids() == ["a", "h", "n"]
    assert cp.repair().clean


# -- repair -----------------------------------------------------------------------------------


def repair_setup(stores: Stores) -> tuple[ReplicatedCheckpointer, Any, Any, Any]:
    """A SQLite primary with a Redis and an in-memory replica, holding four equal threads."""
    primary, r0, r1 = stores.new("sqlite"), stores.new("redis"), stores.new("memory")
    cp = stores.replicated(primary, [r0, r1], names=["redis", "memory"])
    chat = chat_graph().compile(checkpointer=cp)
    for thread in ("a", "b", "c"):
        for turn in range(2):
            chat.invoke({"messages": [human(f"{thread} {turn}")]}, cfg(thread))
    approval_graph().compile(checkpointer=cp).invoke({"request": "r", "log": []}, cfg("h"))
    assert cp.flush(10)
    assert cp.repair().clean
    return cp, primary, r0, r1


def counts(saver: Any, thread: str) -> tuple[int, int]:
    tuples = list(saver.list(cfg(thread)))
    return len(tuples), sum(len(t.pending_writes or []) for t in tuples)


DAMAGE = ["missing_thread", "extra_thread", "extra_checkpoint", "missing_checkpoint",
          "different_value", "missing_writes", "extra_writes"]


@pytest.mark.redis
@pytest.mark.parametrize("damage", DAMAGE)
def test_repair_makes_a_replica_equal_to_the_primary(damage: str, stores: Stores) -> None:
    cp, primary, r0, r1 = repair_setup(stores)
    n_b, writes_b = counts(primary, "b")
    expect: dict[str, Any] = {}  # what the report says of the damaged replica, r0
    both = False  # the damage is the primary's: both replicas are repaired alike
    if damage == "missing_thread":
        r0.delete_thread("b")
        expect = {"checkpoints_copied": n_b, "writes_copied": writes_b}
    elif damage == "extra_thread":
        r0.copy_thread("a", "ghost")
        expect = {"threads_deleted": ["ghost"]}
    elif damage == "extra_checkpoint":
        r0.put(*a_checkpoint(r0, "b", 9, r0.get_tuple(cfg("b")), turns=99))
        expect = {"threads_rebuilt": ["b"], "checkpoints_copied": n_b, "writes_copied": writes_b}
    elif damage == "missing_checkpoint":
        primary.put(*a_checkpoint(primary, "b", 9, primary.get_tuple(cfg("b")), turns=99))
        expect = {"checkpoints_copied": 1}
        both = True
    elif damage == "different_value":
        # the same checkpoint id, another value: written to the replica directly
        held = r0.get_tuple(cfg("b"))
        checkpoint = copy_checkpoint(held.checkpoint)
        version = r0.get_next_version(max(checkpoint["channel_versions"].values()), None)
        checkpoint["channel_versions"]["turns"] = version
        checkpoint["channel_values"]["turns"] = 1000
        r0.put(held.parent_config, checkpoint, held.metadata, {"turns": version})
        assert r0.get_tuple(cfg("b")).checkpoint["id"] == held.checkpoint["id"]
        assert r0.get_tuple(cfg("b")).checkpoint["channel_values"]["turns"] == 1000
        expect = {"threads_rebuilt": ["b"], "checkpoints_copied": n_b, "writes_copied": writes_b}
    elif damage == "missing_writes":
        oldest = list(primary.list(cfg("b")))[-1]
        primary.put_writes(oldest.config, [("x", 1), ("y", [2, 3])], "late-task")
        expect = {"writes_copied": 2}
        both = True
    else:  # extra_writes
        r0.put_writes(r0.get_tuple(cfg("b")).config, [("x", "stray")], "stray-task")
        expect = {"threads_rebuilt": ["b"], "checkpoints_copied": n_b, "writes_copied": writes_b}
    touched = {"ghost"} if damage == "extra_thread" else {"b"}

    report = cp.repair()
    assert not report.clean
    damaged, other = report.replicas
    assert (damaged.name, other.name) == ("redis", "memory")
    threads = 5 if damage == "extra_thread" else 4
    assert damaged.threads_checked == threads and damaged.error is None
    assert damaged.threads_equal == threads - 1
    assert damaged.threads_skipped == []
    for name in ("checkpoints_copied", "writes_copied", "threads_rebuilt", "threads_deleted"):
        assert getattr(damaged, name) == expect.get(name, [] if name.startswith("threads") else 0)
        if both:
            assert getattr(other, name) == getattr(damaged, name)
        else:
            assert not getattr(other, name)
    if not both:
        assert other.threads_equal == other.threads_checked == 4
    assert "redis: " in report.summary() and touched
    assert cp.repair().clean
    assert_same(primary, r0)
    assert_same(primary, r1)


@pytest.mark.redis
def test_repair_of_given_threads_touches_only_those(stores: Stores) -> None:
    cp, primary, r0, _ = repair_setup(stores)
    r0.copy_thread("b", "ghost")
    r0.delete_thread("a")
    n_a, writes_a = counts(primary, "a")
    report = cp.repair(thread_ids=["a"])
    damaged, other = report.replicas
    assert damaged.threads_checked == 1 and damaged.checkpoints_copied == n_a
    assert damaged.writes_copied == writes_a and damaged.threads_deleted == []
    assert other.threads_checked == other.threads_equal == 1
    assert "ghost" in r0.thread_ids()  # not named: left as it was
    assert snapshot(r0, "a") == snapshot(primary, "a")
    report = cp.repair(["a", "b"])
    assert report.clean and report.replicas[0].threads_checked == 2
    report = cp.repair()
    assert report.replicas[0].threads_deleted == ["ghost"]
    assert cp.repair().clean
    assert_same(primary, r0)


@pytest.mark.redis
def test_repair_reports_progress(stores: Stores) -> None:
    cp, _, r0, _ = repair_setup(stores)
    r0.copy_thread("a", "ghost")
    calls: list[tuple[str, int, int]] = []
    cp.repair(progress=lambda name, done, total: calls.append((name, done, total)))
    assert calls == [("redis", n, 5) for n in range(1, 6)] + [("memory", n, 4) for n in range(1, 5)]


@pytest.mark.postgres
async def test_async_repair_and_flush(stores: Stores) -> None:
    primary, replica = stores.new("postgres"), stores.new("sqlite")
    cp = stores.replicated(primary, [replica], "async")
    graph = chat_graph().compile(checkpointer=cp)
    for turn in range(3):
        await graph.ainvoke({"messages": [human(f"t{turn}")]}, cfg("t"))
    assert await cp.aflush(10)
    assert (await cp.arepair()).clean
    await replica.adelete_thread("t")
    report = await cp.arepair(["t"])
    assert report.replicas[0].checkpoints_copied == 9
    assert (await cp.arepair()).clean
    assert_same(primary, replica)


# -- status -----------------------------------------------------------------------------------


@pytest.mark.postgres
@pytest.mark.redis
def test_status_counts_queued_age_and_applied(stores: Stores) -> None:
    """A replica held back by a real lock (another connection's write transaction on its
    SQLite file): its queue grows and ages, then is applied whole."""
    primary, slow, fast = stores.new("postgres"), stores.new("sqlite"), stores.new("redis")
    cp = stores.replicated(primary, [slow, fast], names=["slow", "fast"])
    lock = sqlite3.connect(stores.handle(slow).path, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        parent = None
        ops = 0
        for step in range(5):
            config = cp.put(*a_checkpoint(cp, "t", step, parent, n=step))
            parent = cp.get_tuple(config)
            cp.put_writes(config, [("n", step + 1)], f"task-{step}")
            ops += 2
        wait_for(lambda: cp.status().replicas[1].queued == 0)
        time.sleep(0.05)
        slow_status, fast_status = cp.status().replicas
        assert (slow_status.name, fast_status.name) == ("slow", "fast")
        assert slow_status.up and slow_status.queued == ops and slow_status.applied == 0
        assert slow_status.oldest_unreplicated_age >= 0.05
        assert fast_status.queued == 0 and fast_status.applied == ops
        assert fast_status.oldest_unreplicated_age == 0.0
        assert cp.flush(timeout=0.1) is False  # the slow replica is up and has work queued
        assert "slow: up, 10 queued" in str(cp.status())
    finally:
        lock.rollback()
        lock.close()
    assert cp.flush(10) is True
    slow_status = cp.status().replicas[0]
    assert slow_status.queued == 0 and slow_status.applied == ops
    assert slow_status.oldest_unreplicated_age == 0.0 and slow_status.failures == 0
    assert_same(primary, slow)
    assert_same(primary, fast)


def test_an_unreachable_replica_is_reported_and_never_fails_a_write(
        stores: Stores, caplog: pytest.LogCaptureFixture) -> None:
    """...and logged once, when it goes down (`langgraph_ckpt_ext.replication`)."""
    caplog.set_level("INFO", "langgraph_ckpt_ext.replication")
    primary, good, bad = stores.new("sqlite"), stores.new("memory"), stores.unreachable()
    cp = stores.replicated(primary, [good, bad], "async", names=["good", "bad"])
    parent = None
    for step in range(3):
        started = time.monotonic()
        parent = cp.get_tuple(cp.put(*a_checkpoint(cp, "t", step, parent, n=step)))
        assert time.monotonic() - started < 0.5  # the primary's write, not the replica's
    wait_for(lambda: not cp.status().replicas[1].up)
    before = cp.status().replicas[1].queued
    for step in range(3, 6):
        parent = cp.get_tuple(cp.put(*a_checkpoint(cp, "t", step, parent, n=step)))
    status = cp.status()
    assert status.primary_up
    down = status.replicas[1]
    assert not down.up and down.failures >= 1 and down.queued == before + 3 == 6
    assert down.last_error is not None and "Redis unreachable" in down.last_error
    assert down.oldest_unreplicated_age > 0 and down.applied == 0
    assert "bad: DOWN, 6 queued" in str(status)
    (logged,) = [r for r in caplog.records if r.name == "langgraph_ckpt_ext.replication"]
    assert logged.levelname == "WARNING" and "replica bad is down" in logged.getMessage()
    assert logged.lgckpt["replica"] == "bad" and not logged.lgckpt["up"]  # type: ignore[attr-defined]
    assert "Redis unreachable" in logged.lgckpt["error"]  # type: ignore[attr-defined]
    assert cp.flush(timeout=5) is True  # waits for the replicas that are up only
    assert status.replicas[0].up and cp.status().replicas[0].applied == 6
    assert_same(primary, good)
    report = cp.repair()
    assert not report.clean and report.replicas[1].error.startswith("down: ")
    assert report.replicas[0].error is None
    started = time.monotonic()
    cp.close(timeout=1)
    assert time.monotonic() - started < 5


def test_queue_overflow_marks_the_replica_for_repair(stores: Stores) -> None:
    primary, bad = stores.new("memory"), stores.unreachable()
    cp = stores.replicated(primary, [bad], "async", max_queue=2, max_wait=0.05)
    parent = None
    for step in range(8):  # never an error on the primary's write
        parent = cp.get_tuple(cp.put(*a_checkpoint(cp, f"t{step % 2}", step, None, n=step)))
    status = cp.status().replicas[0]
    assert status.needs_repair and status.threads_to_repair == 2 and status.queued <= 2
    assert "needs repair" in str(cp.status())
    assert parent is not None and primary.thread_ids() == ["t0", "t1"]


@pytest.mark.postgres
@pytest.mark.redis
def test_replicas_of_ours_store_the_primarys_rows(stores: Stores) -> None:
    """Ours all round (async): the primary encodes each write once and the replicas store its
    rows as they are; a replica missing a delta's base (its rows deleted behind our back)
    refuses that thread's writes, which are marked for repair, and `repair()` mends it."""
    primary, sqlite, redis = stores.new("postgres"), stores.new("sqlite"), stores.new("redis")
    cp = stores.replicated(primary, [sqlite, redis])
    assert cp._rows
    encoded: list[str] = []
    for replica in (sqlite, redis):  # a replica that encoded a value would call its serde
        real = replica.serde.dumps_typed
        replica.serde.dumps_typed = lambda v, real=real: encoded.append(repr(v)[:40]) or real(v)
    chat = chat_graph().compile(checkpointer=cp)
    for thread in ("a", "b"):
        for turn in range(3):
            chat.invoke({"messages": [human(f"{thread}{turn}")]}, cfg(thread))
    assert cp.flush(10) and encoded == []
    assert_same(primary, sqlite)
    assert_same(primary, redis)
    sqlite.delete_thread("a")  # behind the wrapper's back: its next delta has no base
    chat.invoke({"messages": [human("a3")]}, cfg("a"))
    chat.invoke({"messages": [human("b3")]}, cfg("b"))
    assert cp.flush(10)
    status = cp.status().replicas[0]
    assert status.up and status.needs_repair and status.threads_to_repair == 1
    assert "MissingBaseError" in (status.last_error or ""), status
    assert cp.status().replicas[1].threads_to_repair == 0
    report = cp.repair()
    assert report.replicas[0].checkpoints_copied > 0 and report.replicas[1].checkpoints_copied == 0
    assert_same(primary, sqlite)
    assert_same(primary, redis)
    assert not cp.status().replicas[0].needs_repair


@pytest.mark.postgres
def test_a_process_replica_that_refuses_a_write_is_marked_for_repair(stores: Stores) -> None:
    """A replica given as a URL (applied in the replicator process) that refuses a write (a
    delta whose base was deleted behind our back) has that thread marked for repair, and its
    error shown, by the time `flush()` returns; `repair()` mends it."""
    primary = stores.new("postgres")
    path = stores.tmp_path / "refusing.db"
    cp = stores.replicated(primary, [f"sqlite:///{path}"], names=["sqlite"])
    assert cp._rows
    chat = chat_graph().compile(checkpointer=cp)
    for thread in ("a", "b"):
        for turn in range(3):
            chat.invoke({"messages": [human(f"{thread}{turn}")]}, cfg(thread))
    assert cp.flush(10)
    applied = cp.status().replicas[0].applied
    with SQLiteCheckpointer(path) as replica:
        replica.delete_thread("a")
    chat.invoke({"messages": [human("a3")]}, cfg("a"))
    chat.invoke({"messages": [human("b3")]}, cfg("b"))
    assert cp.flush(10)
    status = cp.status().replicas[0]
    assert status.up and status.queued == 0, status
    assert status.needs_repair and status.threads_to_repair == 1, status
    assert "MissingBaseError" in (status.last_error or "") and status.failures >= 1, status
    assert applied < status.applied, status
    report = cp.repair()
    assert report.replicas[0].checkpoints_copied > 0
    with SQLiteCheckpointer(path) as replica:
        assert_same(primary, replica)
    assert not cp.status().replicas[0].needs_repair


def test_rows_are_shipped_only_between_alike_checkpointers(stores: Stores) -> None:
    from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

    class Custom(JsonPlusSerializer):
        pass

    primary = stores.new("sqlite")
    assert stores.replicated(primary, [stores.new("memory")])._rows
    assert not stores.replicated(primary, [stores.new("memory")], "quorum")._rows
    assert not stores.replicated(primary, [stores.new("memory", serde=Custom())])._rows
    assert not stores.replicated(primary, [stores.new("memory", audit=True)])._rows
    assert not stores.replicated(primary, [InMemorySaver()])._rows


@pytest.mark.parametrize("kind", params(["sqlite", "postgres", "redis"]))
def test_audit_turned_on_for_the_primary_while_shipping_rows(stores: Stores, kind: str) -> None:
    """A ReplicatedCheckpointer shipping rows, whose primary's store gets audited after it was
    built (by another checkpointer): the primary seals each checkpoint, the replica stores
    those very rows, and both verify clean."""
    primary, replica = stores.new(kind), stores.new("sqlite")
    cp = stores.replicated(primary, [replica], "async")
    assert cp._rows
    primary.audit_refresh = 0
    stores.handle(primary).reopen(audit=True).close()
    chat = chat_graph().compile(checkpointer=cp)
    for i in range(3):
        chat.invoke({"messages": [human(f"turn {i}")]}, cfg("t"))
    assert cp.flush(timeout=10) is True
    assert_same(primary, replica)
    for saver in (primary, replica):
        report = saver.verify("t")
        assert report.ok and report.checked == 9, str(report)
    assert primary.audit_status().enabled


@pytest.mark.postgres
@pytest.mark.redis
def test_anti_entropy_passes_compare_sizes_and_full_sweeps_compare_values(
    stores: Stores,
) -> None:
    """Between full sweeps, a written thread with as many rows on both stores counts as equal
    without its values being read; one that lost rows is repaired; a changed value is left to
    the full sweep, which compares values."""
    primary, replica, redis = stores.new("postgres"), stores.new("sqlite"), stores.new("redis")
    cp = stores.replicated(primary, [replica, redis])
    chat = chat_graph().compile(checkpointer=cp)
    for thread in ("p", "q"):
        for turn in range(3):
            chat.invoke({"messages": [human(f"{thread}{turn}")]}, cfg(thread))
    assert cp.flush(10)
    decoded = 0
    real = primary.serde.loads_typed

    def counting(data: Any) -> Any:
        nonlocal decoded
        decoded += 1
        return real(data)

    primary.serde.loads_typed = counting  # type: ignore[method-assign]
    quick = cp._repair(["p", "q"], quick=True)
    assert [r.threads_equal for r in quick.replicas] == [2, 2] and decoded == 0
    # Rows lost on the replica: its sizes differ, and the quick pass repairs it.
    with sqlite3.connect(stores.handle(replica).path) as db:
        db.execute("DELETE FROM lgx_writes WHERE thread_id = 'p'")
    report = cp._repair(["p", "q"], quick=True)
    assert report.replicas[0].writes_copied > 0 and report.replicas[0].threads_equal == 1
    assert_same(primary, replica)
    # A value changed, no row lost: only the full sweep sees it.
    with sqlite3.connect(stores.handle(replica).path) as db:
        db.execute("UPDATE lgx_checkpoints SET metadata = CAST(REPLACE(CAST(metadata AS TEXT), "
                   "'loop', 'LOOP') AS BLOB) WHERE thread_id = 'q'")
    assert cp._repair(["q"], quick=True).replicas[0].threads_equal == 1
    full = cp._repair(["q"])
    assert full.replicas[0].threads_rebuilt == ["q"] or full.replicas[0].checkpoints_copied > 0
    assert_same(primary, replica)


def test_overflowed_threads_stay_marked_until_repaired(stores: Stores) -> None:
    """A replica that cannot keep up (its SQLite file write-locked) with a queue of one and
    no wait: its queue is dropped, the threads marked; a repair of some threads leaves the
    others marked."""
    primary, slow = stores.new("memory"), stores.new("sqlite")
    cp = stores.replicated(primary, [slow], max_queue=1, max_wait=0)
    chat = chat_graph().compile(checkpointer=cp)
    lock = sqlite3.connect(stores.handle(slow).path, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        for thread in ("x", "y", "z"):
            chat.invoke({"messages": [human(thread)]}, cfg(thread))
        status = cp.status().replicas[0]
        assert status.up and status.needs_repair and status.threads_to_repair == 3
    finally:
        lock.rollback()
        lock.close()
    assert cp.flush(10)
    report = cp.repair(["x"])
    assert report.replicas[0].threads_checked == 1 and not report.clean
    status = cp.status().replicas[0]
    assert status.needs_repair and status.threads_to_repair == 2  # y and z: still marked
    cp.repair()
    assert not cp.status().replicas[0].needs_repair
    assert cp.repair().clean
    assert_same(primary, slow)


# -- quorum -----------------------------------------------------------------------------------


@pytest.mark.redis
def test_quorum_write_refused_before_the_primary_when_replicas_are_down(stores: Stores) -> None:
    """The first write meets a dead replica it did not know of: it is not stored, on the
    primary nor on the replica that took it; then writes are refused before any store is
    touched."""
    primary, good, bad = stores.new("sqlite"), stores.new("redis"), stores.unreachable()
    cp = stores.replicated(primary, [good, bad], "quorum", quorum=2, quorum_timeout=10)
    first = a_checkpoint(cp, "t", 0, None, n=0)
    with pytest.raises(QuorumUnavailableError,
                       match=r"only 1 of the 2 .* so it was not written to the primary"):
        cp.put(*first)
    assert primary.get_tuple(cfg("t")) is None and cp.get_tuple(cfg("t")) is None
    assert good.get_tuple(cfg("t")) is None  # taken back from the replica that took it
    assert not cp.status().replicas[1].up and not cp.status().replicas[0].needs_repair
    cp.primary.put(*first)  # (the thread as a quorum of replicas that are up would leave it)
    good.put(*first)
    parent = primary.get_tuple(cfg("t"))
    second = a_checkpoint(cp, "t", 1, parent, n=1)
    with pytest.raises(QuorumUnavailableError, match="Nothing was written") as caught:
        cp.put(*second)
    assert "replica-1 (StoreUnavailableError: Redis unreachable" in str(caught.value)
    assert primary.get_tuple(cfg("t", checkpoint_id=second[1]["id"])) is None
    with pytest.raises(QuorumUnavailableError, match="Nothing was written"):
        cp.put_writes(parent.config, [("n", 5)], "task")
    with pytest.raises(QuorumUnavailableError, match="Nothing was written"):
        cp.delete_thread("t")
    assert primary.get_tuple(cfg("t")).pending_writes == []
    assert cp.flush(5)
    assert snapshot(good, "t") == snapshot(primary, "t")


async def test_async_quorum_write_refused_too(stores: Stores) -> None:
    primary, good, bad = stores.new("memory"), stores.new("sqlite"), stores.unreachable()
    cp = stores.replicated(primary, [good, bad], "quorum", quorum=2, quorum_timeout=10)
    first = a_checkpoint(cp, "t", 0, None, n=0)
    with pytest.raises(QuorumUnavailableError, match="not written to the primary"):
        await cp.aput(*first)
    assert await primary.aget_tuple(cfg("t")) is None and await good.aget_tuple(cfg("t")) is None
    await primary.aput(*first)
    second = a_checkpoint(cp, "t", 1, await primary.aget_tuple(cfg("t")), n=1)
    with pytest.raises(QuorumUnavailableError, match="Nothing was written"):
        await cp.aput(*second)
    assert await primary.aget_tuple(cfg("t", checkpoint_id=second[1]["id"])) is None


@pytest.mark.postgres
def test_quorum_of_one_survives_one_replica_down(stores: Stores) -> None:
    primary, good, bad = stores.new("sqlite"), stores.new("postgres"), stores.unreachable()
    cp = stores.replicated(primary, [good, bad], "quorum", quorum=1, quorum_timeout=10)
    parent = None
    for step in range(4):
        config = cp.put(*a_checkpoint(cp, "t", step, parent, n=step))
        assert good.get_tuple(config) is not None  # confirmed by the one that is up
        parent = cp.get_tuple(config)
    wait_for(lambda: not cp.status().replicas[1].up)
    cp.put(*a_checkpoint(cp, "t", 9, parent, n=9))  # one replica up is a quorum of one


@pytest.mark.postgres
@pytest.mark.redis
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_quorum_write_returns_once_the_replicas_hold_it(
    mode: str, stores: Stores, loop_thread: LoopThread
) -> None:
    primary, r0, r1 = stores.new("sqlite"), stores.new("redis"), stores.new("postgres")
    cp = stores.replicated(primary, [r0, r1], "quorum", quorum=2)
    api = Calls(cp, mode, loop_thread)
    parent = None
    for step in range(4):
        config = api.put(*a_checkpoint(cp, "t", step, parent, n=step))
        # no flush: both replicas hold it when the call returns
        for r in (r0, r1):
            held = r.get_tuple(config)
            assert held is not None and held.checkpoint["channel_values"]["n"] == step
        api.put_writes(config, [("n", step * 10)], f"task-{step}")
        for r in (r0, r1):
            assert r.get_tuple(config).pending_writes == [(f"task-{step}", "n", step * 10)]
        parent = cp.get_tuple(config)
    graph = chat_graph().compile(checkpointer=cp)
    api.invoke(graph, {"messages": [human("q")]}, cfg("g"))
    for r in (r0, r1):
        assert snapshot(r, "g") == snapshot(primary, "g")
    api.delete_thread("t")
    assert r0.get_tuple(cfg("t")) is None and r1.get_tuple(cfg("t")) is None


@pytest.mark.redis
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_quorum_write_times_out_on_a_replica_that_does_not_answer(
    mode: str, stores: Stores, loop_thread: LoopThread
) -> None:
    """The replica is up but held back (its SQLite file write-locked): a quorum write waits
    `quorum_timeout`, then fails, not written to the primary (the graph's reads never see
    it). The replica, applying it when the lock goes, holds it: marked for repair, and
    `repair()` takes it away."""
    primary, slow = stores.new("redis"), stores.new("sqlite")
    cp = stores.replicated(primary, [slow], "quorum", quorum_timeout=0.2)
    api = Calls(cp, mode, loop_thread)
    before = api.put(*a_checkpoint(cp, "t", 0, None, n=0))
    args = a_checkpoint(cp, "t", 1, cp.get_tuple(before), n=1)
    lock = sqlite3.connect(stores.handle(slow).path, isolation_level=None)
    try:
        lock.execute("BEGIN IMMEDIATE")
        with pytest.raises(QuorumUnavailableError, match=r"only 0 of the 1 .*\(no answer within"):
            api.put(*args)
        cid = before["configurable"]["checkpoint_id"]
        assert (primary.get_tuple(cfg("t")).config["configurable"]["checkpoint_id"] == cid
                == cp.get_tuple(cfg("t")).config["configurable"]["checkpoint_id"])
        assert cp.status().replicas[0].up
    finally:
        lock.rollback()
        lock.close()
    assert cp.flush(10)
    assert slow.get_tuple(cfg("t")).checkpoint["id"] == args[1]["id"]  # applied late
    assert cp.status().replicas[0].needs_repair
    assert not cp.repair().clean
    assert_same(primary, slow)
    assert slow.get_tuple(cfg("t")).config["configurable"]["checkpoint_id"] == cid
    api.put(*args)  # the same write, retried: stored everywhere
    assert_same(primary, slow)
    assert primary.get_tuple(cfg("t")).checkpoint["id"] == args[1]["id"]


# -- anti-entropy -------------------------------------------------------------------------------


def test_background_repair_while_writing_never_diverges(stores: Stores, tmp_path: Path) -> None:
    """A repair every 10 ms while graphs write: a thread is never repaired halfway through a
    write (copied twice, or rebuilt without it), and the replica reads back whole from a new
    process' checkpointer."""
    primary, replica = stores.new("memory"), stores.new("sqlite")
    cp = stores.replicated(primary, [replica], "anti_entropy", repair_interval=0.01)
    chat = chat_graph().compile(checkpointer=cp)
    approval = approval_graph().compile(checkpointer=cp)
    for turn in range(15):
        chat.invoke({"messages": [human(f"turn {turn}")]}, cfg("a"))
        approval.invoke({"request": f"r{turn}", "log": []}, cfg(f"h{turn % 3}"))
        if turn % 5 == 4:
            cp.delete_thread(f"h{turn % 3}")
    assert cp.flush(10)
    cp.close()
    assert cp.repair().clean
    assert_same(primary, replica)
    with SQLiteCheckpointer(stores.handle(replica).path) as reopened:
        assert_same(primary, reopened)


# -- bad input ------------------------------------------------------------------------------------


def test_bad_options_are_refused_when_built(stores: Stores) -> None:
    primary, r0, r1 = stores.new("memory"), stores.new("memory"), stores.new("sqlite")
    cases: list[tuple[dict[str, Any], str]] = [
        ({"replicas": [r0, primary]}, "a replica is the primary itself"),
        ({"replicas": [r0, r0]}, "the same checkpointer is given twice as a replica"),
        ({"replicas": [], "consistency": "quorum"}, "consistency='quorum' needs at least one"),
        ({"consistency": "quorum", "quorum": 3},
         r"quorum=3 must be between 1 and the number of replicas \(2\)"),
        ({"consistency": "quorum", "quorum": 0}, "quorum=0 must be between 1"),
        ({"consistency": "eventual"},
         "unknown consistency 'eventual': use one of async, quorum, anti_entropy"),
        ({"max_wait": -1}, "max_wait must be >= 0, got -1"),
        ({"quorum_timeout": -0.5}, "quorum_timeout must be >= 0"),
        ({"repair_interval": float("nan")}, "repair_interval must be >= 0, got nan"),
        ({"retry_primary_after": -2}, "retry_primary_after must be >= 0"),
        ({"max_queue": 0}, "max_queue must be >= 1, got 0"),
        ({"names": ["one"]}, "names must give each replica a different name"),
        ({"names": ["same", "same"]}, "names must give each replica a different name"),
        ({"replicas": [r0, 12345]},
         r"each replica must be a BaseCheckpointSaver, a URL or \(url, options\), got 12345"),
        ({"primary": object()}, "primary must be a BaseCheckpointSaver"),
    ]
    for options, message in cases:
        kw = {"primary": primary, "replicas": [r0, r1], **options}
        with pytest.raises(InvalidConfigError, match=message):
            ReplicatedCheckpointer(kw.pop("primary"), kw.pop("replicas"), **kw)
    ReplicatedCheckpointer(primary, [r0, r1]).close()  # and these options are fine


@pytest.mark.redis
def test_a_config_without_thread_id_is_refused_and_nothing_replicated(stores: Stores) -> None:
    primary, replica = stores.new("sqlite"), stores.new("redis")
    cp = stores.replicated(primary, [replica])
    _, checkpoint, metadata, versions = a_checkpoint(cp, "t", 0, None, n=1)
    for bad in ({"configurable": {"checkpoint_ns": ""}}, {"configurable": {"thread_id": ""}}, {}):
        with pytest.raises(InvalidConfigError, match=r"config\['configurable'\]\['thread_id'\] is "
                                                     "missing"):
            cp.put(bad, checkpoint, metadata, versions)
        with pytest.raises(InvalidConfigError, match="thread_id"):
            cp.put_writes(bad, [("n", 1)], "task")
    assert cp.flush(5)
    status = cp.status().replicas[0]
    assert status.queued == 0 and status.applied == 0 and not status.needs_repair
    assert primary.thread_ids() == [] and replica.thread_ids() == []


# -- reads failing over -----------------------------------------------------------------------


def test_reads_fail_over_to_a_replica_and_writes_are_refused(stores: Stores) -> None:
    """The primary cannot be reached from the start (a port nothing listens on): reads come
    from the replica, writes are refused (no promotion)."""
    primary, replica = stores.unreachable(), stores.new("sqlite")
    replica.put(*a_checkpoint(replica, "t", 0, None, n=7))
    cp = stores.replicated(primary, [replica], retry_primary_after=60)
    held = cp.get_tuple(cfg("t"))
    assert held is not None and held.checkpoint["channel_values"]["n"] == 7
    status = cp.status()
    assert not status.primary_up and "Redis unreachable" in status.primary_error
    assert [t.checkpoint["id"] for t in cp.list(cfg("t"))] == [held.checkpoint["id"]]
    started = time.monotonic()
    assert cp.get_tuple(cfg("t")) is not None
    assert time.monotonic() - started < 0.3  # the primary is not tried again for 60 s
    with pytest.raises(PrimaryUnavailableError, match="writes are refused"):
        cp.put(*a_checkpoint(cp, "t", 1, held, n=8))
    assert len(list(replica.list(cfg("t")))) == 1

    no_failover = stores.replicated(primary, [replica], failover_reads=False)
    with pytest.raises(StoreUnavailableError, match="Redis unreachable"):
        no_failover.get_tuple(cfg("t"))


# -- a put applied twice (a retried batch) ------------------------------------------------------


def test_a_checkpoint_put_twice_reads_back(stores: Stores) -> None:
    replica = stores.new("sqlite")
    args = a_checkpoint(replica, "t", 0, None, log=["a"])
    replica.put(*args)
    replica.put(*args)  # a retried batch
    with SQLiteCheckpointer(stores.handle(replica).path) as reopened:
        assert reopened.get_tuple(cfg("t")).checkpoint["channel_values"]["log"] == ["a"]


def test_writes_after_close_are_refused(stores: Stores) -> None:
    primary, replica = stores.new("sqlite"), stores.new("memory")
    cp = stores.replicated(primary, [replica])
    cp.put(*a_checkpoint(cp, "t", 0, log=["a"]))
    cp.close()
    with pytest.raises(ReplicationError, match="closed"):
        cp.put(*a_checkpoint(cp, "t2", 0, log=["b"]))
    assert primary.get_tuple(cfg("t2")) is None
    assert replica.get_tuple(cfg("t")) is not None  # what came before close was applied


@pytest.mark.postgres
@pytest.mark.redis
def test_process_replicas_quorum_and_an_unreachable_one(stores: Stores) -> None:
    """URL replicas in the replicator process: a quorum write returns once they hold it; one
    that cannot be reached is reported down there, and the primary's writes go on."""
    primary, redis_replica = stores.new("postgres"), stores.new("redis")
    cp = stores.replicated(primary, [stores.handle(redis_replica).replica_spec()], "quorum")
    cp.put(*a_checkpoint(cp, "q", 0, log=["a"]))
    assert redis_replica.get_tuple(cfg("q")) is not None  # confirmed before put returned
    dead = f"redis://127.0.0.1:{free_port()}/0"
    lagging = stores.replicated(primary, [dead], names=["gone"])
    lagging.put(*a_checkpoint(lagging, "l", 0, log=["b"]))
    deadline = time.monotonic() + 10
    while lagging.status().replicas[0].up and time.monotonic() < deadline:
        time.sleep(0.05)
    status = lagging.status().replicas[0]
    assert not status.up and status.queued == 1 and status.last_error, status
    assert primary.get_tuple(cfg("l")) is not None


def test_process_replica_takes_back_a_quorum_write_that_failed(stores: Stores) -> None:
    """A URL replica that cannot be reached fails a quorum write: the primary does not get
    it, and the replicator process takes it off its queue (nothing left to apply later, no
    repair needed)."""
    primary = stores.new("sqlite")
    dead = f"redis://127.0.0.1:{free_port()}/0"
    cp = stores.replicated(primary, [dead], "quorum", names=["gone"], quorum_timeout=30)
    with pytest.raises(QuorumUnavailableError, match="not written to the primary"):
        cp.put(*a_checkpoint(cp, "q", 0, log=["a"]))
    assert primary.get_tuple(cfg("q")) is None and cp.get_tuple(cfg("q")) is None
    wait_for(lambda: cp.status().replicas[0].queued == 0 and not cp.status().replicas[0].up)
    status = cp.status().replicas[0]
    assert not status.up and not status.needs_repair and status.applied == 0, status


def test_a_bad_replica_url_is_refused_when_built(stores: Stores) -> None:
    primary = stores.new("sqlite")
    with pytest.raises(InvalidConfigError, match="replica URL"):
        ReplicatedCheckpointer(primary, ["memory://"])
    with pytest.raises(InvalidConfigError, match="replica URL"):
        ReplicatedCheckpointer(primary, ["mysql://h/db"])
    with pytest.raises(InvalidConfigError, match="could not be opened"):
        ReplicatedCheckpointer(primary, [("sqlite:///x.db", {"no_such_option": 1})])


def test_process_replica_writes_go_down_the_pipe_together(stores: Stores) -> None:
    """Async writes to URL replicas wait in the parent's outbox for `linger` and go to the
    replicator process as one frame (one pickle, one write to the pipe, one wake-up of the
    child for all of them), applied in order; a quorum write goes at once, after them."""
    from langgraph_ckpt_ext.strategies.replication import process

    primary = stores.new("sqlite")
    replica_path = stores.tmp_path / "outbox.db"
    cp = stores.replicated(primary, [f"sqlite:///{replica_path}"], linger=0.5)
    replicator = cp._replicator
    assert replicator is not None
    frames: list[Any] = []
    send = process.send_frame

    def counting(stream: Any, message: Any) -> None:
        frames.append(message)
        send(stream, message)

    process.send_frame = counting  # type: ignore[assignment]
    try:
        parent = None
        for step in range(5):
            cp.put(*a_checkpoint(cp, "o", step, parent, log=[f"m{step}"]))
            parent = cp.get_tuple(cfg("o"))
        assert cp.flush(timeout=30)
        ops = [m for f in frames for m in (f[1] if f[0] == "batch" else [f])]
        assert [m[0] for m in ops] == ["op"] * 5 and len(frames) == 1, frames
        assert [m[1] for m in ops] == sorted(m[1] for m in ops)  # the primary's order
        quorum = stores.replicated(primary, [f"sqlite:///{replica_path}"], "quorum",
                                   linger=0.5)
        frames.clear()
        quorum.put(*a_checkpoint(quorum, "q", 0, log=["q"]))  # returns once applied
        assert len(frames) == 1 and frames[0][0] == "op", frames
    finally:
        process.send_frame = send  # type: ignore[assignment]
    with SQLiteCheckpointer(replica_path) as replica:
        assert_same(primary, replica)
