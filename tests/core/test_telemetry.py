"""OpenTelemetry: a real graph run on every backend gives the expected spans (under the
caller's span, sync and async) and metric points; thread ids hashed by default; failures
recorded with their error type; nothing recorded when off."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from langgraph_ckpt_ext import InMemoryCheckpointer, InvalidConfigError, Telemetry
from tests.support.graphs import chat_graph, human
from tests.support.savers import asaver, param, saver_handle

BACKENDS = [param(b) for b in ("memory", "sqlite", "postgres", "redis")]
SYSTEMS = {"memory": None, "sqlite": "sqlite", "postgres": "postgresql", "redis": "redis"}


class Recorded:
    """A tracer and a meter provider of the SDK, recording in memory."""

    def __init__(self) -> None:
        self.spans = InMemorySpanExporter()
        self.tracer_provider = TracerProvider()
        self.tracer_provider.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.meter_provider = MeterProvider(metric_readers=[self.reader])

    def telemetry(self, **options: Any) -> Telemetry:
        return Telemetry(tracer_provider=self.tracer_provider,
                         meter_provider=self.meter_provider, **options)

    def finished(self) -> list[ReadableSpan]:
        return list(self.spans.get_finished_spans())

    def points(self) -> dict[str, list[Any]]:
        """Metric name -> its data points."""
        out: dict[str, list[Any]] = {}
        data = self.reader.get_metrics_data()
        for rm in data.resource_metrics if data else ():
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    out.setdefault(m.name, []).extend(m.data.data_points)
        return out


@pytest.fixture
def recorded() -> Iterator[Recorded]:
    r = Recorded()
    yield r
    r.tracer_provider.shutdown()
    r.meter_provider.shutdown()


def cfg(thread: str) -> dict[str, Any]:
    return {"configurable": {"thread_id": thread}}


def digest(thread: str) -> str:
    return hashlib.sha256(thread.encode()).hexdigest()[:16]


def check_run(recorded: Recorded, backend: str, thread: str, turns: int) -> None:
    """What `turns` turns of the chat graph and a listing of the thread left: spans under the
    run's span, attributes, and metric points matching the spans."""
    spans = recorded.finished()
    run = next(s for s in spans if s.name == "request")
    ours = [s for s in spans if s.instrumentation_scope.name == "langgraph_ckpt_ext"]
    system = SYSTEMS[backend]
    ops = Counter(s.attributes["db.operation.name"] for s in ours)
    assert ops["get_tuple"] == turns and ops["list"] == 1, ops
    assert ops["put"] == 3 * turns and ops["put_writes"] == 2 * turns, ops
    for s in ours:
        assert s.parent is not None and s.parent.span_id == run.context.span_id, s.name
        assert s.context.trace_id == run.context.trace_id
        a = s.attributes
        assert a.get("db.system.name") == system and s.name.startswith(a["db.operation.name"])
        assert a["lgckpt.thread.id_hash"] == digest(thread) and "lgckpt.thread.id" not in a
        assert s.status.status_code is not StatusCode.ERROR
        if a["db.operation.name"] in ("put", "put_writes"):
            assert a["lgckpt.rows"] >= 1 and a["lgckpt.bytes"] > 0, dict(a)
            assert a["lgckpt.namespace_depth"] == 0
    puts = [s.attributes for s in ours if s.attributes["db.operation.name"] == "put"]
    assert any(a["lgckpt.delta_channels"] > 0 for a in puts)  # the messages grow by appends
    listing = next(s for s in ours if s.attributes["db.operation.name"] == "list")
    assert listing.attributes["db.response.returned_rows"] == 3 * turns
    points = recorded.points()
    durations = {p.attributes["db.operation.name"]: p.count
                 for p in points["db.client.operation.duration"]}
    assert durations == dict(ops)
    written = {p.attributes["db.operation.name"]: p.value for p in points["lgckpt.bytes_written"]}
    for op in ("put", "put_writes"):
        assert written[op] == sum(s.attributes["lgckpt.bytes"] for s in ours
                                  if s.attributes["db.operation.name"] == op)
    assert "lgckpt.operation.errors" not in points


