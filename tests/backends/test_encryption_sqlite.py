"""Encryption at rest on SQLite, seen from the file itself: a secret never reaches the file's
bytes (nor its WAL), a key rotation SIGKILLed by the test at 40% of the threads resumes, and a
value swapped between rows with the sqlite3 module is refused by name.

The shared behaviour over every backend is in tests/core/test_encryption.py.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import SQLiteCheckpointer
from langgraph_ckpt_ext.core.errors import DecryptionError
from langgraph_ckpt_ext.core.keys import StaticKeys, encode_key, new_key
from langgraph_ckpt_ext.core.sealing import Encryption
from langgraph_ckpt_ext.core.sealing import key_id_of as _key_id
from langgraph_ckpt_ext.core.versions import version_key
from tests.support.graphs import chat_graph

ROOT = Path(__file__).resolve().parents[2]
K1, K2 = new_key(), new_key()
SAID = "card 4111-1111-1111-1111, the customer said"
API_KEY = "sk-live-7f3a90c2-never-on-disk"


def config(thread: str, **extra: Any) -> Any:
    return {"configurable": {"thread_id": thread, **extra}}


def chat(cp: SQLiteCheckpointer, thread: str, turns: int, text: str = "hi", **extra: Any) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"{text} {i}")]}, config(thread, **extra))


def state(cp: SQLiteCheckpointer, thread: str) -> dict[str, Any]:
    return chat_graph().compile(checkpointer=cp).get_state(config(thread)).values


def sealed(path: Path, *keys: tuple[str, bytes], **options: Any) -> SQLiteCheckpointer:
    """A checkpointer over `path` encrypting with `keys` (the last one current)."""
    return SQLiteCheckpointer(path, encryption=Encryption(StaticKeys(dict(keys))), **options)


@pytest.fixture
def opened() -> Iterator[list[SQLiteCheckpointer]]:
    """Checkpointers a test opens, closed after it (also when it fails)."""
    cps: list[SQLiteCheckpointer] = []
    yield cps
    for cp in cps:
        cp.close()


def file_bytes(path: Path) -> bytes:
    """The database file, its WAL and its shared-memory index, as they are on disk now."""
    return b"".join(Path(f"{path}{tail}").read_bytes()
                    for tail in ("", "-wal", "-shm") if Path(f"{path}{tail}").exists())


def wal_checkpoint(path: Path) -> None:
    """Copy the WAL's pages into the database file (and empty the WAL), as SQLite does on
    its own from time to time."""
    conn = sqlite3.connect(path)
    try:
        busy, _, _ = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        assert busy == 0
    finally:
        conn.close()


def key_ids(path: Path, thread: str) -> set[str]:
    """The key ids the thread's rows are sealed under ("" for unencrypted ones), read from
    the file with the sqlite3 module."""
    conn = sqlite3.connect(path)
    try:
        typed = conn.execute(
            "SELECT type, checkpoint FROM lgx_checkpoints WHERE thread_id = ?1 UNION ALL "
            "SELECT metadata_type, metadata FROM lgx_checkpoints WHERE thread_id = ?1 UNION ALL "
            "SELECT type, data FROM lgx_blobs WHERE thread_id = ?1 UNION ALL "
            "SELECT type, data FROM lgx_writes WHERE thread_id = ?1", (thread,)).fetchall()
    finally:
        conn.close()
    return {_key_id((t, d)) for t, d in typed}


# -- nothing in the clear ------------------------------------------------------------------------


@pytest.mark.parametrize("encrypted", [True, False], ids=["sealed", "plain"])
def test_secrets_never_reach_the_file(tmp_path: Path, encrypted: bool,
                                      opened: list[SQLiteCheckpointer]) -> None:
    """Sealed: neither the message nor the config's api_key is in the file's bytes, before or
    after the WAL is checkpointed into the file. Plain: both are, so the grep finds what it
    looks for. Redaction is off: what keeps the api_key out is the encryption alone."""
    path = tmp_path / "agent.db"
    options: dict[str, Any] = {"redact_metadata": False}
    if encrypted:
        cp = sealed(path, ("k1", K1), compression=True, **options)
    else:
        cp = SQLiteCheckpointer(path, **options)
    opened.append(cp)
    chat(cp, "t", turns=3, text=SAID, api_key=API_KEY)
    assert SAID in state(cp, "t")["messages"][0].content
    secrets = [SAID.encode(), API_KEY.encode()]
    in_wal = file_bytes(path)
    wal_checkpoint(path)
    in_file = file_bytes(path)
    for found in (in_wal, in_file):
        assert [s in found for s in secrets] == [not encrypted] * 2
    if encrypted:
        assert key_ids(path, "t") == {"k1"}


# -- rotation SIGKILLed at 40% -------------------------------------------------------------------

# Rotates the file (argv[1]) under $LGCKPT_KEYS, printing "done total" after each thread, then
# waiting for the parent's go-ahead: the parent decides when the process dies.
ROTATOR = """
import sys
from langgraph_ckpt_ext import SQLiteCheckpointer
from langgraph_ckpt_ext.core.keys import EnvKeys
from langgraph_ckpt_ext.core.sealing import Encryption

