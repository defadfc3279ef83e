"""Encryption at rest bound to each row, key rotation and compression, on every backend
(`core.sealing`, `core.sealedstore`, `core.rotation`, `Store.reseal`).

Tampering goes through `Store.reseal` on the raw store (the backend's own rows): a value stolen
from one row is put into another exactly as someone with write access to the database would.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext.core.errors import (
    DecompressionLimitError,
    DecryptionError,
    InvalidConfigError,
    PlaintextRefusedError,
    UnknownKeyError,
)
from langgraph_ckpt_ext.core.keys import CallbackKeys, EnvKeys, StaticKeys, encode_key, new_key
from langgraph_ckpt_ext.core.rows import ListQuery, Reseal
from langgraph_ckpt_ext.core.sealing import SEALED, Compression, Encryption, Sealer
from tests.support.graphs import chat_graph
from tests.support.savers import SaverHandle, open_saver, params

K1, K2, K3 = new_key(), new_key(), new_key()
SECRET = "sk-live-9d2e71-the-customer-said-this"


def enc(keys: dict[str, bytes] | None = None, **kw: Any) -> Encryption:
    return Encryption(StaticKeys(keys or {"k1": K1}), **kw)


@pytest.fixture(params=params(["memory", "sqlite", "postgres", "redis", "redis-cluster"]))
def handle(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[SaverHandle]:
    with open_saver(request.param, tmp_path, encryption=enc(), compression=True) as h:
        yield h


def reopen(handle: SaverHandle, **options: Any) -> Any:
    """Another checkpointer over the same storage (the in-memory one shares the rows)."""
    if handle.backend == "memory":
        from langgraph_ckpt_ext import InMemoryCheckpointer

        cp = InMemoryCheckpointer(**options)
        cp._raw_store.__dict__.update(
            {k: v for k, v in handle.inner._raw_store.__dict__.items() if not k.startswith("_")})
        return cp
    return handle.reopen(**options)


def config(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def chat(cp: Any, thread: str, turns: int = 3, text: str = "hello", **extra: Any) -> Any:
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"{text} {i}")]},
                     config(thread, **extra))
    return graph


def raw(cp: Any, thread: str) -> dict[str, Any]:
    """Every raw row of a thread (its only namespace ""): checkpoints newest first, blobs of
    every version the checkpoints read, writes by checkpoint id."""
    store = cp._raw_store

    async def collect() -> dict[str, Any]:
        rows = [r async for r in store.iter_checkpoints(ListQuery(thread_id=thread))]
        opening = getattr(cp._store, "open_row", lambda r, remember: r)
        keys = {(ch, v) for r in rows
                for ch, v in cp._versions_of(opening(r, remember=False)).items()}
        return {"checkpoints": rows,
                "blobs": await store.read_blobs(thread, "", keys),
                "writes": await store.read_writes(thread, "", [r.checkpoint_id for r in rows])}

    return cp.run_sync(collect())


def reseal(cp: Any, thread: str, *changes: Reseal) -> int:
    return cp.run_sync(cp._raw_store.reseal(thread, list(changes)))


def key_ids(cp: Any, thread: str) -> set[str]:
    """The key ids the thread's values are sealed under ("" for unencrypted ones)."""
    from langgraph_ckpt_ext.core.sealing import key_id_of as _key_id

    found = raw(cp, thread)
    typed = [t for r in found["checkpoints"] for t in (r.checkpoint, r.metadata)]
    typed += [(b.type, b.data) for b in found["blobs"].values()]
    typed += [(w.type, w.data) for ws in found["writes"].values() for w in ws]
    return {_key_id(t) for t in typed}


def state(cp: Any, thread: str) -> dict[str, Any]:
    return chat_graph().compile(checkpointer=cp).get_state(config(thread)).values


# -- the round trip --------------------------------------------------------------------------


