"""Redis only: encryption at rest as Redis itself holds the values, on a standalone server and
on a Redis Cluster. What a person with access to the server sees (`DUMP`, `HGETALL`), a
rotation killed for real (SIGKILL) at 40% and resumed, a value tampered with by plain Redis
commands, and `Store.reseal` (the RESEAL script) leaving every key's TTL as it was.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import RedisCheckpointer
from langgraph_ckpt_ext.core.errors import DecryptionError
from langgraph_ckpt_ext.core.keys import EnvKeys, StaticKeys, encode_key, new_key
from langgraph_ckpt_ext.core.rows import ListQuery, Reseal, WriteRow
from langgraph_ckpt_ext.core.sealing import Encryption
from langgraph_ckpt_ext.core.sealing import key_id_of as _key_id
from langgraph_ckpt_ext.core.versions import version_key
from tests.support.graphs import chat_graph
from tests.support.savers import SaverHandle, open_saver, params

pytestmark = pytest.mark.redis

ROOT = Path(__file__).resolve().parents[2]
K1, K2 = new_key(), new_key()
SECRET = "sk-live-7Q2wZp-the-customer-told-us"
API_KEY = "ak-prod-Xv93Lm-passed-in-config"


def enc(keys: dict[str, bytes] | None = None) -> Encryption:
    return Encryption(StaticKeys(keys or {"k1": K1}))


@pytest.fixture(params=params(["redis", "redis-cluster"]))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    # redact_metadata off: encryption alone must keep the config's api_key unreadable
    with open_saver(request.param, tmp_path, encryption=enc(), compression=True,
                    redact_metadata=False) as h:
        yield h


def config(thread: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread, **extra}}


def chat(cp: Any, thread: str, turns: int = 2, text: str = "hello", **extra: Any) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"{text} {i}")]}, config(thread, **extra))


def state(cp: Any, thread: str) -> dict[str, Any]:
    return chat_graph().compile(checkpointer=cp).get_state(config(thread)).values


def prefix_keys(client: Any, prefix: str) -> list[bytes]:
    return sorted(client.scan_iter(match=f"{prefix}:*", count=1000))


def raw_bytes(client: Any, prefix: str) -> bytes:
    """Everything the server holds under `prefix`, as one byte string: each key's name, its
    `DUMP` (the server's own serialization), and its contents read plainly (DUMP may
    LZF-compress a value, so the plain read is what settles a match)."""
    out = []
    for key in prefix_keys(client, prefix):
        out += [key, client.dump(key) or b""]
        kind = client.type(key)
        if kind == b"string":
            out.append(client.get(key) or b"")
        elif kind == b"hash":
            out += [p for kv in client.hgetall(key).items() for p in kv]
        elif kind == b"zset":
            out += client.zrange(key, 0, -1)
        elif kind == b"list":
            out += client.lrange(key, 0, -1)
        else:
            raise AssertionError(f"unexpected key type {kind!r} of {key!r}")
    return b"\0".join(out)


def key_ids(cp: Any, thread: str) -> set[str]:
    """The key ids a thread's stored values are sealed under ("" for unencrypted ones)."""
    store: Any = cp._raw_store

    async def collect() -> set[str]:
        typed = [t for r in [r async for r in store.iter_checkpoints(ListQuery(thread_id=thread))]
                 for t in (r.checkpoint, r.metadata)]
        _, blobs, writes = await store._call("DUMP", store.keys(thread), [])
        found = {_key_id(t) for t in typed}
        found |= {_key_id(b) for b in _typed_blobs(blobs[1::2])}
        found |= {_key_id(w) for w in _typed_writes(writes[1::2])}
        return found

    found: set[str] = cp.run_sync(collect())
    return found


def _typed_blobs(values: list[bytes]) -> list[tuple[str, bytes]]:
    out = []
    for v in values:
        _, type_, data = v.split(b"\0", 2)
        out.append((type_.decode(), data))
    return out


def _typed_writes(values: list[bytes]) -> list[tuple[str, bytes]]:
    import ormsgpack

    return [(t, d) for _, t, d, _ in (ormsgpack.unpackb(v) for v in values)]


