"""OpenTelemetry spans and metrics for checkpointer operations (the `otel` extra).

A checkpointer's `telemetry` is off unless OpenTelemetry is installed and a tracer or meter
provider is configured: the global ones (`trace.set_tracer_provider`, as an application's
telemetry setup does), or those given to `Telemetry`. Off, an operation costs an attribute
check and a property call. On, each operation is a client span named `<operation> <system>`
(`put postgresql`) under the caller's current span, and metric points follow OpenTelemetry's
semantic conventions for database clients where they fit (`db.client.operation.duration`,
`db.system.name`, `db.operation.name`, `error.type`), with this package's own under `lgckpt.`.

No span or metric carries a stored value, a config's other keys, or a thread id in clear
unless `thread_ids="plain"` is asked for: by default a thread shows as the first 16 hex digits
of its id's SHA-256 (`lgckpt.thread.id_hash`), which groups a thread's spans without showing
whose thread it is.
"""

from __future__ import annotations

import contextvars
import functools
import hashlib
import itertools
import logging
import threading
import time
import weakref
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import Any, Literal, Protocol, TypeVar

try:
    from opentelemetry import context as _context
    from opentelemetry import metrics as _metrics
    from opentelemetry import trace as _trace
except ImportError:  # the extra is not installed: telemetry stays off
    _context = _metrics = _trace = None  # type: ignore[assignment]

ThreadIds = Literal["hash", "plain", "omit"]
# Every operation this package traces, by the name its span and points carry.
OPERATIONS = frozenset({
    "get_tuple", "list", "put", "put_writes", "delete_thread", "delete_for_runs", "copy_thread",
    "prune", "put_batch", "write_rows", "flush", "repair", "sweep", "migrate_threads"})
SCOPE = "langgraph_ckpt_ext"
# Seconds; the bucket boundaries the semantic conventions advise for operation durations.
_DURATION_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1.0, 5.0, 10.0)

F = TypeVar("F", bound=Callable[..., Any])
_log = logging.getLogger("langgraph_ckpt_ext.telemetry")

# What the wrappers report as they stand (observable gauges): name -> (unit, description).
GAUGES = {
    "lgckpt.smart.buffered": ("{item}", "Checkpoints and writes a SmartCheckpointer holds"),
    "lgckpt.smart.oldest_unflushed_age": ("s", "Seconds its oldest buffered item has waited"),
    "lgckpt.replica.queue_depth": ("{operation}", "Writes queued for a replica"),
    "lgckpt.replica.lag": ("s", "Seconds the oldest write not yet on a replica has waited"),
    "lgckpt.replica.up": ("1", "1 when a replica answers, 0 when it is down"),
}
_instances = itertools.count(1)

# What the maintenance operations did, as counters: (operation, its count) -> metric name.
TALLIES = {
    ("sweep", "lgckpt.threads_deleted"): "lgckpt.sweep.threads_deleted",
    ("sweep", "lgckpt.threads_trimmed"): "lgckpt.sweep.threads_trimmed",
    ("sweep", "lgckpt.checkpoints_deleted"): "lgckpt.sweep.checkpoints_deleted",
    ("migrate_threads", "lgckpt.threads_migrated"): "lgckpt.migration.threads_migrated",
    ("migrate_threads", "lgckpt.checkpoints_migrated"): "lgckpt.migration.checkpoints_migrated",
    ("repair", "lgckpt.checkpoints_copied"): "lgckpt.repair.checkpoints_copied",
    ("repair", "lgckpt.writes_copied"): "lgckpt.repair.writes_copied",
    ("repair", "lgckpt.threads_rebuilt"): "lgckpt.repair.threads_rebuilt",
}


class Observed(Protocol):
    """A wrapper whose state the gauges read (`Telemetry.watch`)."""

    def _observations(self) -> Iterable[tuple[str, float, dict[str, Any]]]:
        """(gauge name, value, attributes) for each gauge it reports."""