def test_graph_round_trip_and_nothing_in_the_clear(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "t", turns=4, text=SECRET, api_key=SECRET)
    values = state(cp, "t")
    assert len(values["messages"]) == 8 and values["turns"] == 4
    assert SECRET in values["messages"][0].content
    history = list(chat_graph().compile(checkpointer=cp).get_state_history(config("t")))
    assert len(history) == 12
    found = raw(cp, "t")
    stored = [t for r in found["checkpoints"] for t in (r.checkpoint, r.metadata)]
    stored += [(b.type, b.data) for b in found["blobs"].values()]
    stored += [(w.type, w.data) for ws in found["writes"].values() for w in ws]
    assert stored and all(t[0] == SEALED for t in stored)
    assert not any(SECRET.encode() in bytes(t[1]) or b"hello" in bytes(t[1]) for t in stored)
    # a second process's view: a fresh checkpointer over the same storage reads the same
    other = reopen(handle, encryption=enc())
    try:
        assert state(other, "t") == values
    finally:
        if other is not cp and handle.backend != "memory":
            other.close()


def test_deltas_sealed_as_segments_still_merge(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "d", turns=6)
    found = raw(cp, "d")
    assert any(b.base_version is not None for b in found["blobs"].values()), "no append-delta"
    assert [m.content for m in state(cp, "d")["messages"]][-1] == "echo: hello 5"


def test_copy_and_fork_reseal_for_the_target(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "src", turns=2)
    cp.copy_thread("src", "dst")
    assert state(cp, "dst") == state(cp, "src")
    chat(cp, "dst", turns=1, text="more")
    assert len(state(cp, "dst")["messages"]) == 6


# -- values moved, altered, unencrypted --------------------------------------------------------


def _latest_blob(cp: Any, thread: str, channel: str = "messages") -> Any:
    tup = cp.get_tuple(config(thread))
    from langgraph_ckpt_ext.core.versions import version_key

    vkey = version_key(tup.checkpoint["channel_versions"][channel])
    return raw(cp, thread)["blobs"][(channel, vkey)]


def test_ciphertext_moved_to_another_version_is_refused(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "v", turns=3)
    target = _latest_blob(cp, "v")
    other = next(b for k, b in raw(cp, "v")["blobs"].items()
                 if k[0] == "messages" and k[1] != target.version)
    assert reseal(cp, "v", Reseal("blob", "", (target.channel, target.version),
                                  ((target.type, target.data),), ((other.type, other.data),))) == 1
    with pytest.raises(DecryptionError, match=rf"channel 'messages' at version "
                                              rf"'{target.version}'.* of thread 'v'"):
        cp.get_tuple(config("v"))


def test_ciphertext_moved_to_another_thread_is_refused(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "a", turns=2)
    cp.copy_thread("a", "b")  # same keys in both threads, sealed for each
    mine = _latest_blob(cp, "a")
    theirs = raw(cp, "b")["blobs"][(mine.channel, mine.version)]
    assert theirs.data != mine.data
    reseal(cp, "a", Reseal("blob", "", (mine.channel, mine.version),
                           ((mine.type, mine.data),), ((theirs.type, theirs.data),)))
    with pytest.raises(DecryptionError, match="of thread 'a'"):
        cp.get_tuple(config("a"))
    assert state(cp, "b")  # the source of the stolen value still reads


def test_metadata_and_writes_moved_between_rows_are_refused(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "m", turns=2)
    rows = raw(cp, "m")["checkpoints"]
    new, old = rows[0], rows[1]
    reseal(cp, "m", Reseal("checkpoint", "", (new.checkpoint_id,),
                           (new.checkpoint, new.metadata), (new.checkpoint, old.metadata)))
    with pytest.raises(DecryptionError, match=rf"metadata of checkpoint '{new.checkpoint_id}'"):
        list(cp.list(config("m")))
    # a record swapped for another checkpoint's
    reseal(cp, "m", Reseal("checkpoint", "", (new.checkpoint_id,),
                           (new.checkpoint, old.metadata), (old.checkpoint, new.metadata)))
    with pytest.raises(DecryptionError, match=rf"checkpoint '{new.checkpoint_id}'"):
        cp.get_tuple(config("m"))


def test_pending_write_moved_is_refused(handle: SaverHandle) -> None:
    cp = handle.inner
    graph = chat(cp, "w", turns=1)
    del graph
    writes = [w for ws in raw(cp, "w")["writes"].values() for w in ws]
    assert len(writes) >= 2
    a, b = writes[0], writes[1]
    reseal(cp, "w", Reseal("write", "", (a.checkpoint_id, a.task_id, str(a.idx)),
                           ((a.type, a.data),), ((b.type, b.data),)))
    with pytest.raises(DecryptionError, match=rf"task '{a.task_id}'"):
        list(cp.list(config("w")))