def progress(p):
    print(p.threads_done, p.threads_total, flush=True)
    sys.stdin.readline()

cp = SQLiteCheckpointer(sys.argv[1], encryption=Encryption(EnvKeys()), compression=True)
cp.rotate_keys(progress=progress)
print("finished", flush=True)
"""


def test_rotation_sigkilled_at_40_percent_resumes(tmp_path: Path,
                                                  opened: list[SQLiteCheckpointer]) -> None:
    path = tmp_path / "agent.db"
    threads = [f"r{i}" for i in range(10)]
    old = sealed(path, ("k1", K1), compression=True)
    opened.append(old)
    for i, tid in enumerate(threads):
        chat(old, tid, turns=2 + i % 3)
    before = {tid: state(old, tid) for tid in threads}

    env = {**os.environ, "LGCKPT_KEYS": f"k1:{encode_key(K1)},k2:{encode_key(K2)}"}
    proc = subprocess.Popen([sys.executable, "-c", ROTATOR, str(path)], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    try:
        while True:
            line = proc.stdout.readline()
            assert line, f"the rotation ended early: {proc.communicate()[1]}"
            done, total = map(int, line.split())
            assert total == len(threads)
            if done * 10 >= total * 4:
                break
            proc.stdin.write("go\n")
            proc.stdin.flush()
        proc.send_signal(signal.SIGKILL)  # a real kill, between two threads' rewrites
        assert proc.wait(timeout=60) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()

    keys = {tid: key_ids(path, tid) for tid in threads}
    assert sum(k == {"k2"} for k in keys.values()) >= 4, keys  # the done part
    assert sum("k1" in k for k in keys.values()) >= 1, keys  # and some left to do

    both = sealed(path, ("k1", K1), ("k2", K2), compression=True)
    opened.append(both)
    report = both.rotate_keys()
    assert report.rows_current > 0 and report.rows_rotated > 0, report.summary()
    assert report.rows_current + report.rows_rotated == report.rows_seen
    assert not report.unreadable and report.rows_changed_meanwhile == 0
    assert report.from_keys == {"k1": report.rows_rotated}
    assert all(key_ids(path, tid) == {"k2"} for tid in threads)

    only_new = sealed(path, ("k2", K2))
    opened.append(only_new)
    assert {tid: state(only_new, tid) for tid in threads} == before


# -- a row tampered with in SQL --------------------------------------------------------------------

STEAL_BLOB = """
UPDATE lgx_blobs SET data = (
    SELECT data FROM lgx_blobs
    WHERE thread_id = ? AND checkpoint_ns = '' AND channel = 'messages' AND version = ?)
WHERE thread_id = ? AND checkpoint_ns = '' AND channel = 'messages' AND version = ?"""


def _tamper(path: Path, params: tuple[str, str, str, str]) -> None:
    conn = sqlite3.connect(path)
    try:
        with conn:
            assert conn.execute(STEAL_BLOB, params).rowcount == 1
    finally:
        conn.close()


@pytest.mark.parametrize("source", ["older-version", "other-thread"])
def test_blob_swapped_in_sql_is_refused(tmp_path: Path, source: str,
                                        opened: list[SQLiteCheckpointer]) -> None:
    """The newest `messages` value of thread "a" overwritten with another row's ciphertext:
    an older version of the same thread, or the same version of a copy of the thread (the
    same key, sealed for its own thread). Every read of the checkpoint is refused, naming the
    row; the copy still reads."""
    path = tmp_path / "agent.db"
    cp = sealed(path, ("k1", K1), compression=True)
    opened.append(cp)
    chat(cp, "a", turns=3)
    cp.copy_thread("a", "b")
    newest = cp.get_tuple(config("a"))
    assert newest is not None and newest.parent_config is not None
    parent = cp.get_tuple(newest.parent_config)
    assert parent is not None
    version, older = (version_key(t.checkpoint["channel_versions"]["messages"])
                      for t in (newest, parent))
    assert older != version
    stolen = ("a", older) if source == "older-version" else ("b", version)
    _tamper(path, (*stolen, "a", version))

    reader = sealed(path, ("k1", K1), compression=True)
    opened.append(reader)
    named = rf"channel 'messages' at version '{version}'.* of thread 'a'"
    with pytest.raises(DecryptionError, match=named):
        reader.get_tuple(config("a"))
    with pytest.raises(DecryptionError, match=named):
        state(reader, "a")
    assert len(state(reader, "b")["messages"]) == 6