@pytest.mark.parametrize("backend", BACKENDS)
def test_sync_run_spans_and_metrics(backend: str, recorded: Recorded, tmp_path: Path) -> None:
    with saver_handle(backend, tmp_path, telemetry=recorded.telemetry()) as h:
        graph = chat_graph().compile(checkpointer=h.saver)
        with recorded.tracer_provider.get_tracer("app").start_as_current_span("request"):
            for turn in range(2):
                graph.invoke({"messages": [human(f"hi {turn}")]}, cfg("t-sync"))
            assert len(list(h.saver.list(cfg("t-sync")))) == 6
    check_run(recorded, backend, "t-sync", 2)


@pytest.mark.parametrize("backend", BACKENDS)
async def test_async_run_spans_and_metrics(backend: str, recorded: Recorded,
                                           tmp_path: Path) -> None:
    async with asaver(backend, tmp_path, telemetry=recorded.telemetry()) as h:
        graph = chat_graph().compile(checkpointer=h.saver)
        with recorded.tracer_provider.get_tracer("app").start_as_current_span("request"):
            for turn in range(2):
                await graph.ainvoke({"messages": [human(f"hi {turn}")]}, cfg("t-async"))
            assert len([t async for t in h.saver.alist(cfg("t-async"))]) == 6
    check_run(recorded, backend, "t-async", 2)


def test_thread_ids_plain_or_omitted(recorded: Recorded, tmp_path: Path) -> None:
    for option, key in (("plain", "lgckpt.thread.id"), ("omit", None)):
        with saver_handle("sqlite", tmp_path / option,
                          telemetry=recorded.telemetry(thread_ids=option)) as h:
            chat_graph().compile(checkpointer=h.saver).invoke(
                {"messages": [human("hi")]}, cfg(f"secret-{option}"))
        spans = recorded.finished()
        recorded.spans.clear()
        for s in spans:
            assert "lgckpt.thread.id_hash" not in s.attributes
            if key is None:
                assert not any("thread" in k for k in s.attributes), dict(s.attributes)
            else:
                assert s.attributes[key] == f"secret-{option}"
    with pytest.raises(ValueError, match="thread_ids"):
        Telemetry(thread_ids="clear")  # type: ignore[arg-type]


def test_a_failing_operation_is_recorded_with_its_error(recorded: Recorded,
                                                        tmp_path: Path) -> None:
    """The error's type on the span (status ERROR, the exception event) and in the
    duration and error metrics; the caller gets the error unchanged."""
    with saver_handle("sqlite", tmp_path, telemetry=recorded.telemetry()) as h, \
            pytest.raises(InvalidConfigError):
        h.saver.put_writes({"configurable": {}}, [("a", 1)], "task")
    (span,) = recorded.finished()
    assert span.attributes["error.type"] == "InvalidConfigError"
    assert span.status.status_code is StatusCode.ERROR
    assert [e.name for e in span.events] == ["exception"]
    points = recorded.points()
    (error,) = points["lgckpt.operation.errors"]
    assert error.value == 1 and error.attributes["error.type"] == "InvalidConfigError"
    (duration,) = points["db.client.operation.duration"]
    assert duration.attributes["error.type"] == "InvalidConfigError"
    assert "lgckpt.bytes_written" not in points


def test_off_records_nothing(recorded: Recorded, tmp_path: Path) -> None:
    off = recorded.telemetry(enabled=False)
    assert not off.on
    with saver_handle("sqlite", tmp_path / "off", telemetry=off) as h:
        chat_graph().compile(checkpointer=h.saver).invoke({"messages": [human("hi")]}, cfg("t"))
    assert recorded.finished() == [] and recorded.points() == {}
    with saver_handle("sqlite", tmp_path / "default") as h:
        assert not h.saver.telemetry.on  # no global provider in this process
    with pytest.raises(TypeError, match="telemetry"):
        InMemoryCheckpointer(telemetry="on")  # type: ignore[arg-type]


