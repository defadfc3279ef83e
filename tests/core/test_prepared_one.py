"""`write_op` (a replicated write on the primary) stores one put or one `put_writes` as `put` /
`put_writes` store it: by the store's single-write methods, with the same one-writer check; it
gives back what `put` returns and the rows it stored, which another store takes as they are.
A prepared batch goes as one batch."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import Checkpoint, empty_checkpoint

from langgraph_ckpt_ext import ConcurrentWriteError
from tests.support.savers import SaverHandle, open_saver, params

BACKENDS = ["memory", "sqlite", "postgres", "redis"]


@pytest.fixture(params=params(BACKENDS))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path) as h:
        yield h


def checkpoint(n: int) -> Checkpoint:
    c = empty_checkpoint()
    c["id"] = str(uuid.UUID(int=n))
    c["channel_values"] = {"messages": [f"m{n}"]}
    c["channel_versions"] = {"messages": n}
    return c


def count_calls(store: Any, *names: str) -> dict[str, int]:
    """Count the calls of the store's write methods (the store itself still does them)."""
    calls = dict.fromkeys(names, 0)

    def counting(name: str, method: Callable[..., Any]) -> Callable[..., Any]:
        async def call(*args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return await method(*args, **kwargs)
        return call

    for name in names:
        setattr(store, name, counting(name, getattr(store, name)))
    return calls


ROOT = {"configurable": {"thread_id": "t", "checkpoint_ns": ""}}


def at(n: int) -> dict[str, Any]:
    """The config of checkpoint `n` of thread t."""
    return {"configurable": {**ROOT["configurable"], "checkpoint_id": str(uuid.UUID(int=n))}}


def write_one(cp: Any, op: tuple[Any, ...]) -> Any:
    config, rows = cp.write_op(op)
    return config, rows


def put_op(config: Any, n: int) -> tuple[Any, ...]:
    return ("put", config, checkpoint(n), {"source": "loop", "step": n}, {"messages": n})


def test_one_put_or_writes_goes_as_a_single_write(handle: SaverHandle) -> None:
    cp = handle.inner
    calls = count_calls(cp._store, "write_batch", "write_checkpoint", "write_writes")
    config, rows = write_one(cp, put_op(ROOT, 1))
    assert config["configurable"]["checkpoint_id"] == str(uuid.UUID(int=1))
    assert rows[0][0].checkpoint_id == str(uuid.UUID(int=1))
    assert config == cp.put(ROOT, checkpoint(1), {"source": "loop", "step": 1}, {"messages": 1})
    config, rows = write_one(cp, ("writes", at(1), [("messages", ["w"])], "task-1", ""))
    assert config is None and [w.task_id for w in rows[0]] == ["task-1"]
    write_one(cp, put_op(at(1), 2))
    assert calls == {"write_batch": 0, "write_checkpoint": 3, "write_writes": 1}

    got = cp.get_tuple(at(1))
    assert got is not None and got.checkpoint["channel_values"] == {"messages": ["m1"]}
    assert [(t, c, v) for t, c, v in got.pending_writes] == [("task-1", "messages", ["w"])]
    head = cp.get_tuple(ROOT)
    assert head is not None and head.checkpoint["id"] == str(uuid.UUID(int=2))

    cp.write_prepared([cp.prepare_batch([put_op(at(2), 3), put_op(at(3), 4)], portable=True)])
    assert calls["write_batch"] == 1  # several: one batch
    cp.write_prepared([cp.prepare_batch([put_op(at(4), 5)])])
    assert calls["write_batch"] == 2  # one (a SmartCheckpointer's flush): a batch too
    assert len(list(cp.list(ROOT))) == 5


def test_the_rows_given_back_make_an_equal_copy(handle: SaverHandle, tmp_path: Path) -> None:
    """What `write_op` gives back, written by another store (`write_rows`), reads back as the
    original does: append-deltas included (the second put appends to the first's list)."""
    cp = handle.inner
    items: list[Any] = []
    c2 = checkpoint(2)
    c2["channel_values"] = {"messages": ["m1", "m2"]}
    for op in (put_op(ROOT, 1), ("writes", at(1), [("messages", ["w"])], "task-1", ""),
               ("put", at(1), c2, {"source": "loop", "step": 2}, {"messages": 2})):
        items += write_one(cp, op)[1]
    with open_saver("sqlite", tmp_path / "copy") as other:
        other.inner.write_rows(items)
        for config in (at(1), ROOT):
            mine, theirs = cp.get_tuple(config), other.inner.get_tuple(config)
            assert mine is not None and theirs is not None
            assert mine.checkpoint == theirs.checkpoint
            assert mine.pending_writes == theirs.pending_writes
        assert other.inner.get_tuple(ROOT).checkpoint["channel_values"] == {
            "messages": ["m1", "m2"]}


def test_a_stale_single_put_is_refused_as_put_refuses_it(handle: SaverHandle) -> None:
    cp = handle.inner
    write_one(cp, put_op(ROOT, 1))
    write_one(cp, put_op(at(1), 2))
    with pytest.raises(ConcurrentWriteError):  # the head is 2: a put after 1 would fork
        write_one(cp, put_op(at(1), 3))
    assert [c.checkpoint["id"] for c in cp.list(ROOT)] == [
        str(uuid.UUID(int=2)), str(uuid.UUID(int=1))]
