"""Encryption at rest on PostgreSQL, seen from the database itself: nothing of a secret in any
column of any table; an eager rotation SIGKILLed at 40% of the threads and run again; a value
swapped by hand in SQL refused with the row named.

Each test has a schema of its own; the raw rows are read with plain SQL, as someone with access
to the database (and not to the keys) reads them.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from langchain_core.messages import HumanMessage

from langgraph_ckpt_ext import PostgresCheckpointer
from langgraph_ckpt_ext.backends.postgres.store import PostgresStore
from langgraph_ckpt_ext.core.errors import DecryptionError
from langgraph_ckpt_ext.core.keys import EnvKeys, StaticKeys, encode_key, new_key
from langgraph_ckpt_ext.core.rotation import RotationProgress
from langgraph_ckpt_ext.core.rows import ListQuery, Reseal
from langgraph_ckpt_ext.core.sealing import Encryption
from langgraph_ckpt_ext.core.sealing import key_id_of as _key_id
from langgraph_ckpt_ext.core.versions import version_key
from tests.support.graphs import chat_graph
from tests.support.savers import PG_DSN, drop_pg_schemas, pg_schema

pytestmark = pytest.mark.postgres

ROOT = Path(__file__).resolve().parents[2]
K1, K2 = new_key(), new_key()
MESSAGE_SECRET = "sk-live-4f1c0a-said-in-a-message"
CONFIG_SECRET = "sk-live-77b2e9-passed-as-api-key"
THREADS = 10


@pytest.fixture
def schema() -> Iterator[str]:
    name = pg_schema()
    yield name
    drop_pg_schemas(name)


def saver(schema: str, keys: dict[str, bytes] | None = None, *, plain: bool = False,
          **options: Any) -> PostgresCheckpointer:
    """A checkpointer over `schema`, encrypting with `keys` (default k1; the last one is
    current) and compressing, unless `plain`."""
    if plain:
        return PostgresCheckpointer(PG_DSN, schema=schema, **options)
    return PostgresCheckpointer(PG_DSN, schema=schema, compression=True,
                                encryption=Encryption(StaticKeys(keys or {"k1": K1})), **options)


def config(thread: str, **extra: Any) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread, **extra}}


def chat(cp: PostgresCheckpointer, thread: str, turns: int, text: str = "hello",
         **extra: Any) -> None:
    graph = chat_graph().compile(checkpointer=cp)
    for i in range(turns):
        graph.invoke({"messages": [HumanMessage(content=f"{text} {i}")]}, config(thread, **extra))


def state(cp: PostgresCheckpointer, thread: str) -> dict[str, Any]:
    return chat_graph().compile(checkpointer=cp).get_state(config(thread)).values


def sql(schema: str, statement: str, *args: Any) -> list[Any]:
    async def run() -> list[Any]:
        conn = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
        try:
            return list(await conn.fetch(statement, *args))
        finally:
            await conn.close()

    return asyncio.run(run())


def every_value(schema: str) -> list[bytes]:
    """Every value of every column of every table of the schema: bytea as stored, any other
    type as its text."""
    columns = sql(schema, """
        SELECT table_name, column_name, data_type FROM information_schema.columns
        WHERE table_schema = $1 ORDER BY table_name, ordinal_position""", schema)
    assert {c["table_name"] for c in columns} >= {"lgx_checkpoints", "lgx_blobs", "lgx_writes",
                                                  "lgx_threads"}
    out: list[bytes] = []
    for c in columns:
        # identifiers from the catalog, quoted: nothing of the test's input is spliced
        col = f'"{c["column_name"]}"' + ("" if c["data_type"] == "bytea" else "::text")
        for (value,) in sql(schema, f'SELECT {col} FROM "{c["table_name"]}"'):
            if value is not None:
                out.append(value if isinstance(value, bytes) else value.encode())
    return out


def holds(values: list[bytes], secret: str) -> bool:
    return any(secret.encode() in v for v in values)


def key_ids(cp: PostgresCheckpointer, thread: str) -> set[str]:
    """The key ids of every value stored for the thread ("" for an unencrypted one)."""
    store = cp._raw_store

    async def collect() -> set[str]:
        rows = [r async for r in store.iter_checkpoints(ListQuery(thread_id=thread))]
        found = {_key_id(t) for r in rows for t in (r.checkpoint, r.metadata)}
        blobs = await store.read_blobs(thread, "", {
            (ch, v) for r in rows
            for ch, v in cp._versions_of(cp._store.open_row(r, remember=False)).items()})
        writes = await store.read_writes(thread, "", [r.checkpoint_id for r in rows])
        found |= {_key_id((b.type, b.data)) for b in blobs.values()}
        return found | {_key_id((w.type, w.data)) for ws in writes.values() for w in ws}

    return cp.run_sync(collect())


# -- nothing of a secret at rest ---------------------------------------------------------------


def test_a_secret_never_reaches_the_tables(schema: str) -> None:
    # Metadata redaction off: encryption alone must keep the config's api_key out of storage.
    with saver(schema, redact_metadata=False) as cp:
        chat(cp, "s", turns=3, text=MESSAGE_SECRET, api_key=CONFIG_SECRET)
        assert MESSAGE_SECRET in state(cp, "s")["messages"][0].content
        meta = cp.get_tuple(config("s")).metadata
        assert meta.get("api_key") == CONFIG_SECRET  # stored, then, but sealed
    values = every_value(schema)
    assert sum(map(len, values)) > 1000
    assert not holds(values, MESSAGE_SECRET) and not holds(values, CONFIG_SECRET)
    assert not holds(values, "hello") and not holds(values, "echo: ")

    # The same run with a plain checkpointer: the grep finds both (it can fail).
    plain = pg_schema()
    try:
        with saver(plain, plain=True, redact_metadata=False) as cp:
            chat(cp, "s", turns=3, text=MESSAGE_SECRET, api_key=CONFIG_SECRET)
        values = every_value(plain)
        assert holds(values, MESSAGE_SECRET) and holds(values, CONFIG_SECRET)
    finally:
        drop_pg_schemas(plain)


# -- eager rotation, SIGKILLed and run again ---------------------------------------------------

# The child: rotate_keys under EnvKeys (k1 and k2, k2 current), reporting each thread done and
# waiting for the parent's go before the next, so that the kill lands after a known thread.
ROTATOR = """
import sys
from langgraph_ckpt_ext import PostgresCheckpointer
from langgraph_ckpt_ext.core.keys import EnvKeys
from langgraph_ckpt_ext.core.sealing import Encryption

