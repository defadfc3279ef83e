"""`langgraph_ckpt_ext.server` in process, loaded as LangGraph's server loads
`checkpointer.path` (`langgraph_api._checkpointer._adapter`, which cannot be imported outside
the server; test_langgraph_dev.py runs the real one): the environment read,
`checkpointer.ttl` mapped onto our retention and sweeper, `serde` settings, bad values refused
by name, several entries at once (one per server thread), and everything closed on exit."""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from langgraph.checkpoint.base import empty_checkpoint

from langgraph_ckpt_ext import InvalidConfigError, Retention, SmartCheckpointer
from langgraph_ckpt_ext.core.keys import encode_key, new_key
from langgraph_ckpt_ext.core.retention import SweepSchedule
from langgraph_ckpt_ext.server import ServerSettings, open_checkpointer
from tests.support.savers import (
    PG_DSN,
    REDIS_URL,
    drop_pg_schemas,
    drop_redis_prefixes,
    param,
    pg_schema,
    redis_prefix,
)

EXAMPLE = (Path(__file__).resolve().parents[2] / "examples" / "langgraph_server"
           / "custom_checkpointer.py")
TTL = {"strategy": "keep_latest", "default_ttl": 60, "sweep_interval_minutes": 2,
       "sweep_limit": 50}


@dataclass
class Plan:
    steps: list[str]


def _sweepers() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name.startswith("lgckpt-sweeper")]