def test_the_global_providers_once_an_application_sets_them(tmp_path: Path) -> None:
    """With no `telemetry` given, a checkpointer records to the global providers from the
    moment the application sets them (in a process of its own: they are set once)."""
    script = textwrap.dedent(f"""
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        from langgraph_ckpt_ext import SQLiteCheckpointer
        cp = SQLiteCheckpointer({str(tmp_path / "g.db")!r})
        config = {{"configurable": {{"thread_id": "t"}}}}
        assert cp.get_tuple(config) is None and not cp.telemetry.on
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        assert cp.get_tuple(config) is None and cp.telemetry.on
        print(sorted(s.name for s in spans.get_finished_spans()))
        cp.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "['get_tuple sqlite']"


def test_a_record_that_cannot_be_traced_is_dropped(recorded: Recorded) -> None:
    """What the replicator process sent is traced by the parent's reader thread: a record it
    cannot show (a bad start time here) is dropped, never raised there; a good one becomes a
    span with its own times."""
    from langgraph_ckpt_ext.core.telemetry import replay

    telemetry = recorded.telemetry()
    replay(telemetry, ("write_rows", "sqlite", "t", "not a time", 0.01, {}, None, None), {})
    at = time.time_ns()
    replay(telemetry, ("write_rows", "sqlite", "t", at, 0.002, {"lgckpt.rows": 3},
                       "OperationalError", "disk I/O error"), {"lgckpt.replica": "r"})
    (span,) = [s for s in recorded.finished() if s.start_time == at]
    assert span.end_time == at + 2_000_000 and span.attributes["lgckpt.rows"] == 3
    assert span.status.status_code is StatusCode.ERROR
    assert span.attributes["error.type"] == "OperationalError"
    assert span.events[0].attributes["exception.message"] == "disk I/O error"


def test_under_a_langsmith_run_in_opentelemetry_mode(tmp_path: Path) -> None:
    """LangSmith traced with OpenTelemetry (`LANGSMITH_TRACING_MODE=otel`): a graph invoked
    in a `@traceable` run makes its checkpointer's spans children of that run, in its trace,
    by the ids LangSmith nests OpenTelemetry spans under its runs with (trace id: the run's
    trace UUID; parent span: the first 8 bytes of the run's UUID). In a process of its own
    (the environment and the global provider); LangSmith's endpoint is a closed loopback
    port: nothing leaves the machine."""
    script = textwrap.dedent(f"""
        import json
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import SimpleSpanProcessor
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        trace.set_tracer_provider(provider)
        from langsmith import traceable
        from langsmith.run_helpers import get_current_run_tree
        from langgraph_ckpt_ext import SQLiteCheckpointer
        from tests.support.graphs import chat_graph, human
        cp = SQLiteCheckpointer({str(tmp_path / "ls.db")!r})
        graph = chat_graph().compile(checkpointer=cp)

        @traceable(name="agent-turn")
        def turn(text):
            run = get_current_run_tree()
            graph.invoke({{"messages": [human(text)]}}, {{"configurable": {{"thread_id": "t"}}}})
            return run.trace_id.int, int.from_bytes(run.id.bytes[:8], "big")

        trace_id, parent = turn("hi")
        ours = [s for s in spans.get_finished_spans()
                if s.instrumentation_scope.name == "langgraph_ckpt_ext"]
        print(json.dumps({{"ours": sorted(s.name for s in ours), "joined": [
            s.context.trace_id == trace_id and s.parent.span_id == parent for s in ours]}}))
        cp.close()
    """)
    env = {**os.environ, "LANGSMITH_TRACING": "true", "LANGSMITH_TRACING_MODE": "otel",
           "LANGSMITH_API_KEY": "unused", "LANGSMITH_ENDPOINT": "http://127.0.0.1:9",
           "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen["ours"] == ["get_tuple sqlite"] + ["put sqlite"] * 3 + ["put_writes sqlite"] * 2
    assert seen["joined"] == [True] * 6


def gauges(recorded: Recorded) -> dict[str, list[tuple[float, dict[str, Any]]]]:
    return {name: [(p.value, dict(p.attributes)) for p in points]
            for name, points in recorded.points().items() if name.startswith(("lgckpt.smart",
                                                                                "lgckpt.replica"))}


@pytest.mark.parametrize("backend", [param("sqlite"), param("postgres"), param("redis")])
def test_smart_flushes_are_spans_and_its_buffer_a_gauge(backend: str, recorded: Recorded,
                                                        tmp_path: Path) -> None:
    """Through a `SmartCheckpointer` (its inner's telemetry): each flush a `flush` span with
    the checkpoints and writes it stored and the rows and bytes they took; what it holds,
    and since when, as gauges."""
    from langgraph_ckpt_ext import Periodic

    with saver_handle(backend, tmp_path, wrapper="smart", policy=Periodic(interval=3600),
                      telemetry=recorded.telemetry()) as h:
        graph = chat_graph().compile(checkpointer=h.saver)
        graph.invoke({"messages": [human("hi")]}, cfg("t-smart"))
        held = gauges(recorded)
        assert [v for v, _ in held["lgckpt.smart.buffered"]] == [h.saver.metrics.buffered]
        assert h.saver.metrics.buffered > 0
        (_, attributes), = held["lgckpt.smart.oldest_unflushed_age"]
        assert attributes["lgckpt.instance"].startswith("SmartCheckpointer-")
        assert attributes["db.system.name"] == SYSTEMS[backend]
        h.saver.flush()
        assert [v for v, _ in gauges(recorded)["lgckpt.smart.buffered"]] == [0]
    flushes = [s for s in recorded.finished() if s.attributes["db.operation.name"] == "flush"]
    assert flushes, [s.name for s in recorded.finished()]
    a = flushes[0].attributes
    assert sum(s.attributes["lgckpt.checkpoints"] for s in flushes) == 3
    assert sum(s.attributes["lgckpt.writes"] for s in flushes) == 2
    assert a["lgckpt.rows"] > 0 and a["lgckpt.bytes"] > 0
    assert a["lgckpt.thread.id_hash"] == digest("t-smart")


def test_replication_traces_applies_and_repairs_and_gauges_each_replica(
        recorded: Recorded, tmp_path: Path) -> None:
    """Through a `ReplicatedCheckpointer` (its primary's telemetry): the primary's writes,
    each replica's applies (`write_rows`, on the replica's own telemetry), a `repair` span
    with what it did, and per replica its queue, lag and health as gauges."""
    from langgraph_ckpt_ext import ReplicatedCheckpointer, SQLiteCheckpointer

    telemetry = recorded.telemetry()
    primary = SQLiteCheckpointer(tmp_path / "p.db", telemetry=telemetry)
    replica = SQLiteCheckpointer(tmp_path / "r.db", telemetry=telemetry)
    cp = ReplicatedCheckpointer(primary, [replica], names=["copy"])
    try:
        chat_graph().compile(checkpointer=cp).invoke({"messages": [human("hi")]}, cfg("t-r"))
        assert cp.flush(10)
        ops = Counter(s.attributes["db.operation.name"] for s in recorded.finished())
        assert ops["put"] == 3 and ops["write_rows"] >= 1, ops
        applied = [s for s in recorded.finished()
                   if s.attributes["db.operation.name"] == "write_rows"]
        assert sum(s.attributes["lgckpt.rows"] for s in applied) > 0
        replica.delete_thread("t-r")  # behind its back: the repair copies it again
        report = cp.repair()
        assert report.replicas[0].checkpoints_copied == 3
        (repair,) = [s for s in recorded.finished()
                     if s.attributes["db.operation.name"] == "repair"]
        assert repair.attributes["lgckpt.checkpoints_copied"] == 3
        assert repair.attributes["lgckpt.threads_checked"] == 1
        (copied,) = recorded.points()["lgckpt.repair.checkpoints_copied"]
        assert copied.value == 3
        held = gauges(recorded)
        for name in ("lgckpt.replica.queue_depth", "lgckpt.replica.lag", "lgckpt.replica.up"):
            (_, attributes), = held[name]
            assert attributes["lgckpt.replica"] == "copy", attributes
        assert held["lgckpt.replica.up"][0][0] == 1
        assert held["lgckpt.replica.queue_depth"][0][0] == 0
    finally:
        cp.close()
        primary.close()
        replica.close()


def test_sweeps_and_migrations_are_spans_with_what_they_did(recorded: Recorded,
                                                            tmp_path: Path) -> None:
    from langgraph_ckpt_ext import Retention, SchemaChain, SQLiteCheckpointer

    path = tmp_path / "s.db"
    with SQLiteCheckpointer(path, telemetry=recorded.telemetry()) as cp:
        graph = chat_graph().compile(checkpointer=cp)
        for turn in range(2):
            graph.invoke({"messages": [human(f"hi {turn}")]}, cfg("t-s"))
        cp.retention = Retention(keep=2)
        report = cp.sweep()
    (sweep,) = [s for s in recorded.finished() if s.attributes["db.operation.name"] == "sweep"]
    assert report.checkpoints_deleted == 4
    assert sweep.attributes["lgckpt.checkpoints_deleted"] == 4
    assert sweep.attributes["lgckpt.threads_examined"] == report.examined == 1
    chain = SchemaChain(current=2, upcasters={1: lambda values: values})
    with SQLiteCheckpointer(path, schema_chain=chain, telemetry=recorded.telemetry()) as cp:
        migrated = cp.migrate_threads(include_unstamped=True)
    (migration,) = [s for s in recorded.finished()
                    if s.attributes["db.operation.name"] == "migrate_threads"]
    assert migration.attributes["lgckpt.threads_migrated"] == migrated.threads_migrated
    assert migration.attributes["lgckpt.checkpoints_migrated"] == migrated.checkpoints_migrated
    assert migrated.threads_seen == 1
    points = {name: [(p.value, dict(p.attributes)) for p in ps]
              for name, ps in recorded.points().items() if name.startswith("lgckpt.")}
    assert points["lgckpt.sweep.checkpoints_deleted"] == [(4, {"db.system.name": "sqlite"})]
    assert points["lgckpt.sweep.threads_trimmed"] == [(1, {"db.system.name": "sqlite"})]
    assert points["lgckpt.migration.checkpoints_migrated"] == [
        (migrated.checkpoints_migrated, {"db.system.name": "sqlite"})]


def test_the_prometheus_example_of_the_docs(tmp_path: Path) -> None:
    """docs/observability.md's Prometheus setup: the metrics of a run, as Prometheus scrapes
    them (the exporter's collector, read as its HTTP endpoint serves it)."""
    from opentelemetry.exporter.prometheus import PrometheusMetricReader
    from prometheus_client import REGISTRY, generate_latest

    from langgraph_ckpt_ext import SQLiteCheckpointer

    reader = PrometheusMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    try:
        with SQLiteCheckpointer(tmp_path / "p.db",
                                telemetry=Telemetry(meter_provider=provider)) as cp:
            chat_graph().compile(checkpointer=cp).invoke({"messages": [human("hi")]}, cfg("t"))
        text = generate_latest(REGISTRY).decode()
    finally:
        provider.shutdown()  # the reader's collector leaves the registry with it
    assert 'db_client_operation_duration_seconds_count{db_operation_name="put",' \
           'db_system_name="sqlite"' in text or \
           'db_client_operation_duration_seconds_count{db_system_name="sqlite",' \
           'db_operation_name="put"' in text, text
    assert "lgckpt_bytes_written_bytes_total" in text, text


@pytest.mark.postgres
async def test_a_retry_after_a_lost_connection_is_counted(recorded: Recorded,
                                                          tmp_path: Path) -> None:
    """The server drops the pool's connections between two turns, before this process's
    loop has seen it: the next operation is retried on a new connection, which its span and
    `lgckpt.retries` count; nothing is lost or stored twice."""
    import uuid

    import psycopg

    from tests.support.savers import PG_DSN

    name = f"lgx-retry-{uuid.uuid4().hex[:8]}"

    def drop_connections() -> int:
        """(blocking this loop: it learns of the drop only when it next uses them)"""
        with psycopg.connect(PG_DSN, autocommit=True) as conn:
            return len(conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                    "WHERE application_name = %s", (name,)).fetchall())

    async with asaver("postgres", tmp_path, telemetry=recorded.telemetry(),
                      server_settings={"application_name": name}) as h:
        graph = chat_graph().compile(checkpointer=h.saver)
        await graph.ainvoke({"messages": [human("hi")]}, cfg("t-retry"))
        assert drop_connections() >= 1
        assert await h.saver.aget_tuple(cfg("t-retry")) is not None  # first, on a dead one
        await graph.ainvoke({"messages": [human("again")]}, cfg("t-retry"))
        assert len([t async for t in h.saver.alist(cfg("t-retry"))]) == 6
    retried = [s for s in recorded.finished() if s.attributes.get("lgckpt.retries")]
    assert retried and all(s.status.status_code is not StatusCode.ERROR for s in retried)
    (point,) = recorded.points()["lgckpt.retries"]
    assert point.value == sum(s.attributes["lgckpt.retries"] for s in retried)


def test_spans_only_or_points_only(recorded: Recorded, tmp_path: Path) -> None:
    """A tracer provider alone gives spans and no points; a meter provider alone, points and
    no span (none is even made: the cheaper setups of docs/observability.md)."""
    spans_only = Telemetry(tracer_provider=recorded.tracer_provider)
    points_only = Telemetry(meter_provider=recorded.meter_provider)
    assert spans_only.tracing and not spans_only.measuring
    assert points_only.measuring and not points_only.tracing
    for name, telemetry in (("spans", spans_only), ("points", points_only)):
        with saver_handle("sqlite", tmp_path / name, telemetry=telemetry) as h:
            chat_graph().compile(checkpointer=h.saver).invoke({"messages": [human("hi")]},
                                                              cfg(name))
    spans = recorded.finished()
    assert {s.attributes["lgckpt.thread.id_hash"] for s in spans} == {digest("spans")}
    (duration,) = [p for p in recorded.points()["db.client.operation.duration"]
                   if p.attributes["db.operation.name"] == "put"]
    assert duration.count == 3  # the points-only run's three puts


def test_spans_for_chosen_operations_points_for_all(recorded: Recorded,
                                                   tmp_path: Path) -> None:
    """`spans=` names the operations that are spans; every operation still records its
    points. A name that is no operation, or a bare string, is refused."""
    telemetry = recorded.telemetry(spans=Telemetry.OPERATIONS - {"get_tuple", "put_writes"})
    with saver_handle("sqlite", tmp_path, telemetry=telemetry) as h:
        graph = chat_graph().compile(checkpointer=h.saver)
        graph.invoke({"messages": [human("hi")]}, cfg("chosen"))
        assert len(list(h.saver.list(cfg("chosen")))) == 3
    assert Counter(s.name for s in recorded.finished()) == {"put sqlite": 3, "list sqlite": 1}
    calls = Counter({p.attributes["db.operation.name"]: p.count
                     for p in recorded.points()["db.client.operation.duration"]})
    assert calls["get_tuple"] >= 1 and calls["put_writes"] >= 1 and calls["put"] == 3
    with pytest.raises(ValueError, match=r"unknown operations \['gett_tuple'\]"):
        Telemetry(spans={"put", "gett_tuple"})
    with pytest.raises(TypeError, match="collection of operation names"):
        Telemetry(spans="put")


def test_without_the_extra(tmp_path: Path) -> None:
    """Where OpenTelemetry cannot be imported (no `[otel]` extra): checkpointers work, and
    telemetry stays off even when asked for."""
    script = textwrap.dedent(f"""
        import sys
        import langgraph.graph, langchain_core.tracers.schemas  # theirs, loaded as usual
        for name in [n for n in sys.modules if n.startswith("opentelemetry")]:
            del sys.modules[name]
        sys.modules["opentelemetry"] = None
        from langgraph_ckpt_ext import SQLiteCheckpointer, Telemetry
        cp = SQLiteCheckpointer({str(tmp_path / "n.db")!r}, telemetry=Telemetry())
        config = {{"configurable": {{"thread_id": "t"}}}}
        assert cp.get_tuple(config) is None and not cp.telemetry.on
        print("ok")
        cp.close()
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.redis
def test_replicas_in_the_replicator_process_are_traced_and_gauged_here(
        recorded: Recorded, tmp_path: Path) -> None:
    """Replicas given as URLs are applied by the replicator process, which has no providers:
    it records what each replica's saver did and this process makes the spans (their own
    times, `lgckpt.replica` named) and points; it gauges their queue, lag and health from
    what the child reports. Telemetry turned off, then on again, reaches the child."""
    from langgraph_ckpt_ext import ReplicatedCheckpointer

    telemetry = recorded.telemetry()
    with saver_handle("redis", tmp_path, telemetry=telemetry) as h:
        cp = ReplicatedCheckpointer(h.saver, [f"sqlite:///{tmp_path / 'r.db'}"], names=["far"])
        try:
            graph = chat_graph().compile(checkpointer=cp)
            before = time.time_ns()
            graph.invoke({"messages": [human("hi")]}, cfg("t-far"))
            assert cp.flush(10)
            spans = recorded.finished()
            ops = Counter(s.attributes["db.operation.name"] for s in spans)
            assert ops["put"] == 3 and ops["put_writes"] == 2 and ops["write_rows"] >= 1, ops
            applied = [s for s in spans if s.attributes["db.operation.name"] == "write_rows"]
            for s in applied:
                assert s.attributes["db.system.name"] == "sqlite"
                assert s.attributes["lgckpt.replica"] == "far"
                assert s.attributes["lgckpt.thread.id_hash"] == digest("t-far")
                assert before < s.start_time < s.end_time <= time.time_ns()
            assert sum(s.attributes["lgckpt.rows"] for s in applied) >= 5
            by_system = Counter(p.attributes.get("db.system.name") for p in
                                recorded.points()["db.client.operation.duration"]
                                for _ in range(p.count))
            assert by_system["sqlite"] == len(applied)
            held = gauges(recorded)
            assert held["lgckpt.replica.up"] == [(1, {"lgckpt.instance": cp._instance,
                                                       "lgckpt.replica": "far"})]
            assert held["lgckpt.replica.queue_depth"][0][0] == 0

            telemetry.enabled = False
            graph.invoke({"messages": [human("off")]}, cfg("t-off"))
            assert cp.flush(10) and len(recorded.finished()) == len(spans)
            telemetry.enabled = True
            graph.invoke({"messages": [human("on")]}, cfg("t-on"))
            assert cp.flush(10)
            again = [s for s in recorded.finished()[len(spans):]
                     if s.attributes["db.operation.name"] == "write_rows"]
            assert again and {s.attributes["lgckpt.thread.id_hash"] for s in again} == {
                digest("t-on")}
        finally:
            cp.close()
