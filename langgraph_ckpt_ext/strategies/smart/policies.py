"""Save policies for `SmartCheckpointer`: when a thread's buffered checkpoints must be written.

A policy is a small value. It answers two questions about one thread: must what is buffered be
written now (an event that matters happened), and by when at the latest (an interval)? Combine
policies with `|`: the result flushes when either would.

    EveryStep()                       write each checkpoint as it comes (LangGraph's behaviour)
    Periodic(5.0)                     at most every 5 s per thread
    OnEvents()                        at once on the events that matter, else when the run ends
    Hybrid(min_interval=1, max_interval=30)
                                      events at once; otherwise an interval that shortens while
                                      the thread is busy and lengthens while it idles
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass, field

from ...core.errors import InvalidConfigError

INTERRUPT = "interrupt"
ERROR = "error"
TOOL_CALL = "tool_call"
PLAN_CHANGE = "plan_change"
END = "end"
UPDATE = "update"
EVENTS = frozenset({INTERRUPT, ERROR, TOOL_CALL, PLAN_CHANGE, END, UPDATE})
"""interrupt: a task paused at `interrupt()`; error: a task failed; tool_call: an AI message
asking for tools was written (save before the tool runs); plan_change: a plan channel was
written; end: a run finished (the checkpoint triggers no node); update: `update_state`."""


@dataclass(frozen=True)
class ThreadActivity:
    """What a policy sees of one thread."""

    oldest_age: float
    """Seconds since the oldest buffered item of the thread was buffered."""
    buffered: int
    rate: float
    """Recent operations per second on the thread (an exponential average)."""


class Policy:
    """The base of every policy: flush on `events` at once, and no later than `deadline`."""

    events: frozenset[str] = frozenset()

    def flush_on(self, events: Iterable[str]) -> bool:
        return bool(self.events.intersection(events))

    def max_age(self, activity: ThreadActivity) -> float:
        """How long a thread's oldest buffered item may wait (inf: until an event)."""
        return math.inf

    def __or__(self, other: Policy) -> Policy:
        return AnyOf((self, other))


def _check_events(events: Iterable[str]) -> frozenset[str]:
    found = frozenset(events)
    unknown = sorted(found - EVENTS)
    if unknown:
        raise InvalidConfigError(
            f"unknown save event(s) {unknown}: use any of {sorted(EVENTS)}"
        )
    return found


def _check_interval(name: str, value: float) -> float:
    if not isinstance(value, int | float) or isinstance(value, bool) or not value >= 0 or (
        math.isnan(value)
    ):
        raise InvalidConfigError(f"{name} must be a number of seconds >= 0, got {value!r}")
    return float(value)


@dataclass(frozen=True)
class EveryStep(Policy):
    """Every checkpoint and write as it comes: no buffering at all."""

    def max_age(self, activity: ThreadActivity) -> float:
        return 0.0


@dataclass(frozen=True)
class Periodic(Policy):
    """A thread's buffer is written at most `interval` seconds after its oldest item came."""

    interval: float = 5.0

    def __post_init__(self) -> None:
        _check_interval("interval", self.interval)

    def max_age(self, activity: ThreadActivity) -> float:
        return self.interval


@dataclass(frozen=True)
class OnEvents(Policy):
    """Written at once on the named events (default: all of them); otherwise after
    `max_interval` seconds at the latest (default: never, so only events flush)."""

    events: frozenset[str] = field(default=EVENTS)
    max_interval: float | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", _check_events(self.events))
        if self.max_interval is not None:
            _check_interval("max_interval", self.max_interval)

    def max_age(self, activity: ThreadActivity) -> float:
        return math.inf if self.max_interval is None else self.max_interval


@dataclass(frozen=True)
class Hybrid(Policy):
    """Events at once; otherwise an interval between `min_interval` (a busy thread: many
    operations a second) and `max_interval` (an idle one)."""

    min_interval: float = 1.0
    max_interval: float = 30.0
    events: frozenset[str] = field(default=EVENTS)

    def __post_init__(self) -> None:
        object.__setattr__(self, "events", _check_events(self.events))
        lo = _check_interval("min_interval", self.min_interval)
        hi = _check_interval("max_interval", self.max_interval)
        if lo > hi:
            raise InvalidConfigError(
                f"min_interval ({lo}) is above max_interval ({hi})"
            )

    def max_age(self, activity: ThreadActivity) -> float:
        # At one operation a second or less the thread counts as idle; busier, the interval
        # shrinks in proportion, down to min_interval.
        return max(self.min_interval, self.max_interval / max(1.0, activity.rate))


@dataclass(frozen=True)
class AnyOf(Policy):
    """Flushes when any of `policies` would."""

    policies: tuple[Policy, ...] = ()

    def __post_init__(self) -> None:
        if not self.policies or not all(isinstance(p, Policy) for p in self.policies):
            raise InvalidConfigError("AnyOf needs one or more policies")
        object.__setattr__(
            self, "events", frozenset().union(*(p.events for p in self.policies))
        )

    def flush_on(self, events: Iterable[str]) -> bool:
        ev = list(events)
        return any(p.flush_on(ev) for p in self.policies)

    def max_age(self, activity: ThreadActivity) -> float:
        return min(p.max_age(activity) for p in self.policies)