def test_plaintext_refused_unless_reading_it(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "p", turns=1)
    blob = _latest_blob(cp, "p")
    plain = ("msgpack", b"\x90")  # an empty list, unencrypted
    reseal(cp, "p", Reseal("blob", "", (blob.channel, blob.version),
                           ((blob.type, blob.data),), (plain,)))
    with pytest.raises(PlaintextRefusedError, match="stored unencrypted"):
        cp.get_tuple(config("p"))
    reader = reopen(handle, encryption=enc(plaintext="read"))
    try:
        # read as stored: the delta appends nothing to its base (or the whole list is empty)
        read = reader.get_tuple(config("p")).checkpoint["channel_values"]["messages"]
        assert len(read) == (1 if blob.base_version else 0)
    finally:
        if handle.backend != "memory":
            reader.close()


def test_wrong_and_unknown_keys_fail_clearly(handle: SaverHandle) -> None:
    chat(handle.inner, "k", turns=1)
    wrong = reopen(handle, encryption=enc({"k1": K2}))
    unknown = reopen(handle, encryption=enc({"k9": K2}))
    none = reopen(handle)
    try:
        with pytest.raises(DecryptionError, match="with key 'k1'"):
            wrong.get_tuple(config("k"))
        with pytest.raises(UnknownKeyError, match="key 'k1'"):
            unknown.get_tuple(config("k"))
        with pytest.raises(DecryptionError, match="is encrypted: open the checkpointer"):
            none.get_tuple(config("k"))
    finally:
        if handle.backend != "memory":
            for cp in (wrong, unknown, none):
                cp.close()


def test_compression_bomb_refused(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "z", turns=1)
    blob = _latest_blob(cp, "z")
    # a value sealed for this very row (by someone with the key) that inflates to 64 MiB
    bomber = Sealer(enc(), Compression(min_size=0, level=1))
    from langgraph_ckpt_ext.core.sealing import blob_identity

    bomb = bomber.seal(("bytes", bytes(64 << 20)), blob_identity(
        "z", "", blob.channel, blob.version, blob.base_version))
    assert len(bomb[1]) < 64 << 10
    reseal(cp, "z", Reseal("blob", "", (blob.channel, blob.version),
                           ((blob.type, blob.data),), (bomb,)))
    bounded = reopen(handle, encryption=enc(),
                     compression=Compression(max_value_bytes=1 << 20))
    try:
        with pytest.raises(DecompressionLimitError, match="past the bound of 1048576"):
            bounded.get_tuple(config("z"))
    finally:
        if handle.backend != "memory":
            bounded.close()


# -- rotation ------------------------------------------------------------------------------


def test_lazy_rotation_reseals_what_a_run_read(handle: SaverHandle) -> None:
    chat(handle.inner, "l", turns=2)
    assert key_ids(handle.inner, "l") == {"k1"}
    both = reopen(handle, encryption=enc({"k1": K1, "k2": K2}))
    try:
        chat(both, "l", turns=1)
        latest = cp_latest = both.get_tuple(config("l"))
        del cp_latest
        assert latest is not None
        found = raw(both, "l")
        from langgraph_ckpt_ext.core.sealing import key_id_of as _key_id

        newest = found["checkpoints"][0]
        assert _key_id(newest.metadata) == "k2"
        # the parent, read by the run, was sealed again under k2
        parent = found["checkpoints"][1]
        assert _key_id(parent.checkpoint) == "k2"
        assert "k1" in key_ids(both, "l")  # older ones wait for rotate_keys
    finally:
        if handle.backend != "memory":
            both.close()


def test_rotate_keys_resumes_after_a_kill(handle: SaverHandle) -> None:
    for t in range(5):
        chat(handle.inner, f"r{t}", turns=2)
    before = {f"r{t}": state(handle.inner, f"r{t}") for t in range(5)}
    both = reopen(handle, encryption=enc({"k1": K1, "k2": K2}))
    try:
        dry = both.rotate_keys(dry_run=True)
        assert dry.rows_rotated == dry.rows_seen > 0 and dry.from_keys == {"k1": dry.rows_seen}
        assert all(key_ids(both, f"r{t}") == {"k1"} for t in range(5))

        def killer(p: Any) -> None:
            if p.threads_done >= 2:  # 40% of 5 threads
                raise KeyboardInterrupt

        with pytest.raises(KeyboardInterrupt):
            both.rotate_keys(progress=killer, concurrency=1)
        with pytest.raises(KeyboardInterrupt):  # stopped from one of several workers
            both.rotate_keys(dry_run=True, progress=killer, concurrency=3)
        mixed = [key_ids(both, f"r{t}") for t in range(5)]
        assert mixed.count({"k2"}) == 2 and mixed.count({"k1"}) == 3
        report = both.rotate_keys()
        assert report.rows_current > 0 and report.rows_rotated > 0
        assert report.rows_current + report.rows_rotated == dry.rows_seen
        assert not report.unreadable
    finally:
        if handle.backend != "memory":
            both.close()
    only_new = reopen(handle, encryption=enc({"k2": K2}))
    try:
        assert {f"r{t}": state(only_new, f"r{t}") for t in range(5)} == before
    finally:
        if handle.backend != "memory":
            only_new.close()