def progress(p):
    print(f"PROGRESS {p.threads_done} {p.threads_total} {p.rows_rotated}", flush=True)
    sys.stdin.readline()

cp = PostgresCheckpointer(sys.argv[1], schema=sys.argv[2],
                          encryption=Encryption(EnvKeys()), compression=True)
report = cp.rotate_keys(progress=progress, concurrency=1)
print(f"DONE {report.rows_rotated}", flush=True)
cp.close()
"""


def rotate_until_killed(schema: str, at: int) -> list[str]:
    """Run `ROTATOR` over the schema; SIGKILL it once `at` threads are done. Its lines."""
    env = {**os.environ, "LGCKPT_KEYS": f"k1:{encode_key(K1)},k2:{encode_key(K2)}"}
    env.pop("LGCKPT_KEY_CURRENT", None)
    proc = subprocess.Popen([sys.executable, "-c", ROTATOR, PG_DSN, schema], cwd=ROOT, env=env,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    assert proc.stdin is not None and proc.stdout is not None
    lines: list[str] = []
    try:
        for line in proc.stdout:
            lines.append(line.strip())
            if line.startswith("PROGRESS") and int(line.split()[1]) >= at:
                proc.send_signal(signal.SIGKILL)  # no cleanup, no close: mid-run
                break
            proc.stdin.write("\n")
            proc.stdin.flush()
        else:
            pytest.fail(f"the rotation ended before the kill: {lines} "
                        f"{proc.stderr.read() if proc.stderr else ''}")
    finally:
        proc.wait(30)
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
    assert proc.returncode == -signal.SIGKILL
    return lines


def test_rotation_killed_at_40_percent_resumes(schema: str) -> None:
    threads = [f"t{i:02}" for i in range(THREADS)]
    with saver(schema) as cp:
        for t in threads:
            chat(cp, t, turns=2, text=f"about {t}")
        before = {t: state(cp, t) for t in threads}
    with saver(schema, {"k1": K1, "k2": K2}) as both:
        total = both.rotate_keys(dry_run=True).rows_seen
        assert total > 0

        lines = rotate_until_killed(schema, at=THREADS * 4 // 10)
        assert lines[-1].split()[1:3] == [str(THREADS * 4 // 10), str(THREADS)]
        mixed = [key_ids(both, t) for t in threads]
        assert mixed == [{"k2"}] * 4 + [{"k1"}] * 6  # the threads in the order rotated

        seen: list[RotationProgress] = []
        report = both.rotate_keys(progress=seen.append)
        assert report.rows_current > 0 and report.rows_rotated > 0
        assert report.rows_current + report.rows_rotated == total
        assert report.rows_changed_meanwhile == 0 and not report.unreadable
        assert report.threads_rotated == 6 and len(seen) == THREADS
        assert all(key_ids(both, t) == {"k2"} for t in threads)
    # A checkpointer with only the new key (from the environment, as the child had it).
    env = {"LGCKPT_KEYS": f"k2:{encode_key(K2)}"}
    with PostgresCheckpointer(PG_DSN, schema=schema, compression=True,
                              encryption=Encryption(EnvKeys(environ=env))) as only_new:
        assert {t: state(only_new, t) for t in threads} == before


# -- a value swapped by hand ---------------------------------------------------------------------


def test_a_blob_swapped_in_sql_is_refused(schema: str) -> None:
    with saver(schema) as cp:
        chat(cp, "x", turns=3)
        versions = cp.get_tuple(config("x")).checkpoint["channel_versions"]
        target = version_key(versions["messages"])
        rows = sql(schema, """
            SELECT version FROM lgx_blobs
            WHERE thread_id = 'x' AND checkpoint_ns = '' AND channel = 'messages'""")
        other = next(r["version"] for r in rows if r["version"] != target)
        changed = sql(schema, """
            UPDATE lgx_blobs t SET data = s.data FROM lgx_blobs s
            WHERE t.thread_id = 'x' AND t.checkpoint_ns = '' AND t.channel = 'messages'
              AND t.version = $1
              AND s.thread_id = 'x' AND s.checkpoint_ns = '' AND s.channel = 'messages'
              AND s.version = $2
            RETURNING 1""", target, other)
        assert len(changed) == 1
        with pytest.raises(DecryptionError, match=rf"channel 'messages' at version "
                                                  rf"'{target}'.* of thread 'x'"):
            cp.get_tuple(config("x"))


# -- a rotation meeting a writer -----------------------------------------------------------------


async def _reseal_behind(schema: str, thread: str, change: Reseal, rewrite: bool) -> int:
    """`reseal(change)` while another session holds the thread's lifecycle row, as a writer
    does (and, if `rewrite`, has rewritten the value `change` names): the reseal waits for
    that session's commit, then compares with the row as it is. How many it applied."""
    store = PostgresStore(dsn=PG_DSN, schema=schema,
                          pool_options={"server_settings": {"search_path": schema}})
    writer = await asyncpg.connect(PG_DSN, server_settings={"search_path": schema})
    try:
        tx = writer.transaction()
        await tx.start()
        await writer.execute("SELECT 1 FROM lgx_threads WHERE thread_id = $1 FOR NO KEY UPDATE",
                             thread)
        if rewrite:
            await writer.execute("""
                UPDATE lgx_blobs SET data = data || '\\x00'::bytea
                WHERE thread_id = $1 AND checkpoint_ns = '' AND channel = $2 AND version = $3
            """, thread, *change.key)
        resealing = asyncio.create_task(store.reseal(thread, [change]))
        for _ in range(1000):  # until the reseal is seen waiting on the writer's lock
            if await writer.fetchval(WAITING, writer.get_server_pid()):
                break
            assert not resealing.done(), resealing.result()
            await asyncio.sleep(0.01)
        else:
            pytest.fail("the reseal never waited for the writer holding its thread")
        await tx.commit()
        return await resealing
    finally:
        await writer.close()
        await store.close()