class Telemetry:
    """Where a checkpointer's spans and metric points go, and what they show.

    Args:
        tracer_provider: an OpenTelemetry `TracerProvider`; None: the global one, from the
            moment one is set.
        meter_provider: a `MeterProvider`; None: the global one, likewise.
        thread_ids: how spans show a thread id: `"hash"` (default: `lgckpt.thread.id_hash`,
            16 hex digits of its SHA-256), `"plain"` (`lgckpt.thread.id`), or `"omit"`.
        enabled: False: no spans, no metrics, whatever is configured.
        spans: the operations that are spans (names of `OPERATIONS`, as `{"put", "flush"}`);
            None (default): all. Every operation records its metric points either way. A span
            costs far more than a point (tens of microseconds in the Python SDK): leaving out
            the ones of every step (`get_tuple`, `put_writes`) is how to trace for less.

    Example:
        >>> from opentelemetry.sdk.trace import TracerProvider           # doctest: +SKIP
        >>> cp = SQLiteCheckpointer("agent.db",                           # doctest: +SKIP
        ...                         telemetry=Telemetry(tracer_provider=TracerProvider()))
    """

    OPERATIONS = OPERATIONS

    def __init__(self, *, tracer_provider: Any = None, meter_provider: Any = None,
                 thread_ids: ThreadIds = "hash", enabled: bool = True,
                 spans: Iterable[str] | None = None) -> None:
        if thread_ids not in ("hash", "plain", "omit"):
            raise ValueError(f"thread_ids must be 'hash', 'plain' or 'omit', not {thread_ids!r}")
        if isinstance(spans, str):
            raise TypeError(f"spans must be a collection of operation names, not {spans!r}")
        self.spans = OPERATIONS if spans is None else frozenset(spans)
        if unknown := self.spans - OPERATIONS:
            raise ValueError(f"spans names unknown operations {sorted(unknown)}; "
                             f"known: {sorted(OPERATIONS)}")
        self.thread_ids: ThreadIds = thread_ids
        self.enabled = enabled and _trace is not None
        self._tracer_provider, self._meter_provider = tracer_provider, meter_provider
        self._tracer: Any = None
        self._instruments: _Instruments | None = None

    @property
    def on(self) -> bool:
        """Whether operations are traced or measured now."""
        return self.tracing or self.measuring

    @property
    def tracing(self) -> bool:
        """Whether operations are spans now (a tracer provider given, or the global one set)."""
        return self.enabled and (self._tracer_provider is not None or _tracer_configured())

    @property
    def measuring(self) -> bool:
        """Whether operations record metric points now (likewise, for meter providers)."""
        return self.enabled and (self._meter_provider is not None or _meter_configured())

    @property
    def tracer(self) -> Any:
        if self._tracer is None:
            provider = self._tracer_provider or _trace.get_tracer_provider()
            self._tracer = provider.get_tracer(SCOPE, _version())
        return self._tracer

    @property
    def instruments(self) -> _Instruments:
        if self._instruments is None:
            self._instruments = _instruments_of(self._meter_provider)
        return self._instruments

    def watch(self, source: Observed) -> None:
        """Report `source`'s gauges while it lives (with the global providers, from the
        moment they are set)."""
        if self.enabled:
            self.instruments.watched.add(source)

    def thread_attributes(self, thread_id: str | None) -> dict[str, str]:
        if thread_id is None or self.thread_ids == "omit":
            return {}
        if self.thread_ids == "plain":
            return {"lgckpt.thread.id": thread_id}
        return {"lgckpt.thread.id_hash": _thread_hash(thread_id)}

    def span(self, system: str | None, name: str, thread_id: str | None,
             attributes: dict[str, Any] | None = None, start_time: int | None = None) -> Any:
        """The client span `<name> <system>` of an operation, started (not made current);
        None when `name` is not traced as a span now."""
        if name not in self.spans or not self.tracing:
            return None
        return self.tracer.start_span(
            f"{name} {system or 'lgckpt'}", kind=_trace.SpanKind.CLIENT, start_time=start_time,
            attributes={**_common(system, name), **self.thread_attributes(thread_id),
                        **(attributes or {})})

    def operation(self, system: str | None, name: str, thread_id: str | None,
                  attributes: dict[str, Any] | None = None) -> Operation:
        """A span for one operation (current while it runs, so that what it calls nests
        under it) and its metric points when it ends, error or not: a context manager."""
        return Operation(self, system, name, thread_id, attributes)

    async def listing(self, system: str | None, thread_id: str | None,
                      items: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """`list`: a span over the whole iteration, with the checkpoints it returned. Not made
        current: an async generator's steps may run in different contexts."""
        common = _common(system, "list")
        span = self.span(system, "list", thread_id)
        instruments = self.instruments if self.measuring else None
        start, returned = time.perf_counter(), 0
        error: str | None = None
        try:
            async for item in items:
                returned += 1
                yield item
        except BaseException as exc:
            if not isinstance(exc, GeneratorExit):  # the caller stopped early: no error
                error = _error_type(exc)
                if span is not None:
                    _failed(span, error, exc)
            raise
        finally:
            noted = {"db.response.returned_rows": returned}
            if span is not None:
                span.set_attributes(noted)
                span.end()
            if instruments is not None:
                instruments.record(common, noted, time.perf_counter() - start, error)


_TALLIED = {op for op, _ in TALLIES}


def instance_name(source: object) -> str:
    """A name for a wrapper's gauges (`lgckpt.instance`), unique in this process."""
    return f"{type(source).__name__}-{next(_instances)}"


def telemetry_of(option: Telemetry | bool | None) -> Telemetry:
    """A checkpointer's `telemetry` option as a `Telemetry` (None or True: the global
    providers; False: off), the defaults shared by every checkpointer."""
    if isinstance(option, Telemetry):
        return option
    if option is None or isinstance(option, bool):
        return _DEFAULTS[option is not False]
    raise TypeError(f"telemetry must be a Telemetry, True, False or None, not {option!r}")


class Operation:
    """One traced operation (`Telemetry.operation`), and what it notes while it runs
    (`note`, `count`). A class rather than a generator: it runs for every operation."""

    __slots__ = ("_common", "_context", "_instruments", "_span", "_start", "_token", "noted")

    def __init__(self, telemetry: Telemetry, system: str | None, name: str,
                 thread_id: str | None, attributes: dict[str, Any] | None) -> None:
        self._common = _common(system, name)
        self.noted: dict[str, Any] = {}
        self._instruments = telemetry.instruments if telemetry.measuring else None
        self._span = telemetry.span(system, name, thread_id, attributes)

    def __enter__(self) -> Operation:
        if self._span is not None:
            self._context = _context.attach(_trace.set_span_in_context(self._span))
        self._token = _current.set(self)
        self._start = time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        seconds = time.perf_counter() - self._start
        _current.reset(self._token)
        span, noted = self._span, self.noted
        error = None if exc is None else _error_type(exc)
        if span is not None:
            _context.detach(self._context)
            if noted:
                span.set_attributes(noted)
            if error is not None:
                _failed(span, error, exc)
            span.end()
        if self._instruments is not None:
            self._instruments.record(self._common, noted, seconds, error)


def _failed(span: Any, error: str, exc: BaseException | None = None,
            message: str | None = None) -> None:
    """Mark `span` failed with `error` (the exception's type): the exception as an event
    (`exc`, or only its `message` when it was raised in another process), status ERROR."""
    span.set_attribute("error.type", error)
    if exc is not None:
        span.record_exception(exc)
    else:
        span.add_event("exception", {"exception.type": error,
                                     "exception.message": message or ""})
    span.set_status(_trace.Status(_trace.StatusCode.ERROR, error))


# An operation done in another process (`Recording`), as it is sent here: name, system,
# thread id, start (ns since the epoch), seconds, what it noted, error type and message.
Record = tuple[str, str | None, str | None, int, float, dict[str, Any], str | None, str | None]


class Recording(Telemetry):
    """The telemetry of a process that has no providers of its own (the replicator
    process): each operation, while `recording` is true, is handed to `sink` as a `Record`
    for the process that has them to `replay`."""

    def __init__(self, sink: Callable[[Record], None]) -> None:
        super().__init__()
        self.sink, self.recording = sink, False

    @property
    def on(self) -> bool:
        return self.recording and self.enabled

    def operation(self, system: str | None, name: str, thread_id: str | None,
                  attributes: dict[str, Any] | None = None) -> Operation:
        return _Recorded(self, system, name, thread_id)


class _Recorded(Operation):
    __slots__ = ("_at", "_name", "_sink", "_system", "_thread")

    def __init__(self, telemetry: Recording, system: str | None, name: str,
                 thread_id: str | None) -> None:
        self._sink, self._system, self._name, self._thread = (
            telemetry.sink, system, name, thread_id)
        self.noted = {}

    def __enter__(self) -> Operation:
        self._token = _current.set(self)
        self._at, self._start = time.time_ns(), time.perf_counter()
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None,
                 tb: Any) -> None:
        seconds = time.perf_counter() - self._start
        _current.reset(self._token)
        self._sink((self._name, self._system, self._thread, self._at, seconds, self.noted,
                    None if exc is None else _error_type(exc),
                    None if exc is None else str(exc)[:500]))