def _env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, **section: Any) -> Path:
    db = tmp_path / "ck.db"
    for var in ("LGCKPT_SWEEP_EVERY", "LANGGRAPH_THREAD_TTL"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("LGCKPT_URL", f"sqlite:///{db}")
    monkeypatch.setenv("LANGGRAPH_CHECKPOINTER", json.dumps(
        {"path": "langgraph_ckpt_ext.server:checkpointer", **section}))
    return db


def _server_factory(path: str) -> Any:
    """What LangGraph's server does with a `checkpointer.path` naming a module: import the
    part before the last dot, look the rest up in the module's namespace, then (per thread)
    call it and enter the async context manager it returns."""
    module, attr = path.rsplit(".", 1)
    return importlib.import_module(module).__dict__[attr]()


async def _put(cp: Any, thread_id: str, n: int) -> None:
    config: dict[str, Any] = {"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}}
    for step in range(n):
        ckpt = empty_checkpoint()
        config = await cp.aput(config, ckpt, {"source": "loop", "step": step}, {})


@pytest.mark.parametrize("path", ["langgraph_ckpt_ext.server:checkpointer",
                                  "langgraph_ckpt_ext.server.checkpointer"])
async def test_ttl_maps_onto_retention_and_sweeper(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, path: str
) -> None:
    _env(monkeypatch, tmp_path, ttl=TTL)
    before = len(_sweepers())
    async with _server_factory(path) as cp:
        assert cp.retention == Retention(idle=3600, strategy="keep_latest")
        assert len(_sweepers()) == before + 1
        await _put(cp, "t", 3)
        now = cp.clock()
        cp.clock = lambda: now + 3601  # an hour and a second idle: expired
        report = await cp.asweep()
        assert report.trimmed == {"t": 2}
        assert len([t async for t in cp.alist({"configurable": {"thread_id": "t"}})]) == 1
    assert len(_sweepers()) == before, "the sweeper outlived the checkpointer"
    assert ServerSettings.from_env().schedule() == SweepSchedule(120, 50)


def test_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    _env(monkeypatch, tmp_path, ttl=TTL)
    settings = ServerSettings.from_env()
    assert settings.ttl == TTL and settings.serde is None
    monkeypatch.setenv("LGCKPT_SWEEP_EVERY", "30")
    assert ServerSettings.from_env().schedule() == SweepSchedule(30, 50)
    monkeypatch.setenv("LGCKPT_SWEEP_EVERY", "0")
    assert ServerSettings.from_env().schedule() is None
    monkeypatch.setenv("LANGGRAPH_THREAD_TTL", "15")  # the server's own override wins
    s = ServerSettings.from_env()
    assert s.options()["retention"] == Retention(idle=900)
    _env(monkeypatch, tmp_path)  # no ttl: nothing expires, no sweeper
    assert ServerSettings.from_env().options() == {}
    assert ServerSettings.from_env().schedule() is None


@pytest.mark.parametrize(("var", "value", "named"), [
    ("LGCKPT_URL", "", "LGCKPT_URL is not set"),
    ("LGCKPT_URL", "mysql://db/x", "LGCKPT_URL"),
    ("LGCKPT_URL", "sqlite:///x.db?busy_timeout=soon", "LGCKPT_URL"),
    ("LANGGRAPH_CHECKPOINTER", "{not json", "LANGGRAPH_CHECKPOINTER is not JSON"),
    ("LANGGRAPH_CHECKPOINTER", "[1]", "LANGGRAPH_CHECKPOINTER must be a JSON object"),
    ("LANGGRAPH_CHECKPOINTER", '{"ttl": {"default_ttl": -5}}', "LANGGRAPH_CHECKPOINTER"),
    ("LANGGRAPH_CHECKPOINTER", '{"ttl": {"default_tll": 5}}', "default_tll"),
    ("LANGGRAPH_CHECKPOINTER", '{"ttl": {"strategy": "archive", "default_ttl": 5}}',
     "archive"),
    ("LANGGRAPH_CHECKPOINTER", '{"serde": {"pickle_fallback": true}}', "pickle_fallback"),
    ("LANGGRAPH_CHECKPOINTER", '{"serde": {"allowed_json_modules": true}}', "list the classes"),
    ("LANGGRAPH_CHECKPOINTER", '{"serde": {"allowed_json_modules": [[1]]}}',
     "allowed_json_modules"),
    ("LANGGRAPH_CHECKPOINTER", '{"serde": {"pickle": 1}}', "unknown checkpointer serde"),
    ("LANGGRAPH_THREAD_TTL", "soon", "LANGGRAPH_THREAD_TTL"),
    ("LANGGRAPH_THREAD_TTL", "-3", "LANGGRAPH_THREAD_TTL"),
    ("LGCKPT_SWEEP_EVERY", "often", "LGCKPT_SWEEP_EVERY"),
    ("LGCKPT_SWEEP_EVERY", "-1", "LGCKPT_SWEEP_EVERY"),
])
async def test_bad_environment_is_refused_by_name_before_opening(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, var: str, value: str, named: str
) -> None:
    db = _env(monkeypatch, tmp_path)
    monkeypatch.setenv(var, value)
    with pytest.raises(InvalidConfigError, match=named):
        async with _server_factory("langgraph_ckpt_ext.server:checkpointer"):
            pass
    assert not db.exists()


async def test_serde_allowed_json_modules_lets_stored_values_construct_those_classes(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    plan = Plan(["ask", "answer"])
    _env(monkeypatch, tmp_path, serde={"allowed_json_modules": [[__name__, "Plan"]],
                                       "pickle_fallback": False})
    async with _server_factory("langgraph_ckpt_ext.server:checkpointer") as cp:
        assert cp.serde.loads_typed(cp.serde.dumps_typed(plan)) == plan
    _env(monkeypatch, tmp_path)  # our default: a data type of a module loaded, constructed
    async with _server_factory("langgraph_ckpt_ext.server:checkpointer") as cp:
        assert cp.serde.loads_typed(cp.serde.dumps_typed(plan)) == plan
    _env(monkeypatch, tmp_path, serde={"allowed_msgpack_modules": None})  # strict: not
    async with _server_factory("langgraph_ckpt_ext.server:checkpointer") as cp:
        assert not isinstance(cp.serde.loads_typed(cp.serde.dumps_typed(plan)), Plan)


@pytest.fixture
def store_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A URL of `request.param`'s backend naming storage of this test's own, removed after."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'ck.db'}"
    elif request.param == "postgres":
        schema = pg_schema()
        yield f"{PG_DSN}?schema={schema}"
        drop_pg_schemas(schema)
    else:
        prefix = redis_prefix()
        yield f"{REDIS_URL}?key_prefix={prefix}"
        drop_redis_prefixes(prefix)


@pytest.mark.parametrize("store_url", [param("sqlite"), param("postgres"), param("redis")],
                         indirect=True)
def test_entered_once_per_thread_each_on_its_own_loop(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, store_url: str
) -> None:
    """The server enters the factory in every thread that serves requests, each thread with
    its own event loop; all share the one store, and each closes what it opened."""
    _env(monkeypatch, tmp_path, ttl=TTL)
    monkeypatch.setenv("LGCKPT_URL", store_url)
    before = len(_sweepers())
    entered = threading.Barrier(3)
    seen: dict[str, int] = {}
    errors: list[BaseException] = []

    async def serve(name: str) -> None:
        async with _server_factory("langgraph_ckpt_ext.server:checkpointer") as cp:
            await _put(cp, name, 2)
            await asyncio.to_thread(entered.wait, 30)  # all three open at once
            for other in ("a", "b", "c"):
                n = len([t async for t in cp.alist({"configurable": {"thread_id": other}})])
                seen[f"{name}<-{other}"] = n

    def run(name: str) -> None:
        try:
            asyncio.run(serve(name))
        except BaseException as exc:  # reported by the test thread
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in ("a", "b", "c")]
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors, errors
    assert set(seen.values()) == {2} and len(seen) == 9, seen
    assert len(_sweepers()) == before


async def test_a_wrapper_is_closed_then_what_it_wraps(tmp_path: Path) -> None:
    settings = ServerSettings(f"sqlite:///{tmp_path / 'w.db'}", ttl=TTL)
    before = len(_sweepers())
    async with open_checkpointer(settings, wrap=SmartCheckpointer) as cp:
        assert isinstance(cp, SmartCheckpointer)
        await _put(cp, "w", 2)
        assert len(_sweepers()) == before + 1
    assert len(_sweepers()) == before

    def failing(inner: Any) -> Any:
        raise RuntimeError("wrapper refused")

    with pytest.raises(RuntimeError, match="wrapper refused"):
        async with open_checkpointer(settings, wrap=failing):
            pass
    assert len(_sweepers()) == before, "the checkpointer a failed wrap got was left open"
    async with open_checkpointer(settings.url) as cp:  # the buffered writes reached the file
        assert len([t async for t in cp.alist({"configurable": {"thread_id": "w"}})]) >= 1


@pytest.mark.parametrize(("query", "kept"), [("", False), ("?redact_metadata=false", True)])
async def test_request_keys_are_not_stored(tmp_path: Path, query: str, kept: bool) -> None:
    """The server's request id reaches a saver in `configurable`, which LangGraph's savers
    merge into metadata; dropped unless the URL says how to redact."""
    async with open_checkpointer(f"sqlite:///{tmp_path / 'r.db'}{query}") as cp:
        config = {"configurable": {"thread_id": "r", "checkpoint_ns": "",
                                   "langgraph_request_id": "req-1", "graph_id": "agent"}}
        await cp.aput(config, empty_checkpoint(), {"source": "loop", "step": 0}, {})
        [stored] = [t.metadata async for t in cp.alist({"configurable": {"thread_id": "r"}})]
    assert stored["graph_id"] == "agent"
    assert ("langgraph_request_id" in stored) is kept


async def test_prune_delete_all_is_delete(tmp_path: Path) -> None:
    """LangGraph's server calls `aprune(..., strategy="delete_all")` (its gRPC `Prune`)."""
    async with open_checkpointer(f"sqlite:///{tmp_path / 'p.db'}") as cp:
        await _put(cp, "gone", 2)
        await _put(cp, "kept", 2)
        await cp.aprune(["gone"], strategy="delete_all")
        assert [t async for t in cp.alist({"configurable": {"thread_id": "gone"}})] == []
        assert len([t async for t in cp.alist({"configurable": {"thread_id": "kept"}})]) == 2


async def test_the_example_custom_factory(monkeypatch: pytest.MonkeyPatch, tmp_path: Path
                                          ) -> None:
    """examples/langgraph_server/custom_checkpointer.py, loaded by file path as the server
    loads `./custom_checkpointer.py:checkpointer`: a SmartCheckpointer over an encrypted
    SQLite file, its retention the factory's own."""
    db = _env(monkeypatch, tmp_path, ttl=TTL)
    monkeypatch.setenv("LGCKPT_KEYS", f"k1:{encode_key(new_key())}")
    monkeypatch.delenv("LGCKPT_KEY_CURRENT", raising=False)
    spec = importlib.util.spec_from_file_location("__custom_checkpointer", EXAMPLE)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    async with module.checkpointer() as cp:
        assert isinstance(cp, SmartCheckpointer)
        assert cp.retention == Retention(idle=30 * 24 * 3600, keep=50)
        ckpt = empty_checkpoint()
        ckpt["channel_values"] = {"secret": "the otters are plotting"}
        ckpt["channel_versions"] = {"secret": 1.5}
        await cp.aput({"configurable": {"thread_id": "x", "checkpoint_ns": ""}}, ckpt,
                      {"source": "input", "step": -1}, {"secret": 1.5})
    stored = b"".join(p.read_bytes() for p in tmp_path.glob(f"{db.name}*"))
    assert b"otters" not in stored
    async with module.checkpointer() as cp:
        tup = await cp.aget_tuple({"configurable": {"thread_id": "x"}})
        assert tup is not None
        assert tup.checkpoint["channel_values"] == {"secret": "the otters are plotting"}