# Whether a session waits on a lock that session $1 holds (pg_locks is read live; the activity
# views would be a snapshot taken once per transaction).
WAITING = """
SELECT EXISTS (SELECT 1 FROM pg_locks WHERE NOT granted AND $1 = ANY(pg_blocking_pids(pid)))"""


def test_a_reseal_waits_for_a_writer_of_the_thread_then_compares(schema: str) -> None:
    with saver(schema) as cp:
        chat(cp, "w", turns=2)
        versions = cp.get_tuple(config("w")).checkpoint["channel_versions"]
        target = version_key(versions["messages"])
        (row,) = sql(schema, """
            SELECT type, data FROM lgx_blobs
            WHERE thread_id = 'w' AND checkpoint_ns = '' AND channel = 'messages'
              AND version = $1""", target)
        generation = sql(schema, "SELECT generation FROM lgx_threads WHERE thread_id = 'w'")
        change = Reseal("blob", "", ("messages", target), ((row["type"], row["data"]),),
                        ((row["type"], row["data"] + b"resealed"),))
        # the writer changed the value meanwhile: left as the writer left it
        assert asyncio.run(_reseal_behind(schema, "w", change, rewrite=True)) == 0
        (now,) = sql(schema, "SELECT data FROM lgx_blobs WHERE thread_id = 'w' "
                             "AND channel = 'messages' AND version = $1", target)
        assert now["data"] == row["data"] + b"\x00"
        # the writer wrote other rows: the value is resealed once it is done
        change = Reseal("blob", "", ("messages", target), ((row["type"], now["data"]),),
                        ((row["type"], row["data"]),))
        assert asyncio.run(_reseal_behind(schema, "w", change, rewrite=False)) == 1
        assert sql(schema, "SELECT generation FROM lgx_threads WHERE thread_id = 'w'"
                   ) == generation
        assert state(cp, "w")["turns"] == 2


def test_a_row_named_twice_is_resealed_in_order(schema: str) -> None:
    with saver(schema) as cp:
        chat(cp, "r", turns=1)
        (row,) = sql(schema, """
            SELECT channel, version, type, data FROM lgx_blobs WHERE thread_id = 'r'
            ORDER BY channel, version LIMIT 1""")
        key, typed = (row["channel"], row["version"]), (row["type"], row["data"])
        step = (row["type"], row["data"] + b"1")
        changes = [Reseal("blob", "", key, (typed,), (step,)),
                   Reseal("blob", "", key, (step,), (typed,))]  # back, comparing with the first
        assert cp.run_sync(cp._raw_store.reseal("r", changes)) == 2
        assert sql(schema, "SELECT type, data FROM lgx_blobs WHERE thread_id = 'r' "
                           "AND channel = $1 AND version = $2", *key) == [row[2:]]