# -- nothing in the clear ---------------------------------------------------------------------


def test_secret_never_in_the_raw_storage(handle: SaverHandle) -> None:
    client = handle.redis_client()
    chat(handle.inner, "sealed", turns=3, text=SECRET, api_key=API_KEY)
    assert SECRET in state(handle.inner, "sealed")["messages"][0].content
    sealed = raw_bytes(client, handle.prefix or "")
    assert b"sealed" in sealed  # the dump holds the thread (its keys, its index entry)
    assert SECRET.encode() not in sealed and API_KEY.encode() not in sealed
    assert b"hello" not in sealed and b"customer" not in sealed
    # the same run through a plain checkpointer, under a prefix of its own: the secrets are
    # there in the clear (so the check above can fail)
    plain_prefix = f"{handle.prefix}-plain"
    plain = RedisCheckpointer(handle.url or "", key_prefix=plain_prefix, redact_metadata=False)
    try:
        chat(plain, "plain", turns=3, text=SECRET, api_key=API_KEY)
        clear = raw_bytes(client, plain_prefix)
        assert SECRET.encode() in clear and API_KEY.encode() in clear
    finally:
        plain.close()
        client.delete(*prefix_keys(client, plain_prefix))


# -- rotation killed for real -----------------------------------------------------------------

# The rotating process: keys from LGCKPT_KEYS (EnvKeys: the last listed is current). After each
# thread it prints its progress and waits for a line on stdin, so that the parent kills it at a
# point it chose (no timing involved).
_ROTATOR = """
import sys
from langgraph_ckpt_ext import RedisCheckpointer
from langgraph_ckpt_ext.core.keys import EnvKeys
from langgraph_ckpt_ext.core.sealing import Encryption

url, prefix = sys.argv[1], sys.argv[2]
cp = RedisCheckpointer(url, key_prefix=prefix, encryption=Encryption(EnvKeys()))

def progress(p):
    print(f"{p.threads_done} {p.threads_total} {p.rows_rotated}", flush=True)
    sys.stdin.readline()

cp.rotate_keys(progress=progress, concurrency=1)
print("finished", flush=True)
"""


def test_rotation_killed_at_40_percent_resumes(handle: SaverHandle) -> None:
    threads = [f"r{i}" for i in range(5)]
    for t in threads:
        chat(handle.inner, t, turns=2)
    before = {t: state(handle.inner, t) for t in threads}
    env = {**os.environ, "LGCKPT_KEYS": f"k1:{encode_key(K1)},k2:{encode_key(K2)}",
           "PYTHONPATH": str(ROOT)}
    env.pop("LGCKPT_KEY_CURRENT", None)
    child = subprocess.Popen(
        [sys.executable, "-c", _ROTATOR, handle.url or "", handle.prefix or ""],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env,
        cwd=ROOT, text=True)
    assert child.stdin is not None and child.stdout is not None
    seen = []
    try:
        for line in child.stdout:
            done, total, _ = map(int, line.split())
            seen.append(done)
            if done / total >= 0.4:
                os.kill(child.pid, signal.SIGKILL)
                break
            child.stdin.write("go\n")
            child.stdin.flush()
    finally:
        if child.poll() is None:
            child.kill()
        returncode = child.wait(timeout=60)
        stderr = child.stderr.read() if child.stderr else ""
    assert seen == [1, 2], stderr
    assert returncode == -signal.SIGKILL, stderr
    mixed = sorted(key_ids(handle.inner, t) == {"k2"} for t in threads)
    assert mixed == [False, False, False, True, True]  # two threads done, none half-done

    both: Any = handle.reopen(encryption=Encryption(EnvKeys(environ=env)), redact_metadata=False)
    try:
        report = both.rotate_keys()
        assert report.rows_current > 0 and report.rows_rotated > 0
        assert not report.unreadable and report.rows_changed_meanwhile == 0
        assert all(key_ids(both, t) == {"k2"} for t in threads)
        assert {t: state(both, t) for t in threads} == before
    finally:
        both.close()
    only_new: Any = handle.reopen(encryption=enc({"k2": K2}))
    try:
        assert {t: state(only_new, t) for t in threads} == before
    finally:
        only_new.close()


