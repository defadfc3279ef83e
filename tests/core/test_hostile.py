"""Hostile storage and odd ids (issue 16): rows altered behind the checkpointer's back never run
code nor hang a walk, and an id no backend can hold is refused before anything is written."""

from __future__ import annotations

import copy
import json
import random
import re
import string
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import ormsgpack
import pytest
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.serde.base import CipherProtocol
from langgraph.checkpoint.serde.encrypted import EncryptedSerializer
from langgraph.checkpoint.serde.jsonplus import JsonPlusSerializer

from langgraph_ckpt_ext import CorruptBlobError, InvalidConfigError
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.core.versions import version_key
from langgraph_ckpt_ext.timetravel import fork, replay
from tests.core.test_audit import Raw
from tests.support.common import conf
from tests.support.savers import SaverHandle, open_saver


def within(seconds: float, fn: Callable[[], Any]) -> Any:
    """`fn()`, failing the test if it has not returned after `seconds` (a hang is a failure,
    not a stuck suite: the thread is a daemon)."""
    out: dict[str, Any] = {}

    def run() -> None:
        try:
            out["value"] = fn()
        except BaseException as exc:
            out["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(seconds)
    assert not t.is_alive(), f"still running after {seconds} s: a walk that never ends"
    if "error" in out:
        raise out["error"]
    return out.get("value")


@pytest.fixture
def savers(backend: str, tmp_path: Path) -> Iterator[Callable[..., SaverHandle]]:
    """Checkpointers of this test's backend, with options; all closed and dropped after."""
    made: list[SaverHandle] = []

    def make(**options: Any) -> SaverHandle:
        made.append(open_saver(backend, tmp_path, **options))
        return made[-1]

    yield make
    for h in made:
        h.close()


def _checkpoint(cid: str, values: dict[str, Any], version: Any) -> Any:
    cp = empty_checkpoint()
    cp["id"] = cid
    cp["channel_values"] = values
    cp["channel_versions"] = dict.fromkeys(values, version)
    return cp


# -- item 2: whatever serializer is given, stored bytes construct no class outside the allowlist


class Marker:
    """Constructed only where stored bytes may construct any class: it leaves a file behind."""

    def __init__(self, path: str) -> None:
        Path(path).write_text("constructed")


class XorCipher(CipherProtocol):
    """A stand-in for AES (neither pycryptodome nor cryptography is installed here)."""

    def encrypt(self, plaintext: bytes) -> tuple[str, bytes]:
        return "xor", bytes(b ^ 0x5A for b in plaintext)

    def decrypt(self, ciphername: str, ciphertext: bytes) -> bytes:
        assert ciphername == "xor"
        return bytes(b ^ 0x5A for b in ciphertext)


def _msgpack_marker(path: Path) -> bytes:
    """What an attacker with write access to the store plants: a list holding LangGraph's
    "construct module.name(arg)" extension (code 0), naming `Marker`."""
    return ormsgpack.packb([ormsgpack.Ext(0, ormsgpack.packb([__name__, "Marker", str(path)]))])


def _json_marker(path: Path) -> bytes:
    """The same in LangGraph's older JSON format (an `lc: 2` constructor)."""
    return json.dumps({"lc": 2, "type": "constructor", "id": [*__name__.split("."), "Marker"],
                       "args": [str(path)]}).encode()


_XOR = XorCipher()
SERIALIZERS: dict[str, tuple[Callable[[], Any], Callable[[Path], tuple[str, bytes]]]] = {
    # LangGraph's default serializer (LANGGRAPH_STRICT_MSGPACK unset: any class)
    "jsonplus": (JsonPlusSerializer, lambda p: ("msgpack", _msgpack_marker(p))),
    # encrypted rows, for whoever holds the key too
    "encrypted": (lambda: EncryptedSerializer(_XOR),
                  lambda p: ("msgpack+xor", _XOR.encrypt(_msgpack_marker(p))[1])),
    # an EncryptedSerializer loads a row stored without encryption: no key needed to plant it
    "encrypted-plain-row": (lambda: EncryptedSerializer(_XOR),
                            lambda p: ("msgpack", _msgpack_marker(p))),
    "json-any-module": (lambda: JsonPlusSerializer(allowed_json_modules=True),
                        lambda p: ("json", _json_marker(p))),
}


@pytest.mark.parametrize("kind", list(SERIALIZERS))
def test_planted_class_is_not_constructed_whatever_serializer_is_given(
    savers: Callable[..., SaverHandle], backend: str, tmp_path: Path, kind: str
) -> None:
    make_serde, plant = SERIALIZERS[kind]
    for unsafe in (False, True):  # True: the control, showing what was planted does run
        marker = tmp_path / f"constructed-{unsafe}"
        h = savers(serde=make_serde(), unsafe_allow_any_class=unsafe)
        cp = h.saver
        thread = f"evil-{unsafe}"
        version = cp.get_next_version(None)
        stored = cp.put(conf(thread), _checkpoint("c1", {"v": {"a": 1}}, version), {},
                        {"v": version})
        raw = Raw(h)
        try:
            raw.set_blob(thread, "v", version_key(version), plant(marker))
        finally:
            raw.close()
        cp._log.forget(thread)  # read as a process that did not write the value would
        value = cp.get_tuple(stored).checkpoint["channel_values"]["v"]  # type: ignore[union-attr]
        built = [v for v in (value if isinstance(value, list) else [value])
                 if isinstance(v, Marker)]
        assert (bool(built), marker.exists()) == (unsafe, unsafe), kind


def _plant(h: SaverHandle, thread: str, payload: bytes) -> Any:
    """Store a checkpoint, replace its value's bytes by `payload`, and read it back as a
    process that did not write it would."""
    cp = h.saver
    version = cp.get_next_version(None)
    stored = cp.put(conf(thread), _checkpoint("c1", {"v": {"a": 1}}, version), {},
                    {"v": version})
    raw = Raw(h)
    try:
        raw.set_blob(thread, "v", version_key(version), ("msgpack", payload))
    finally:
        raw.close()
    cp._log.forget(thread)
    return cp.get_tuple(stored).checkpoint["channel_values"]["v"]  # type: ignore[union-attr]


def test_a_data_type_of_a_module_not_imported_is_never_imported(
    savers: Callable[..., SaverHandle], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The data types the application loaded come back as themselves, by default; a blob
    naming a module nobody imported does not import it (its import would run its code), and
    a class that is not a data type (`Marker`, `subprocess.Popen`) is never built."""
    import subprocess
    import sys

    from tests.support.typed_state import Point

    module = "lgx_planted_module"
    marker = tmp_path / "imported"
    (tmp_path / f"{module}.py").write_text(
        f"from pathlib import Path\nPath({str(marker)!r}).write_text('imported')\n"
        "import dataclasses\n@dataclasses.dataclass\nclass Point:\n    x: int\n    y: int\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    h = savers()

    def ext(mod: str, name: str, args: Any) -> bytes:
        return ormsgpack.packb([ormsgpack.Ext(2, ormsgpack.packb([mod, name, args]))])

    own = _plant(h, "own", ext(Point.__module__, "Point", {"x": 1, "y": 2}))
    assert own == [Point(1, 2)]
    far = _plant(h, "far", ext(module, "Point", {"x": 1, "y": 2}))
    assert far == [{"x": 1, "y": 2}] and not marker.exists() and module not in sys.modules
    popen = _plant(h, "popen", ormsgpack.packb([ormsgpack.Ext(1, ormsgpack.packb(
        ["subprocess", "Popen", [["touch", str(marker)]]]))]))
    assert not any(isinstance(v, subprocess.Popen) for v in popen) and not marker.exists()
    built = _plant(h, "marker", _msgpack_marker(marker))
    assert not any(isinstance(v, Marker) for v in built) and not marker.exists()


class _OwnFormat:
    """A serializer of another kind: this checkpointer cannot tell what it builds."""

    def dumps_typed(self, obj: Any) -> tuple[str, bytes]:
        return "own", json.dumps(obj).encode()

    def loads_typed(self, data: tuple[str, bytes]) -> Any:
        return json.loads(data[1])


REFUSED: dict[str, Callable[[], Any]] = {
    "pickle-fallback": lambda: JsonPlusSerializer(pickle_fallback=True),
    "other-kind": _OwnFormat,
    "encrypted-other-kind": lambda: EncryptedSerializer(_XOR, _OwnFormat()),  # type: ignore[arg-type]
}


@pytest.mark.parametrize("kind", list(REFUSED))
def test_serializer_that_cannot_be_made_strict_needs_the_opt_out(
    savers: Callable[..., SaverHandle], kind: str
) -> None:
    with pytest.raises(InvalidConfigError, match="unsafe_allow_any_class=True"):
        savers(serde=REFUSED[kind]())
    h = savers(serde=REFUSED[kind](), unsafe_allow_any_class=True)
    cp = h.saver
    stored = cp.put(conf("t"), _checkpoint("c1", {"v": [1, 2]}, 1), {}, {"v": 1})
    assert cp.get_tuple(stored).checkpoint["channel_values"]["v"] == [1, 2]  # type: ignore[union-attr]


def test_given_serializer_is_copied_not_changed() -> None:
    """The caller's serializer is left as it was; an explicit allowlist is kept, with ours."""
    from langgraph_ckpt_ext import InMemoryCheckpointer

    given = EncryptedSerializer(_XOR, JsonPlusSerializer(allowed_msgpack_modules=[(__name__, "P")]))
    cp = InMemoryCheckpointer(serde=given)
    inner = cp.serde.serde  # type: ignore[attr-defined]
    assert inner is not given.serde and given.serde._allowed_msgpack_modules == {(__name__, "P")}
    assert (__name__, "P") in inner._allowed_msgpack_modules
    assert ("langgraph_ckpt_ext.state", "PlanStep") in inner._allowed_msgpack_modules
    assert InMemoryCheckpointer(serde=cp.serde).serde is cp.serde  # strict already: as is


# -- item 6: a parent link pointing at a descendant ends every walk with an error


class _Tamper(Raw):
    def set_parent(self, thread: str, cid: str, parent: str) -> None:
        """Point a stored checkpoint's parent link elsewhere (namespace "")."""
        if self.backend == "memory":
            rows = self.cp._store.checkpoints[(thread, "")]  # type: ignore[attr-defined]
            rows[cid] = replace(rows[cid], parent_checkpoint_id=parent)
        elif self.backend.startswith("sqlite"):
            self._sqlite(lambda c: c.execute(
                "UPDATE lgx_checkpoints SET parent_checkpoint_id = ? WHERE thread_id = ? AND "
                "checkpoint_ns = '' AND checkpoint_id = ?", (parent, thread, cid)))
        elif self.backend == "postgres":
            self._pg(lambda c: c.execute(
                "UPDATE lgx_checkpoints SET parent_checkpoint_id = $1 WHERE thread_id = $2 AND "
                "checkpoint_ns = '' AND checkpoint_id = $3", parent, thread, cid))
        else:  # the row starts with `parent \0`
            client, keys = self._redis(thread)
            field = f"\0{cid}".encode()
            rest = client.hget(keys["cp"], field).split(b"\0", 1)[1]
            client.hset(keys["cp"], field, parent.encode() + b"\0" + rest)


def test_parent_cycle_ends_every_walk(savers: Callable[..., SaverHandle], backend: str) -> None:
    h = savers()
    cp = h.saver
    config: dict[str, Any] = conf("loop")
    cp.put(config, _checkpoint("c0", {"v": 0}, 1), {}, {"v": 1})  # a root of its own
    for i in (1, 2, 3):  # c1 <- c2 <- c3
        md = {"counters_since_delta_snapshot": {"ghost": i}} if i == 3 else {}
        config = cp.put(config if i > 1 else conf("loop"),
                        _checkpoint(f"c{i}", {"v": i}, i + 1), md, {"v": i + 1})  # type: ignore[arg-type]
    raw = _Tamper(h)
    try:
        raw.set_parent("loop", "c1", "c3")  # c1's parent is now its own descendant
    finally:
        raw.close()
    cycle = re.compile(r"cycle: c\d -> c\d -> c\d -> c\d")
    with pytest.raises(CorruptBlobError, match=cycle):
        within(20, lambda: cp.get_delta_channel_history(config=conf("loop", "c3"),
                                                        channels=["ghost"]))
    with pytest.raises(CorruptBlobError, match=cycle):
        within(20, lambda: fork(cp, conf("loop", "c3"), "forked"))
    assert cp.get_tuple(conf("forked")) is None  # nothing of the fork left behind
    with pytest.raises(CorruptBlobError, match=cycle):
        within(20, lambda: replay(cp, conf("loop", "c0"), conf("loop", "c3")))
    with pytest.raises(CorruptBlobError, match=cycle):
        within(20, lambda: cp.prune(["loop"]))  # keep_latest walks back for "ghost"
    # history lists rows in id order (no walk): all four, promptly
    assert [e.checkpoint_id for e in within(20, lambda: list(cp.history("loop")))] == [
        "c3", "c2", "c1", "c0"]


def test_absurdly_long_chain_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    from langgraph_ckpt_ext import InMemoryCheckpointer
    from langgraph_ckpt_ext.core import chain

    cp = InMemoryCheckpointer()
    config: Any = conf("long")
    for i in range(5):
        config = cp.put(config, _checkpoint(f"c{i}", {"v": i}, i + 1), {}, {"v": i + 1})
    monkeypatch.setattr(chain, "MAX_CHAIN", 3)
    with pytest.raises(CorruptBlobError, match="runs past 3 checkpoints"):
        fork(cp, config, "forked")


# -- items 8 and 9: one rule for ids, checked before any I/O


ODD = {
    "surrogate": "a\ud800b",
    "nul": "a\0b",
    "bytes": "é" * 257,  # 257 characters, 514 bytes
    "huge": "x" * (10 << 20),
}


def _snapshot(h: SaverHandle) -> Any:
    """Everything stored, read around the checkpointer."""
    backend, cp = h.backend, h.saver
    raw = Raw(h)
    try:
        if backend == "memory":
            s: Any = cp._store
            return copy.deepcopy([{k: v for k, v in d.items() if v}
                                  for d in (s.checkpoints, s.blobs, s.writes, s.migrations)])
        tables = ("lgx_checkpoints", "lgx_blobs", "lgx_writes")
        if backend.startswith("sqlite"):
            return raw._sqlite(lambda c: [sorted(c.execute(f"SELECT * FROM {t}").fetchall())
                                          for t in tables])

        if backend == "postgres":
            async def read(c: Any) -> Any:
                return [sorted(map(tuple, await c.fetch(f"SELECT * FROM {t}"))) for t in tables]

            return raw._pg(read)
        client = h.redis_client()
        try:
            keys = sorted(client.scan_iter(match=f"{h.prefix}:*"))
            return {k: client.dump(k) for k in keys}
        finally:
            client.close()
    finally:
        raw.close()


def _calls(cp: StoreCheckpointer, good: Any) -> Iterator[tuple[str, Callable[[str], Any]]]:
    """(field the error must name, a call with that field odd), for every entry point."""
    tid = good["configurable"]["thread_id"]
    cid = good["configurable"]["checkpoint_id"]

    def cfg(**over: Any) -> Any:
        return {"configurable": {"thread_id": tid, "checkpoint_ns": "", **over}}

    def put(config: Any, cp_id: str = "c9", channel: str = "v", md: Any = None) -> Any:
        return cp.put(config, _checkpoint(cp_id, {channel: 1}, 9), md or {}, {channel: 9})

    yield "thread_id", lambda odd: put(cfg(thread_id=odd))
    yield "checkpoint_ns", lambda odd: put(cfg(checkpoint_ns=odd))
    yield "checkpoint_id", lambda odd: put(cfg(checkpoint_id=odd))
    yield "checkpoint['id']", lambda odd: put(cfg(), cp_id=odd)
    yield "channel name", lambda odd: put(cfg(), channel=odd)
    yield "metadata run_id", lambda odd: put(cfg(), md={"run_id": odd})
    yield "thread_id", lambda odd: cp.put_writes(cfg(thread_id=odd, checkpoint_id=cid),
                                                [("v", 1)], "task")
    yield "checkpoint_id", lambda odd: cp.put_writes(cfg(checkpoint_id=odd), [("v", 1)], "task")
    yield "task_id", lambda odd: cp.put_writes(good, [("v", 1)], odd)
    yield "task_path", lambda odd: cp.put_writes(good, [("v", 1)], "task", odd)
    yield "channel name", lambda odd: cp.put_writes(good, [("v", 1), (odd, 2)], "task")
    yield "thread_id", lambda odd: cp.get_tuple(cfg(thread_id=odd))
    yield "checkpoint_ns", lambda odd: cp.get_tuple(cfg(checkpoint_ns=odd))
    yield "checkpoint_id", lambda odd: cp.get_tuple(cfg(checkpoint_id=odd))
    yield "thread_id", lambda odd: cp.list(cfg(thread_id=odd))
    yield "checkpoint_id", lambda odd: cp.list(cfg(), before=cfg(checkpoint_id=odd))
    yield "thread_id", lambda odd: cp.delete_thread(odd)
    yield "source_thread_id", lambda odd: cp.copy_thread(odd, "copy")
    yield "target_thread_id", lambda odd: cp.copy_thread(tid, odd)
    yield "thread_id", lambda odd: cp.prune([tid, odd])
    yield "run_id", lambda odd: cp.delete_for_runs(["run", odd])
    yield "thread_id", lambda odd: cp.get_delta_channel_history(config=cfg(thread_id=odd),
                                                                channels=["v"])
    yield "channel name", lambda odd: cp.get_delta_channel_history(config=good, channels=[odd])
    yield "new_thread_id", lambda odd: fork(cp, good, odd)
    yield "thread_id", lambda odd: list(cp.history(odd, metadata_only=True))
    yield "checkpoint_id", lambda odd: list(cp.history(tid, metadata_only=True, before=odd))


def test_odd_ids_are_refused_before_anything_is_written(
    savers: Callable[..., SaverHandle], backend: str
) -> None:
    h = savers()
    cp = h.saver
    good = cp.put(conf("good"), _checkpoint("c1", {"v": 1}, 1), {"run_id": "run"}, {"v": 1})
    cp.put_writes(good, [("v", 2)], "task")
    before = _snapshot(h)
    missed = []
    for name, odd in ODD.items():
        for field, call in _calls(cp, good):
            if name == "nul" and field == "metadata run_id":
                continue  # LangGraph drops NUL from metadata strings before a saver sees them
            try:
                call(odd)
            except InvalidConfigError as exc:
                if field not in str(exc):
                    missed.append((name, field, str(exc)[:200]))
            except Exception as exc:
                missed.append((name, field, repr(exc)[:200]))
            else:
                missed.append((name, field, "accepted"))
    assert not missed
    # item 9: an empty checkpoint id (the memory backend stored it, then failed reading it)
    with pytest.raises(InvalidConfigError, match=re.escape("checkpoint['id'] is empty")):
        cp.put(conf("good"), _checkpoint("", {"v": 3}, 3), {}, {"v": 3})
    assert _snapshot(h) == before
    assert cp.get_tuple(conf("good")).checkpoint["id"] == "c1"  # type: ignore[union-attr]


def test_ids_at_the_bound_are_stored_everywhere(savers: Callable[..., SaverHandle]) -> None:
    """Ids of exactly 512 UTF-8 bytes (random, so that no database compresses them), in every
    field of a pending write's key at once: under PostgreSQL's index entry limit."""
    from langgraph_ckpt_ext.core.config import MAX_ID_BYTES

    rng = random.Random(16)

    def longest() -> str:
        return "".join(rng.choices(string.ascii_letters + string.digits, k=MAX_ID_BYTES - 2)) + "é"

    h = savers()
    cp = h.saver
    tid, ns, cid, task, channel = (longest() for _ in range(5))
    config = {"configurable": {"thread_id": tid, "checkpoint_ns": ns}}
    stored = cp.put(config, _checkpoint(cid, {channel: 1}, 1), {}, {channel: 1})
    cp.put_writes(stored, [(channel, 2)], task)
    tup = cp.get_tuple(stored)
    assert tup is not None and tup.checkpoint["channel_values"] == {channel: 1}
    assert tup.pending_writes == [(task, channel, 2)]
    with pytest.raises(InvalidConfigError, match="at most 512"):
        cp.get_tuple({"configurable": {"thread_id": tid + "x"}})


def test_smart_checkpointer_refuses_odd_ids_when_given_not_at_flush() -> None:
    from langgraph_ckpt_ext import InMemoryCheckpointer, SmartCheckpointer

    smart = SmartCheckpointer(InMemoryCheckpointer())
    try:
        good = smart.put(conf("s"), _checkpoint("c1", {"v": 1}, 1), {}, {"v": 1})
        with pytest.raises(InvalidConfigError, match="channel name"):
            smart.put(conf("s"), _checkpoint("c2", {"a\0": 1}, 2), {}, {"a\0": 2})
        with pytest.raises(InvalidConfigError, match="task_id"):
            smart.put_writes(good, [("v", 1)], "a\ud800")
        smart.flush()
        assert smart.get_tuple(conf("s")).checkpoint["id"] == "c1"  # type: ignore[union-attr]
    finally:
        smart.close()


@pytest.mark.parametrize("field,odd", [("thread_id", "t\0"), ("checkpoint_ns", "a\ud800"),
                                       ("task_id", "x" * 600)])
def test_export_with_odd_ids_is_refused_before_importing(field: str, odd: str) -> None:
    """A JSON Lines file is checked whole before anything is written: ids included."""
    import io

    from langgraph_ckpt_ext import InMemoryCheckpointer
    from langgraph_ckpt_ext.transfer import MalformedExportError, export_threads, import_jsonl

    source = InMemoryCheckpointer()
    stored = source.put(conf("t"), _checkpoint("c1", {"v": 1}, 1), {}, {"v": 1})
    source.put_writes(stored, [("v", 2)], "task")
    buf = io.StringIO()
    export_threads(source, buf)
    lines = buf.getvalue().splitlines()
    line = json.loads(lines[1])
    if field == "task_id":
        line["writes"][0][0] = odd
    else:
        line[field] = odd
    lines[1] = json.dumps(line)
    target = InMemoryCheckpointer()
    with pytest.raises(MalformedExportError, match=f"line 2 of the export: {field}"):
        import_jsonl(io.StringIO("\n".join(lines) + "\n"), target)
    assert target.thread_ids() == []