def test_encrypting_a_plaintext_store_in_place(handle: SaverHandle) -> None:
    plain = reopen(handle)
    try:
        chat(plain, "e", turns=2)
        before = state(plain, "e")
        assert key_ids(plain, "e") == {""}
    finally:
        if handle.backend != "memory":
            plain.close()
    with pytest.raises(PlaintextRefusedError):
        state(handle.inner, "e")
    migrating = reopen(handle, encryption=enc(plaintext="read"))
    try:
        assert state(migrating, "e") == before
        report = migrating.rotate_keys()
        assert report.from_keys.get("") == report.rows_rotated > 0
    finally:
        if handle.backend != "memory":
            migrating.close()
    assert key_ids(handle.inner, "e") == {"k1"}
    assert state(handle.inner, "e") == before


def test_rotation_beside_a_live_writer(handle: SaverHandle) -> None:
    for t in range(3):
        chat(handle.inner, f"live{t}", turns=1)
    both = reopen(handle, encryption=enc({"k1": K1, "k2": K2}))
    errors: list[BaseException] = []

    def write() -> None:
        try:
            chat(both, "live0", turns=6, text="during")
        except BaseException as exc:
            errors.append(exc)

    try:
        writer = threading.Thread(target=write)
        writer.start()
        for _ in range(3):
            both.rotate_keys(concurrency=1)
        writer.join()
        assert not errors
        both.rotate_keys()
        assert all(key_ids(both, f"live{t}") == {"k2"} for t in range(3))
        assert state(both, "live0")["turns"] == 7
    finally:
        if handle.backend != "memory":
            both.close()


def test_reseal_is_compare_and_swap(handle: SaverHandle) -> None:
    cp = handle.inner
    chat(cp, "c", turns=1)
    blob = _latest_blob(cp, "c")
    wrong = Reseal("blob", "", (blob.channel, blob.version), (("x", b"not it"),),
                   ((blob.type, blob.data),))
    missing = Reseal("blob", "", (blob.channel, "no-such-version"), ((blob.type, blob.data),),
                     ((blob.type, blob.data),))
    assert reseal(cp, "c", wrong, missing) == 0
    gen = cp.run_sync(cp._raw_store.thread_state("c")).generation
    row = raw(cp, "c")["checkpoints"][0]
    same = Reseal("checkpoint", "", (row.checkpoint_id,), (row.checkpoint, row.metadata),
                  (row.checkpoint, row.metadata))
    assert reseal(cp, "c", same) == 1
    assert cp.run_sync(cp._raw_store.thread_state("c")).generation == gen  # no activity


# -- keys and tenants ----------------------------------------------------------------------------


def test_tenant_keys(handle: SaverHandle) -> None:
    keys = StaticKeys({"k1": K1, "acme": K2, "globex": K3}, tenants={"acme": "acme",
                                                                     "globex": "globex"})
    cp = reopen(handle, encryption=Encryption(keys, tenant="tenant_id"))
    try:
        chat(cp, "ta", turns=1, tenant_id="acme")
        chat(cp, "tg", turns=1, tenant_id="globex")
        assert key_ids(cp, "ta") == {"acme"} and key_ids(cp, "tg") == {"globex"}
    finally:
        if handle.backend != "memory":
            cp.close()
    acme_only = reopen(handle, encryption=Encryption(StaticKeys({"acme": K2})))
    try:
        assert state(acme_only, "ta")["turns"] == 1
        with pytest.raises(UnknownKeyError, match="'globex'"):
            state(acme_only, "tg")
    finally:
        if handle.backend != "memory":
            acme_only.close()


