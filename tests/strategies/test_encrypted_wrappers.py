"""The wrappers on encrypted stores: a ReplicatedCheckpointer whose primary and replicas each
encrypt under keys of their own (rows sealed on every replica, replica state equal to the
primary's, repair), and `rotate_keys` forwarded by the smart and replicated wrappers."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from langgraph_ckpt_ext import InMemoryCheckpointer, ReplicatedCheckpointer, SmartCheckpointer
from langgraph_ckpt_ext.core.keys import CallbackKeys, StaticKeys, new_key
from langgraph_ckpt_ext.core.rows import ListQuery
from langgraph_ckpt_ext.core.sealing import SEALED, Encryption
from tests.strategies.test_replicated import Stores, assert_same, cfg
from tests.support.graphs import approval_graph, chat_graph, human

KEYS = {"primary": new_key(), "redis": new_key(), "memory": new_key()}


def enc(name: str) -> Encryption:
    return Encryption(StaticKeys({name: KEYS[name]}))


@pytest.fixture
def stores(tmp_path: Path) -> Iterator[Stores]:
    s = Stores(tmp_path)
    yield s
    s.close()


def sealed_under(cp: Any, thread: str) -> set[tuple[str, str]]:
    """(type, key id) of every checkpoint record and metadata of a thread, as stored."""
    async def rows() -> list[Any]:
        inner = cp.stored.sealed.inner
        return [r async for r in inner.iter_checkpoints(ListQuery(thread_id=thread))]

    out = set()
    for row in cp.run_sync(rows()):
        for type_, data in (row.checkpoint, row.metadata):
            data = bytes(data)
            out.add((type_, data[7:7 + data[6]].decode() if type_ == SEALED else ""))
    return out


@pytest.mark.redis
@pytest.mark.postgres
def test_replicas_under_keys_of_their_own_hold_the_primarys_state(stores: Stores) -> None:
    primary = stores.new("postgres", encryption=enc("primary"), compression=True)
    r0 = stores.new("redis", encryption=enc("redis"))
    r1 = stores.new("memory", encryption=enc("memory"), compression=True)
    cp = stores.replicated(primary, [r0, r1], names=["redis", "memory"])
    chat = chat_graph().compile(checkpointer=cp)
    for thread in ("a", "b"):
        for turn in range(3):
            chat.invoke({"messages": [human(f"{thread} {turn}")]}, cfg(thread))
    approval_graph().compile(checkpointer=cp).invoke({"request": "r", "log": []}, cfg("h"))
    assert cp.flush(10)
    for name, saver in (("primary", primary), ("redis", r0), ("memory", r1)):
        for thread in ("a", "b", "h"):
            assert sealed_under(saver, thread) == {(SEALED, name)}, (name, thread)
    assert_same(primary, r0)
    assert_same(primary, r1)
    assert cp.repair().clean

    r0.delete_thread("b")  # a replica loses a thread: repair copies it, sealed under its key
    report = cp.repair()
    assert not report.clean and report.replicas[0].checkpoints_copied > 0
    assert sealed_under(r0, "b") == {(SEALED, "redis")}
    assert_same(primary, r0)
    assert cp.repair().clean


def rotating() -> tuple[Encryption, dict[str, str]]:
    """Encryption whose current key id can be changed (`state["current"]`)."""
    keys = {"k1": new_key(), "k2": new_key()}
    state = {"current": "k1"}
    return Encryption(CallbackKeys(keys.__getitem__, lambda _: state["current"])), state


@pytest.mark.parametrize("wrapper", ["smart", "replicated"])
@pytest.mark.parametrize("mode", ["sync", "async"])
def test_the_wrappers_forward_rotate_keys(wrapper: str, mode: str, loop_thread: Any) -> None:
    encryption, state = rotating()
    inner = InMemoryCheckpointer(encryption=encryption)
    cp: Any = (SmartCheckpointer(inner) if wrapper == "smart"
               else ReplicatedCheckpointer(inner, [InMemoryCheckpointer()]))
    try:
        chat = chat_graph().compile(checkpointer=cp)
        for turn in range(2):
            chat.invoke({"messages": [human(f"turn {turn}")]}, cfg("t"))
        state["current"] = "k2"

        def rotate(**kw: Any) -> Any:
            if mode == "async":
                return loop_thread.run(cp.arotate_keys(**kw))
            return cp.rotate_keys(**kw)

        dry = rotate(dry_run=True)
        assert dry.dry_run and dry.rows_rotated > 0 and dry.from_keys.keys() == {"k1"}
        done = rotate()
        assert done.rows_rotated == dry.rows_rotated
        assert sealed_under(inner, "t") == {(SEALED, "k2")}
        assert rotate().rows_rotated == 0
    finally:
        cp.close()