def replay(telemetry: Telemetry, record: Record, attributes: dict[str, Any]) -> None:
    """A `Record` of another process as a span (its own start and end; a root: what caused
    it ran in this process and ended before) and metric points, with `attributes` added.
    Never raises: a record that cannot be shown is dropped (the caller is replication's
    reader thread, which must go on)."""
    try:
        _replay(telemetry, record, attributes)
    except Exception:
        _log.debug("a record of the replicator process could not be traced", exc_info=True)


def _replay(telemetry: Telemetry, record: Record, attributes: dict[str, Any]) -> None:
    name, system, thread_id, at, seconds, noted, error, message = record
    end = at + int(seconds * 1e9)
    span = telemetry.span(system, name, thread_id, {**attributes, **noted}, start_time=at)
    if span is not None:
        if error is not None:
            _failed(span, error, message=message)
        span.end(end_time=end)
    if telemetry.measuring:
        telemetry.instruments.record(_common(system, name), noted, seconds, error)


_current: contextvars.ContextVar[Operation | None] = contextvars.ContextVar(
    "lgckpt_operation", default=None)


def note(**attributes: Any) -> None:
    """Set attributes (`namespace_depth=1` as `lgckpt.namespace_depth`) of the operation
    running, if one is traced."""
    op = _current.get()
    if op is not None:
        op.noted.update({f"lgckpt.{k}": v for k, v in attributes.items()})