# -- tampering with Redis commands; TTLs through a reseal --------------------------------------


def test_value_tampered_with_redis_commands_is_refused(handle: SaverHandle) -> None:
    cp: Any = handle.inner
    client = handle.redis_client()
    chat(cp, "t", turns=3)
    versions = cp.get_tuple(config("t")).checkpoint["channel_versions"]
    latest = version_key(versions["messages"])
    bl = cp.store.keys("t")[3]
    fields = [f for f in client.hkeys(bl) if f.startswith(b"\0messages\0")]
    target = b"\0messages\0" + latest.encode()
    other = next(f for f in fields if f != target)
    client.hset(bl, target, client.hget(bl, other))  # another version's stored bytes
    with pytest.raises(DecryptionError, match=rf"channel 'messages' at version '{latest}'"
                                              r".* of thread 't'"):
        cp.get_tuple(config("t"))
    # a pending write given another write's bytes
    chat(cp, "w", turns=1)
    wr = cp.store.keys("w")[4]
    a, b = sorted(client.hkeys(wr))[:2]
    client.hset(wr, a, client.hget(wr, b))
    task = a.split(b"\0")[2].decode()
    with pytest.raises(DecryptionError, match=rf"task '{task}'.* of thread 'w'"):
        list(cp.list(config("w")))


def test_reseal_keeps_every_ttl(handle: SaverHandle) -> None:
    client = handle.redis_client()
    cp: Any = handle.reopen(encryption=enc(), compression=True, ttl=3600)
    try:
        chat(cp, "x", turns=2)
        keys = [k for k in cp.store.keys("x") if client.exists(k)]
        deadlines = {k: client.pexpiretime(k) for k in keys}
        assert all(d > 0 for d in deadlines.values())
        meta = client.hgetall(cp.store.keys("x")[6])
        before = state(cp, "x")
    finally:
        cp.close()
    rotating: Any = handle.reopen(encryption=enc({"k1": K1, "k2": K2}), ttl=3600)
    try:
        report = rotating.rotate_keys()
        assert report.rows_rotated > 0 and key_ids(rotating, "x") == {"k2"}
        # the same absolute deadline on every key, and no activity in the lifecycle row
        assert {k: client.pexpiretime(k) for k in keys} == deadlines
        assert client.hgetall(rotating.store.keys("x")[6]) == meta
        assert state(rotating, "x") == before
    finally:
        rotating.close()


def test_reseal_of_writes_keeps_channel_and_task_path(handle: SaverHandle) -> None:
    """RESEAL finds a write's type and data after its channel in the packed msgpack: channel
    names of every msgpack string size (fixstr, str8, str16), a negative idx, in a namespace."""
    store: Any = handle.inner._raw_store
    channels = ["c", "x" * 40, "y" * 300]
    rows = [WriteRow("wr", "sub:1", "cid", "task", i - 1, ch, "bytes", b"old-%d" % i, f"~p{i}")
            for i, ch in enumerate(channels)]
    handle.inner.run_sync(store.write_writes(rows))
    changes = [Reseal("write", "sub:1", ("cid", "task", str(r.idx)), ((r.type, r.data),),
                      (("msgpack", b"new-" + r.data),)) for r in rows]
    wrong = Reseal("write", "sub:1", ("cid", "task", "0"), (("bytes", b"old-0"),),
                   (("bytes", b"not applied"),))  # holds old-1
    assert handle.inner.run_sync(store.reseal("wr", [*changes, wrong])) == 3
    found = handle.inner.run_sync(store.read_writes("wr", "sub:1", ["cid"]))["cid"]
    assert [(w.idx, w.channel, w.type, w.data, w.task_path) for w in found] == [
        (r.idx, r.channel, "msgpack", b"new-" + r.data, r.task_path) for r in rows]