def test_key_providers() -> None:
    env = {"LGCKPT_KEYS": f"old:{encode_key(K1)}, new:{encode_key(K2)}"}
    keys = EnvKeys(environ=env)
    assert keys.current(None) == "new" and keys.key("old") == K1
    assert EnvKeys(environ={**env, "LGCKPT_KEY_CURRENT": "old"}).current("x") == "old"
    with pytest.raises(InvalidConfigError, match="LGCKPT_KEYS"):
        EnvKeys(environ={})
    with pytest.raises(InvalidConfigError, match="32 bytes"):
        StaticKeys({"short": b"123"})
    with pytest.raises(UnknownKeyError, match="'nope'"):
        keys.key("nope")
    assert "K1" not in repr(keys) and encode_key(K1) not in repr(keys)
    calls: list[str] = []

    def fetch(kid: str) -> bytes:
        calls.append(kid)
        return {"a": K1}[kid]

    cb = CallbackKeys(fetch, "a")
    assert cb.key("a") == K1 and cb.key("a") == K1 and calls == ["a"]
    with pytest.raises(UnknownKeyError):
        cb.key("b")
    with pytest.raises(InvalidConfigError, match="plaintext"):
        Encryption(keys, plaintext="maybe")
    with pytest.raises(InvalidConfigError, match="algorithm"):
        Encryption(keys, algorithm="rot13")


def test_chacha_and_compression_only(tmp_path: Path) -> None:
    from langgraph_ckpt_ext import InMemoryCheckpointer

    cp = InMemoryCheckpointer(encryption=enc(algorithm="chacha20-poly1305"))
    chat(cp, "c", turns=2)
    assert state(cp, "c")["turns"] == 2
    small = InMemoryCheckpointer(compression=Compression(min_size=64))
    chat(small, "s", turns=2, text="x" * 4000)
    blobs = raw(small, "s")["blobs"]
    assert any(b.type == SEALED for b in blobs.values())
    assert sum(len(b.data) for b in blobs.values()) < 4000
    assert state(small, "s")["turns"] == 2
    # a compressed row decompresses without compression configured, bound by the default
    reader = InMemoryCheckpointer()
    reader._raw_store.__dict__.update(
        {k: v for k, v in small._raw_store.__dict__.items() if not k.startswith("_")})
    assert state(reader, "s")["turns"] == 2
    assert zstandard  # the extra is installed for the tests


def test_mangled_envelopes_fail_as_corrupt_rows_only() -> None:
    """Any change to a sealed value (each byte flipped, truncated at every length, random
    bytes) is refused as a corrupt row naming it, never another exception or a wrong value."""
    import random

    from langgraph_ckpt_ext.core.errors import CorruptBlobError
    from langgraph_ckpt_ext.core.sealing import blob_identity

    ident = blob_identity("t", "", "messages", "3", "2")
    rng = random.Random(7)
    for compression in (None, Compression(min_size=0)):
        sealer = Sealer(enc(), compression)
        typed = sealer.seal(("msgpack", b"\x92\xa1a\xa1b" * 50), ident)
        assert sealer.open(typed, ident).typed == ("msgpack", b"\x92\xa1a\xa1b" * 50)
        data = typed[1]
        mangled = [data[:n] for n in range(len(data))]
        mangled += [data[:i] + bytes((data[i] ^ 0x41,)) + data[i + 1:] for i in range(len(data))]
        mangled += [bytes(rng.randrange(256) for _ in range(rng.randrange(80))) for _ in range(300)]
        mangled += [b"LGX\x01" + bytes(rng.randrange(256) for _ in range(40)) for _ in range(300)]
        for bad in mangled:
            with pytest.raises(CorruptBlobError, match="messages"):
                sealer.open((SEALED, bad), ident)
    plain = Sealer(None, Compression(min_size=0))
    squeezed = plain.seal(("msgpack", b"\x90" * 4000), ident)
    for n in range(len(squeezed[1])):
        # unencrypted, nothing is authenticated: a cut is refused, or (inside the frame's
        # trailing checksum) reads the exact value
        try:
            got = plain.open((SEALED, squeezed[1][:n]), ident).typed
        except CorruptBlobError:
            continue
        assert got == ("msgpack", b"\x90" * 4000) and n >= len(squeezed[1]) - 4