def count(**amounts: int) -> None:
    """Add to counts (`rows=3` to `lgckpt.rows`) of the operation running, if one is traced:
    a batch adds up what each of its parts wrote."""
    op = _current.get()
    if op is not None:
        noted = op.noted
        for k, v in amounts.items():
            key = f"lgckpt.{k}"
            noted[key] = noted.get(key, 0) + v


def tracing() -> bool:
    """Whether a traced operation is running in this context (worth computing a note for)."""
    return _current.get() is not None


_made: weakref.WeakKeyDictionary[Any, _Instruments] = weakref.WeakKeyDictionary()
_global: list[_Instruments] = []
_making = threading.Lock()


def _instruments_of(provider: Any) -> _Instruments:
    """The instruments on `provider`'s meter (None: the global one's), made once per provider:
    every `Telemetry` on it records into the same ones (a meter refuses an instrument made
    twice)."""
    with _making:
        made = _made.get(provider) if provider is not None else (_global[0] if _global else None)
        if made is None:
            # the global: the API's meter, a proxy until a provider is set, then delegating
            meter = (provider.get_meter(SCOPE, _version()) if provider is not None
                     else _metrics.get_meter(SCOPE, _version()))
            made = _Instruments(meter)
            if provider is None:
                _global.append(made)
            else:
                _made[provider] = made
        return made


