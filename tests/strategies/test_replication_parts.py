"""The parts of `strategies/replication/` on their own: each saver classifies its own errors
(refused vs unreachable), the modules import one another without a cycle, a replica that
could not be opened in the replicator process is asked for its abilities without being
opened, and a sync call runs inline (it never needs an event loop)."""

from __future__ import annotations

import ast
import asyncio
import sqlite3
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
from langgraph.checkpoint.memory import InMemorySaver

from langgraph_ckpt_ext import (
    InMemoryCheckpointer,
    InvalidConfigError,
    ReplicatedCheckpointer,
    SQLiteCheckpointer,
    StoreUnavailableError,
)
from langgraph_ckpt_ext.core.errors import MissingBaseError
from langgraph_ckpt_ext.core.failures import Classifying, unavailable
from langgraph_ckpt_ext.core.inner import BatchSaver, RowSaver
from langgraph_ckpt_ext.strategies import replication
from langgraph_ckpt_ext.strategies.replication.child import _Deferred
from langgraph_ckpt_ext.strategies.replication.failures import (
    RemoteError,
    classifier,
    foreign_unavailable,
    unavailable_at,
)
from langgraph_ckpt_ext.strategies.replication.queue import BATCH, Op
from langgraph_ckpt_ext.strategies.replication.worker import Replica
from tests.support.common import conf


class _SqlError(Exception):
    """What a PostgreSQL driver raises: an error with a SQLSTATE."""

    def __init__(self, sqlstate: str) -> None:
        super().__init__(sqlstate)
        self.sqlstate = sqlstate


def test_the_generic_rule() -> None:
    for outage in (ConnectionError(), TimeoutError(), OSError(), StoreUnavailableError("x"),
                   RuntimeError("driver"), RemoteError("x")):
        assert unavailable(outage), outage
    for refused in (InvalidConfigError("x"), ValueError(), TypeError(), KeyError("k"),
                    MissingBaseError("x"), NotImplementedError()):
        assert not unavailable(refused), refused
    assert not unavailable(KeyboardInterrupt())  # not an Exception: never failed over on


def test_each_saver_classifies_its_own_errors(tmp_path: Path) -> None:
    """PostgreSQL's SQLSTATE refusals are the PostgreSQL backend's (and a foreign saver's,
    as LangGraph's PostgresSaver raises them); SQLite and memory keep the generic rule."""
    sqlite = SQLiteCheckpointer(tmp_path / "a.db")
    memory = InMemoryCheckpointer()
    try:
        for saver in (sqlite, memory):
            assert isinstance(saver, Classifying)
            assert classifier(saver) == saver.is_unavailable
            assert saver.is_unavailable(sqlite3.IntegrityError("dup"))  # as before: an outage
            assert saver.is_unavailable(_SqlError("23505"))  # none of its errors has one
        assert classifier(InMemorySaver()) is foreign_unavailable
        for code, outage in (("22021", False), ("23505", False), ("54000", False),
                             ("57P01", True), ("08006", True)):
            assert foreign_unavailable(_SqlError(code)) is outage, code
    finally:
        sqlite.close()
        memory.close()


def test_postgres_refusals_are_the_backends() -> None:
    pytest.importorskip("asyncpg")
    from langgraph_ckpt_ext.backends.postgres.store import PostgresStore

    store = PostgresStore(dsn="postgresql://127.0.0.1:1/none")  # never opened
    assert store.refuses(_SqlError("22P02")) and not store.refuses(_SqlError("57P01"))
    assert not store.refuses(RuntimeError())


def test_an_error_of_either_store_is_an_outage_unless_one_refuses(tmp_path: Path) -> None:
    memory = InMemoryCheckpointer()
    try:
        assert unavailable_at(_SqlError("23505"), memory, memory)
        assert not unavailable_at(_SqlError("23505"), memory, InMemorySaver())
        assert unavailable_at(ConnectionError(), memory, InMemorySaver())
    finally:
        memory.close()


def test_a_deferred_replica_is_not_opened_to_be_asked() -> None:
    """The replicator process asks a replica it could not open what it takes (`RowSaver`,
    errors it classifies) without opening it: the worker marks it down and probes it."""
    deferred = _Deferred("postgresql://127.0.0.1:1/none", {})
    assert isinstance(deferred, RowSaver) and isinstance(deferred, BatchSaver)
    assert isinstance(deferred, Classifying)
    assert deferred.is_unavailable(_SqlError("08006"))
    assert not deferred.is_unavailable(_SqlError("22021"))
    assert deferred.saver is None


