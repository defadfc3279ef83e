"""Benchmark: what OpenTelemetry costs a checkpointer, off and on.

The agent of `bench_backends.py` (agent -> tool -> agent per turn, five checkpoints and
their writes per turn, `ainvoke`) on seven checkpointers of one backend in one process, each on
storage of its own:

  disabled  `telemetry=False`: every operation's check is `Telemetry.enabled`, as without the
            extra installed (`enabled` is False then too; `--no-extra-check` runs a process
            where OpenTelemetry cannot be imported, to show that)
  off       the default (`telemetry=None`) with no provider set: what an application that does
            not set up OpenTelemetry pays (a check of the API's set-once flags per operation)
  on        the SDK: a TracerProvider with a BatchSpanProcessor into an in-memory exporter and
            a MeterProvider with an in-memory reader; every operation a span and its points
  sampled   the same with the sampler production setups use, a tenth of the traces kept
            (`ParentBased(TraceIdRatioBased(0.1))`): every operation's metric points, one
            span in ten recorded
  lean      the same SDK, the operations of every step (`get_tuple`, `put_writes`) left out
            of the spans (`Telemetry(spans=...)`): a span per checkpoint, points for all
  points    metric points only (a meter provider, no tracer provider)
  sdk-floor the least a span and a point per operation can cost: the same SDK setup, each
            operation one span with one attribute and one histogram point, nothing else of
            ours (no thread hash, no rows or bytes, no gauges): what "on" would cost were this
            package's own part free

The seven take turns in blocks of `--block` turns (one new thread each), the order rotated
every round; the CPU of the process per block (`time.process_time`, the span processor's
thread included) is divided by the disabled block of the same round, and the median of
those ratios printed with their range; turns/s likewise. Goal (issue 24): off costs nothing
measurable, on under 5%. The machine's noise moves single blocks by several percent: the
median over many rounds is the figure.

Run: `python benchmarks/bench_telemetry.py [--backend sqlite|memory|postgres|redis]
[--block N] [--rounds N] [--json PATH]` (default sqlite, blocks of 5 turns, 40 rounds:
about a minute).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_backends import build_graph, question
from places import drop, open_saver, server_options

from langgraph_ckpt_ext import InMemoryCheckpointer, Telemetry

VARIANTS = ("disabled", "off", "on", "sampled", "lean", "points", "sdk-floor")
LEAN = Telemetry.OPERATIONS - {"get_tuple", "put_writes"}


class SdkFloor(Telemetry):
    """Each operation: one span (one attribute) and one histogram point, straight through the
    SDK."""

    def __init__(self, tracer_provider: Any, meter_provider: Any) -> None:
        super().__init__(tracer_provider=tracer_provider, meter_provider=meter_provider)
        self._floor_tracer = tracer_provider.get_tracer("floor")
        self._floor_histogram = meter_provider.get_meter("floor").create_histogram("floor")

    @contextlib.contextmanager
    def operation(self, system: str | None, name: str, thread_id: str | None,  # type: ignore[override]
                  attributes: dict[str, Any] | None = None) -> Iterator[None]:
        from opentelemetry.trace import SpanKind

        attrs = {"db.operation.name": name}
        start = time.perf_counter()
        with self._floor_tracer.start_as_current_span(name, kind=SpanKind.CLIENT,
                                                      attributes=attrs):
            yield None
        self._floor_histogram.record(time.perf_counter() - start, attrs)


def meter_provider() -> Any:
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    return MeterProvider(metric_readers=[InMemoryMetricReader()])


def sdk(ratio: float = 1.0, **options: Any) -> tuple[Telemetry, Any, Any]:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider(sampler=ParentBased(TraceIdRatioBased(ratio)))
    tracer_provider.add_span_processor(BatchSpanProcessor(exporter))
    return (Telemetry(tracer_provider=tracer_provider, meter_provider=meter_provider(),
                      **options),
            tracer_provider, exporter)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    on, tracer_provider, exporter = sdk()
    sampled, sampled_provider, _ = sdk(0.1)
    lean, lean_provider, _ = sdk(spans=LEAN)
    floor, floor_provider, _ = sdk()
    points = Telemetry(meter_provider=meter_provider())
    options = {"disabled": False, "off": None, "on": on, "sampled": sampled, "lean": lean,
               "points": points, "sdk-floor": SdkFloor(floor_provider, floor._meter_provider)}
    places = {v: f"lgxotel_{uuid.uuid4().hex[:8]}_{v}" for v in VARIANTS}
    tmp = tempfile.TemporaryDirectory(prefix="lgxotel_")
    savers: dict[str, Any] = {}
    try:
        for v in VARIANTS:
            if args.backend == "memory":
                savers[v] = InMemoryCheckpointer(telemetry=options[v])
            else:
                place = str(Path(tmp.name) / f"{v}.db") if args.backend == "sqlite" else places[v]
                savers[v] = open_saver(args.backend, place, args, telemetry=options[v])
                await savers[v].asetup()
        assert not savers["off"].telemetry.on and savers["on"].telemetry.on
        assert savers["sampled"].telemetry.on
        graphs = {v: build_graph(s) for v, s in savers.items()}
        made = {v: 0 for v in VARIANTS}

        async def block(v: str) -> tuple[float, float]:
            tid = f"{v}-{made[v]}"
            made[v] += 1
            t0, cpu0 = time.perf_counter(), time.process_time()
            for k in range(args.block):
                human = question(tid, k)
                await graphs[v].ainvoke({"messages": [human]},
                                        {"configurable": {"thread_id": tid}})
            return time.perf_counter() - t0, time.process_time() - cpu0

        for v in VARIANTS:  # warm: statements, caches, the first span
            await block(v)
        rounds: list[dict[str, tuple[float, float]]] = []
        for r in range(args.rounds):
            order = VARIANTS[r % len(VARIANTS):] + VARIANTS[:r % len(VARIANTS)]
            rounds.append({v: await block(v) for v in order})
        tracer_provider.force_flush()
        spans = len(exporter.get_finished_spans())
        for provider in (sampled_provider, lean_provider, floor_provider):
            provider.shutdown()
    finally:
        for s in savers.values():
            await s.aclose()
        tracer_provider.shutdown()
        if args.backend in ("postgres", "redis"):
            for place in places.values():
                await drop(args.backend, place, args)
        tmp.cleanup()
    turns = args.block
    out: dict[str, Any] = {"spans": spans, "per_turn_spans": spans / (turns * (args.rounds + 1)),
                           "variants": {}}
    for v in VARIANTS:
        cpu = [1000 * rd[v][1] / turns for rd in rounds]
        rate = [turns / rd[v][0] for rd in rounds]
        x_cpu = [rd[v][1] / rd["disabled"][1] for rd in rounds]
        x_rate = [(turns / rd[v][0]) / (turns / rd["disabled"][0]) for rd in rounds]
        out["variants"][v] = {
            "cpu_ms": statistics.median(cpu), "turns_per_s": statistics.median(rate),
            "cpu_x": statistics.median(x_cpu), "turns_x": statistics.median(x_rate),
            "cpu_x_quartiles": statistics.quantiles(x_cpu, n=4) if len(x_cpu) > 1 else x_cpu,
        }
    return out


def no_extra_check() -> str:
    """In a process where OpenTelemetry cannot be imported: a checkpointer works and
    records nothing (what `pip install langgraph-ckpt-ext` without `[otel]` gives)."""
    script = (
        "import sys, langgraph.graph, langchain_core.tracers.schemas\n"
        "for k in [k for k in sys.modules if k.startswith('opentelemetry')]: del sys.modules[k]\n"
        "sys.modules['opentelemetry'] = None\n"
        "from langgraph_ckpt_ext import InMemoryCheckpointer\n"
        "from langgraph_ckpt_ext.core import telemetry\n"
        "cp = InMemoryCheckpointer()\n"
        "assert telemetry._trace is None and not cp.telemetry.enabled and not cp.telemetry.on\n"
        "print('without OpenTelemetry: imported, telemetry disabled')\n")
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"the check without OpenTelemetry failed:\n{done.stderr}")
    return done.stdout.strip()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    server_options(p)
    p.add_argument("--backend", default="sqlite", choices=("sqlite", "memory", "postgres", "redis"))
    p.add_argument("--block", type=int, default=5, help="turns per block")
    p.add_argument("--rounds", type=int, default=40)
    p.add_argument("--json", type=Path)
    args = p.parse_args()
    print(no_extra_check())
    out = asyncio.run(run(args))
    print(f"\n{args.backend}: {args.rounds} rounds of {args.block} turns per variant, "
          f"interleaved in one process ({out['per_turn_spans']:.1f} spans per turn on)")
    print(f"{'variant':<9} {'turns/s':>8} {'cpu ms/turn':>11} {'cpu x disabled':>15} "
          f"{'(quartiles)':>14} {'turns/s x':>9}")
    for v, row in out["variants"].items():
        q = row["cpu_x_quartiles"]
        print(f"{v:<9} {row['turns_per_s']:>8.1f} {row['cpu_ms']:>11.2f} {row['cpu_x']:>15.3f} "
              f"{q[0]:>6.3f}-{q[-1]:.3f} {row['turns_x']:>9.3f}")
    for v, goal in (("off", "nothing measurable"), ("on", "under 5%"),
                    ("sampled", "under 5%"), ("lean", "under 5%"), ("points", "under 5%")):
        x = out["variants"][v]["cpu_x"]
        print(f"{v}: {100 * (x - 1):+.1f}% CPU per turn against disabled (goal: {goal})")
    floor = out["variants"]["sdk-floor"]["cpu_x"]
    print(f"sdk-floor: {100 * (floor - 1):+.1f}%: a span and a point per operation straight "
          "through the SDK, nothing of ours")
    if args.json:
        import jsonout

        jsonout.write(args.json, {**jsonout.header("telemetry"), "args": {
            k: v for k, v in vars(args).items() if k not in ("json", "dsn", "redis_url")},
            **out})


if __name__ == "__main__":
    main()