class _Instruments:
    def __init__(self, meter: Any) -> None:
        self.watched: weakref.WeakSet[Any] = weakref.WeakSet()

        def reader(gauge: str) -> Callable[[Any], list[Any]]:
            def read(_: Any) -> list[Any]:
                return [_metrics.Observation(v, a) for v, a in self._observe(gauge)]
            return read

        self.gauges = [meter.create_observable_gauge(name, [reader(name)], unit, description)
                       for name, (unit, description) in GAUGES.items()]
        self.duration = meter.create_histogram(
            "db.client.operation.duration", unit="s",
            description="Duration of checkpointer operations",
            explicit_bucket_boundaries_advisory=list(_DURATION_BUCKETS))
        # Written bytes and rows come with every write: added up here, and reported as
        # cumulative totals when the reader collects (two instruments less per operation).
        self._written: dict[tuple[str | None, str], list[int]] = {}
        self._adding = threading.Lock()

        def written(index: int) -> Callable[[Any], list[Any]]:
            def read(_: Any) -> list[Any]:
                with self._adding:
                    totals = [(key, t[index]) for key, t in self._written.items()]
                return [_metrics.Observation(v, _common(*key)) for key, v in totals if v]
            return read

        self.bytes = meter.create_observable_counter(
            "lgckpt.bytes_written", [written(0)], unit="By",
            description="Bytes of rows written (checkpoints, blobs, writes), before encryption")
        self.rows = meter.create_observable_counter(
            "lgckpt.rows_written", [written(1)], unit="{row}", description="Rows written")
        # What sweeps, migrations and repairs did: added up likewise, one counter each.
        self._tallies: dict[tuple[str, str | None], int] = {}

        def tally(metric: str) -> Callable[[Any], list[Any]]:
            def read(_: Any) -> list[Any]:
                with self._adding:
                    totals = [(system, v) for (m, system), v in self._tallies.items()
                              if m == metric]
                return [_metrics.Observation(v, {} if system is None
                                             else {"db.system.name": system})
                        for system, v in totals]
            return read

        self.tallies = [meter.create_observable_counter(metric, [tally(metric)])
                        for metric in TALLIES.values()]
        self.returned = meter.create_histogram(
            "db.client.response.returned_rows", unit="{row}",
            description="Checkpoints a read returned")
        self.errors = meter.create_counter(
            "lgckpt.operation.errors", unit="{error}",
            description="Operations that raised, by error.type")
        self.retries = meter.create_counter(
            "lgckpt.retries", unit="{retry}",
            description="Calls retried after a lost connection (the operation's retries)")

    def _observe(self, gauge: str) -> Iterator[tuple[float, dict[str, Any]]]:
        for source in list(self.watched):
            try:
                observed = list(source._observations())
            except Exception:  # a wrapper being closed: reading its gauges must not fail
                continue
            for name, value, attributes in observed:
                if name == gauge:
                    yield value, attributes

    def record(self, common: dict[str, Any], noted: dict[str, Any], seconds: float,
               error: str | None) -> None:
        attrs = common if error is None else {**common, "error.type": error}
        self.duration.record(seconds, attrs)
        if "lgckpt.retries" in noted:
            self.retries.add(noted["lgckpt.retries"], attrs)
        if error is not None:
            self.errors.add(1, attrs)
            return
        operation, system = common["db.operation.name"], common.get("db.system.name")
        if operation in _TALLIED:
            with self._adding:
                for (op, name), metric in TALLIES.items():
                    if op == operation and noted.get(name):
                        tallied = (metric, system)
                        self._tallies[tallied] = self._tallies.get(tallied, 0) + noted[name]
        if "lgckpt.bytes" in noted:
            key = (system, operation)
            with self._adding:
                totals = self._written.get(key)
                if totals is None:
                    totals = self._written[key] = [0, 0]
                totals[0] += noted["lgckpt.bytes"]
                totals[1] += noted.get("lgckpt.rows", 0)
        if "db.response.returned_rows" in noted:
            self.returned.record(noted["db.response.returned_rows"], common)