def _imports(path: Path, package: str) -> set[str]:
    """The modules of `package` that the module at `path` imports (at any level)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            if node.module:
                names.add(node.module.split(".")[0])
            else:
                names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(
                package + "."):
            names.add(node.module[len(package) + 1:].split(".")[0])
    return names


def test_no_import_cycle_in_the_package() -> None:
    root = Path(replication.__file__).parent
    modules = {p.stem: p for p in root.glob("*.py") if p.stem != "__init__"}
    graph = {m: _imports(p, replication.__name__) & modules.keys() for m, p in modules.items()}
    assert "checkpointer" in graph and len(modules) >= 8
    done: set[str] = set()

    def visit(m: str, path: tuple[str, ...]) -> None:
        assert m not in path, f"import cycle: {' -> '.join((*path, m))}"
        if m in done:
            return
        for n in graph[m]:
            visit(n, (*path, m))
        done.add(m)

    for m in graph:
        visit(m, ())
    too_long = {m: n for m, p in modules.items() if (n := len(p.read_text().splitlines())) > 350}
    assert not too_long, too_long


def test_sync_calls_run_inline_even_inside_an_event_loop() -> None:
    """A sync call never suspends and needs no loop: called from a coroutine (as a tool of a
    graph run by `ainvoke` may do) it completes in place."""
    primary, replica = InMemoryCheckpointer(), InMemoryCheckpointer()
    cp = ReplicatedCheckpointer(primary, [replica], names=["r"])

    async def main() -> Any:
        config = cp.put(conf("t"), create_checkpoint(empty_checkpoint(), {}, 1),
                        {"source": "input", "step": -1}, {})
        cp.put_writes(config, [("x", 1)], "task")
        return cp.get_tuple(config), list(cp.list(conf("t")))

    try:
        got, listed = asyncio.run(main())
        assert got is not None and got.pending_writes == [("task", "x", 1)]
        assert [t.config["configurable"]["checkpoint_id"] for t in listed] == [
            got.config["configurable"]["checkpoint_id"]]
        assert cp.flush(5)
        assert replica.get_tuple(conf("t")) is not None
    finally:
        cp.close()
        primary.close()
        replica.close()


class _CountingCondition(threading.Condition):
    """A condition that counts the `notify_all` calls made from the thread that built it."""

    def __init__(self) -> None:
        super().__init__()
        self.owner, self.wakes = threading.get_ident(), 0

    def notify_all(self) -> None:
        if threading.get_ident() == self.owner:
            self.wakes += 1
        super().notify_all()


_ROOT = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def _put(n: int) -> Op:
    """The `n`th checkpoint of thread `t`, as a replica's queue holds it."""
    ck = empty_checkpoint()
    ck["id"] = str(uuid.UUID(int=n))
    return Op("put", (_ROOT, ck, {"source": "loop", "step": n}, {}), ("t",), time.monotonic())


def test_a_lingering_worker_is_woken_by_a_first_op_and_a_full_batch_only() -> None:
    """Each queued op woke the worker, which then only lingered on: a thread switch per
    write for the writer. Now a first op wakes it, and a full batch (applied at once, not
    after the 30 s linger)."""
    saver = InMemoryCheckpointer()
    replica = Replica("r", saver, max_queue=1000, linger=30.0)
    cond = replica.cond = _CountingCondition()
    try:
        for n in range(1, 11):
            replica.push(_put(n), wait=5)
        assert cond.wakes == 1  # the first; the worker lingers on it
        for n in range(11, BATCH + 1):
            replica.push(_put(n), wait=5)
        assert cond.wakes == 2  # the batch is full
        with cond:
            assert cond.wait_for(replica.drained, timeout=20)
        assert len(list(saver.list(_ROOT))) == BATCH
    finally:
        replica.stop()
        assert replica.thread is not None
        replica.thread.join(5)


def test_a_replica_going_down_is_logged_once_without_passwords(
        caplog: pytest.LogCaptureFixture) -> None:
    """`langgraph_ckpt_ext.replication` logs a replica's change of health once, with its
    figures as `record.lgckpt`, and no password a URL in the error held."""
    from langgraph_ckpt_ext.strategies.replication.health import Health

    caplog.set_level("INFO", "langgraph_ckpt_ext.replication")
    r = Health("far", 10)
    error = ConnectionError("could not reach postgresql://app:s3cr3t@db:5432/x")
    r._set_up(False, error)
    r._set_up(False, error)  # still down: nothing more
    r.failures = 2
    r._set_up(True, None)
    down, back = caplog.records
    assert down.levelname == "WARNING" and back.levelname == "INFO"
    assert "s3cr3t" not in down.getMessage() and "app:***@db" in down.getMessage()
    assert down.lgckpt == {"replica": "far", "up": False, "failures": 0,  # type: ignore[attr-defined]
                           "error": "ConnectionError: could not reach "
                                    "postgresql://app:***@db:5432/x"}
    assert "back after 2 failed attempts" in back.getMessage()


class _Unreachable(InMemoryCheckpointer):
    """A replica whose every write fails as an outage does (the worker marks it down)."""

    attempts = 0

    def put(self, *args: Any, **kwargs: Any) -> Any:
        type(self).attempts += 1
        raise ConnectionError("replica unreachable")


def test_a_replica_that_is_down_is_retried_on_its_back_off_not_at_every_write() -> None:
    """Once down, a replica's queue growing past a batch does not wake its worker at each
    write (each wake retried the dead server): it waits out its back-off."""
    saver = _Unreachable()
    replica = Replica("r", saver, max_queue=10_000, linger=0.0)
    cond = replica.cond = _CountingCondition()
    try:
        replica.push(_put(1), wait=5)
        deadline = time.monotonic() + 10
        while replica.status().up and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not replica.status().up
        wakes, tried = cond.wakes, _Unreachable.attempts
        for n in range(2, 3 * BATCH):
            replica.push(_put(n), wait=5)
        assert cond.wakes == wakes  # not one wake for the writes made while it is down
        assert _Unreachable.attempts - tried <= 3  # its back-off's retries alone, if any
    finally:
        replica.stop()
        assert replica.thread is not None
        replica.thread.join(5)