def traced(name: str, thread: Callable[..., str | None],
           report: Callable[[Any], dict[str, int]] | None = None) -> Callable[[F], F]:
    """An async saver method as a traced operation (`thread(*args, **kwargs)`: the thread id
    it touches, from its arguments; `report(result)`: counts of what it did); a plain call
    when the saver's telemetry is off."""
    def wrap(method: F) -> F:
        @functools.wraps(method)
        async def run(self: Any, *args: Any, **kwargs: Any) -> Any:
            telemetry: Telemetry = self.telemetry
            if not telemetry.on:
                return await method(self, *args, **kwargs)
            with telemetry.operation(self.db_system, name, _safely(thread, args, kwargs)):
                result = await method(self, *args, **kwargs)
                if report is not None:
                    count(**report(result))
                return result

        return run  # type: ignore[return-value]

    return wrap


def config_thread(config: Any, *_: Any, **__: Any) -> str | None:
    """The thread id of a method whose first argument is a config."""
    try:
        return str(config["configurable"]["thread_id"])
    except (KeyError, TypeError):
        return None


def first_thread(thread_id: Any, *_: Any, **__: Any) -> str | None:
    """The thread id of a method whose first argument is one."""
    return None if thread_id is None else str(thread_id)


def batch_thread(ops: Any, *_: Any, **__: Any) -> str | None:
    """The thread of a batch's first op (`aput_batch`: a flush is one thread's)."""
    return config_thread(ops[0][1]) if ops else None


def rows_thread(items: Any, *_: Any, **__: Any) -> str | None:
    """The thread of a batch of rows' first item."""
    if not items:
        return None
    return str(items[0][0].thread_id)  # (checkpoint row, blobs), or a list of write rows


def no_thread(*_: Any, **__: Any) -> None:
    return None


def _safely(thread: Callable[..., str | None], args: tuple[Any, ...], kwargs: dict[str, Any]
            ) -> str | None:
    try:
        return thread(*args, **kwargs)
    except Exception:  # a bad argument: the method itself says what is wrong
        return None


@functools.lru_cache(maxsize=256)
def _common(system: str | None, name: str) -> dict[str, Any]:
    """The attributes every point of an operation carries (one dict per operation and
    system: never changed by its users)."""
    attrs: dict[str, Any] = {"db.operation.name": name}
    if system is not None:
        attrs["db.system.name"] = system
    return attrs


@functools.lru_cache(maxsize=4096)
def _thread_hash(thread_id: str) -> str:
    """16 hex digits of a thread id's SHA-256 (a run's operations ask for the same ones)."""
    return hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _error_type(exc: BaseException) -> str:
    return type(exc).__qualname__


def _tracer_configured() -> bool:
    """Whether an application set the global tracer provider (the API hands out proxies
    until then). Once set, it stays: the answer is kept then."""
    global _tracer_known
    if not _tracer_known:
        _tracer_known = _tracer_set()
    return _tracer_known


def _meter_configured() -> bool:
    """Likewise, the global meter provider."""
    global _meter_known
    if not _meter_known:
        _meter_known = _meter_set()
    return _meter_known


_tracer_known = _meter_known = False


def _flag(module: Any, name: str, fallback: Callable[[], bool]) -> Callable[[], bool]:
    """A cheap test of whether a global provider was set: the API's set-once guard's flag
    (read, never changed); `fallback`, a look at the provider, where that guard differs."""
    once: Any = getattr(module, name, None)
    if isinstance(getattr(once, "_done", None), bool):
        return lambda: bool(once._done)
    return fallback


def _tracer_set() -> bool:
    return not isinstance(_trace.get_tracer_provider(), _trace.ProxyTracerProvider)


def _meter_set() -> bool:
    return type(_metrics.get_meter_provider()).__name__ != "_ProxyMeterProvider"


if _trace is not None:
    _tracer_set = _flag(_trace, "_TRACER_PROVIDER_SET_ONCE", _tracer_set)
    try:
        from opentelemetry.metrics import _internal as _metrics_internal
    except ImportError:  # pragma: no cover - another layout of the API
        pass
    else:
        _meter_set = _flag(_metrics_internal, "_METER_PROVIDER_SET_ONCE", _meter_set)


@functools.cache
def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langgraph-ckpt-ext")
    except PackageNotFoundError:
        return "0"


_DEFAULTS = {True: Telemetry(), False: Telemetry(enabled=False)}
