"""Retention policies and what the sweeper, erasure and the thread lifecycle rows are made of.

One vocabulary on every backend: a `Retention` says when a thread expires (idle since its
last write, or its last read with `refresh_on_read`; since it was created; not written since
a date) and what then happens to it (`"delete"`, or `"keep_latest"`: the thread stays, its
history is cut to each namespace's newest checkpoint), and may cap every thread's history at
its newest `keep` checkpoints per namespace. LangGraph Platform's `checkpointer.ttl` settings
map onto it (`Retention.from_platform`).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeGuard, cast

from .errors import InvalidConfigError

STRATEGIES = ("delete", "keep_latest")


def _seconds(value: Any, name: str) -> float | None:
    """A positive, finite duration in seconds (a number or a `timedelta`), or None."""
    if value is None:
        return None
    if isinstance(value, dt.timedelta):
        value = value.total_seconds()
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InvalidConfigError(
            f"retention {name} must be a number of seconds or a timedelta, not {value!r}")
    if not math.isfinite(value) or value <= 0:
        raise InvalidConfigError(
            f"retention {name} must be a positive duration, not {value!r} seconds")
    return float(value)


def _instant(value: Any, name: str) -> float | None:
    """A point in time as seconds since the epoch: a `datetime` (naive means UTC), an ISO 8601
    text, or a number of seconds."""
    if value is None:
        return None
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value)
        except ValueError:
            raise InvalidConfigError(
                f"retention {name} must be a date (ISO 8601), not {value!r}") from None
    if isinstance(value, dt.datetime):
        if value.tzinfo is None:
            value = value.replace(tzinfo=dt.timezone.utc)
        return float(value.timestamp())
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise InvalidConfigError(f"retention {name} must be a datetime, not {value!r}")
    return float(value)


@dataclass(frozen=True)
class Retention:
    """When a thread expires, and what expiring does to it.

    Args:
        idle: seconds (or a `timedelta`) a thread lives after its last write; with
            `refresh_on_read`, after its last write or read, whichever came last.
        absolute: seconds a thread lives after its first write, whatever happens since.
        older_than: a date (`datetime`, ISO 8601 text or epoch seconds): threads not written
            since expire.
        strategy: what expiry does: `"delete"` removes the thread (all namespaces, pending
            writes, migration log); `"keep_latest"` keeps each namespace's newest checkpoint,
            with what its `DeltaChannel`s need to rebuild their values (as `prune` does).
        keep: keep at most the newest N checkpoints of each namespace of every thread
            (expired or not; a checkpoint a kept one's `DeltaChannel`s need stays too).
        refresh_on_read: a read (`get_tuple`, `get_state`) counts as activity for `idle`.
        delete_paused: expire threads paused at an `interrupt()` too (by default the sweeper
            keeps them whole, waiting for their human).

    With none of `idle`, `absolute`, `older_than` and `keep` set, nothing expires (a
    per-thread override that keeps a thread forever, as `pin` does).
    """

    idle: float | dt.timedelta | None = None
    absolute: float | dt.timedelta | None = None
    older_than: float | dt.datetime | str | None = None
    strategy: str = "delete"
    keep: int | None = None
    refresh_on_read: bool = False
    delete_paused: bool = False

    def __post_init__(self) -> None:
        set_ = object.__setattr__  # normalized once, here: the fields hold plain numbers
        set_(self, "idle", _seconds(self.idle, "idle"))
        set_(self, "absolute", _seconds(self.absolute, "absolute"))
        set_(self, "older_than", _instant(self.older_than, "older_than"))
        if self.strategy not in STRATEGIES:
            raise InvalidConfigError(
                f"unknown retention strategy {self.strategy!r}: use 'delete' or 'keep_latest'")
        if self.keep is not None and (
            isinstance(self.keep, bool) or not isinstance(self.keep, int) or self.keep < 1
        ):
            raise InvalidConfigError(
                f"retention keep must be a whole number of checkpoints >= 1, not {self.keep!r}")
        for name in ("refresh_on_read", "delete_paused"):
            if not isinstance(getattr(self, name), bool):
                raise InvalidConfigError(f"retention {name} must be True or False")

    @property
    def expires(self) -> bool:
        """Whether this policy ever expires a thread."""
        return self.idle is not None or self.absolute is not None or self.older_than is not None

    def expired(self, state: ThreadState, now: float) -> bool:
        """Whether the thread `state` describes has expired at `now` (epoch seconds)."""
        last = state.written_at
        if self.refresh_on_read and state.read_at is not None:
            last = max(last, state.read_at)
        idle, absolute, older = self.seconds
        return bool(
            (idle is not None and now - last >= idle)
            or (absolute is not None and now - state.created_at >= absolute)
            or (older is not None and last < older)
        )

    @property
    def seconds(self) -> tuple[float | None, float | None, float | None]:
        """`idle`, `absolute` (seconds) and `older_than` (epoch seconds), as normalized."""
        return cast(tuple[float | None, float | None, float | None],
                    (self.idle, self.absolute, self.older_than))

    # -- the stored form of a per-thread override --------------------------------------------

    def to_json(self) -> str:
        return json.dumps(
            {k: v for k, v in self.__dict__.items() if v not in (None, False)}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Retention:
        try:
            data = json.loads(text)
            if not isinstance(data, dict):
                raise TypeError(type(data).__name__)
            return cls(**data)
        except (ValueError, TypeError) as exc:
            raise InvalidConfigError(f"stored retention policy {text[:80]!r} is invalid: {exc}"
                                     ) from None

    @classmethod
    def coerce(cls, value: Retention | Mapping[str, Any] | None) -> Retention | None:
        """A policy from a `Retention`, a mapping of its fields, or LangGraph Platform's
        `checkpointer.ttl` mapping (see `from_platform`)."""
        if value is None or isinstance(value, Retention):
            return value
        if not isinstance(value, Mapping):
            raise InvalidConfigError(
                f"retention must be a Retention or a mapping, not {type(value).__name__}")
        if is_platform(value):
            return cls.from_platform(value)[0]
        unknown = set(value) - set(cls.__dataclass_fields__)
        if unknown:
            raise InvalidConfigError(f"unknown retention option(s): {', '.join(sorted(unknown))}")
        return cls(**value)

    @classmethod
    def from_platform(cls, ttl: Mapping[str, Any]) -> tuple[Retention, SweepSchedule]:
        """LangGraph Platform's `checkpointer.ttl` (as in `langgraph.json`) as ours:
        `strategy` (`"delete"` or `"keep_latest"`), `default_ttl` (minutes since the thread's
        last write: our `idle`), `sweep_interval_minutes` and `sweep_limit` (the schedule of
        the background sweeper).

        Example:
            >>> policy, schedule = Retention.from_platform(
            ...     {"strategy": "delete", "default_ttl": 60 * 24, "sweep_interval_minutes": 10})
            >>> policy.idle, schedule.interval
            (86400.0, 600.0)
        """
        if not isinstance(ttl, Mapping):
            raise InvalidConfigError(f"checkpointer ttl must be a mapping, not {ttl!r}")
        unknown = set(ttl) - set(PLATFORM_KEYS)
        if unknown:
            raise InvalidConfigError(
                f"unknown checkpointer ttl key(s): {', '.join(sorted(unknown))} (known: "
                f"{', '.join(PLATFORM_KEYS)})")
        minutes = ttl.get("default_ttl")
        idle = None if minutes is None else _seconds(minutes, "default_ttl (minutes)")
        interval = ttl.get("sweep_interval_minutes", DEFAULT_SWEEP_MINUTES)
        policy = cls(idle=None if idle is None else idle * 60,
                     strategy=ttl.get("strategy", "delete"))
        schedule = SweepSchedule(
            interval=float(_seconds(interval, "sweep_interval_minutes") or 0) * 60,
            limit=ttl.get("sweep_limit"))
        return policy, schedule


PLATFORM_KEYS = ("strategy", "default_ttl", "sweep_interval_minutes", "sweep_limit")


def is_platform(value: object) -> TypeGuard[Mapping[str, Any]]:
    """Whether `value` is LangGraph Platform's `checkpointer.ttl` mapping rather than our
    fields: it names one of the keys only the Platform's has (`strategy` is in both)."""
    return isinstance(value, Mapping) and any(k in value for k in PLATFORM_KEYS[1:])
DEFAULT_SWEEP_MINUTES = 5  # LangGraph Platform's default sweep interval


@dataclass(frozen=True)
class SweepSchedule:
    """How often the background sweeper runs (seconds) and how many threads a pass may
    change (None: all it finds)."""

    interval: float
    limit: int | None = None

    def __post_init__(self) -> None:
        _seconds(self.interval, "sweep interval")
        check_limit(self.limit)


def check_limit(limit: Any) -> int | None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 1):
        raise InvalidConfigError(f"sweep limit must be a whole number >= 1 or None, not {limit!r}")
    return limit


@dataclass(frozen=True, slots=True)
class ThreadState:
    """A thread's lifecycle row, as a store keeps it beside the thread's checkpoints.

    Every write to the thread (a checkpoint, pending writes, a schema migration) raises
    `generation`; `written_at` is the time of the last checkpoint or pending write,
    `created_at` of the first. A thread's row goes with the thread (`delete_thread`)."""

    thread_id: str
    created_at: float
    written_at: float
    read_at: float | None = None
    generation: int = 0
    pinned: bool = False
    policy: str | None = None
    """The thread's own `Retention`, as `Retention.to_json` (None: the checkpointer's)."""
    swept: int | None = None
    """The generation the sweeper last cut this thread's history at (nothing to cut again
    until a write raises `generation` past it)."""

    def written(self, now: float, activity: bool = True) -> ThreadState:
        """This row after a write at `now` (`activity`: a checkpoint or pending writes, which
        move `written_at`). Made field by field, not by `dataclasses.replace` (several
        microseconds, at every write): a field added above goes here too."""
        return ThreadState(self.thread_id, self.created_at,
                           now if activity else self.written_at, self.read_at,
                           self.generation + 1, self.pinned, self.policy, self.swept)


@dataclass(frozen=True, slots=True)
class LifecycleEvent:
    """A deletion the store records (erasures always, sweeps and prunes when the store is
    audited): what was deleted and when, never what it held. The thread is named by its
    digest (`thread_digest`), so the record does not keep an erased id in the clear."""

    at: float
    action: str
    """`"erase"`, `"expire"` (deleted by the sweeper) or `"trim"` (history cut)."""
    thread: str
    """`thread_digest(thread_id)`."""
    checkpoints: int
    reason: str = ""


def thread_digest(thread_id: str) -> str:
    """How lifecycle records name a thread: the first 32 hex digits of its id's SHA-256."""
    return hashlib.sha256(thread_id.encode("utf-8", "surrogatepass")).hexdigest()[:32]


@dataclass
class SweepReport:
    """What one sweep pass did."""

    at: float
    examined: int = 0
    deleted: list[str] = field(default_factory=list)
    """Threads deleted (strategy `"delete"`)."""
    trimmed: dict[str, int] = field(default_factory=dict)
    """Threads whose history was cut: thread id -> checkpoints deleted."""
    checkpoints_deleted: int = 0
    paused: list[str] = field(default_factory=list)
    """Expired threads kept because they wait at an `interrupt()`."""
    pinned: int = 0
    busy: list[str] = field(default_factory=list)
    """Threads written while the pass looked at them: skipped, left whole."""
    locked_out: bool = False
    """Another sweeper held the store's sweep lock: this pass did nothing."""
    more: bool = False
    """The pass stopped at its `limit`: the next one goes on."""
    dry_run: bool = False
    tombstones_dropped: int = 0
    """Tombstones of deleted threads older than the checkpointer's `tombstone_ttl` removed."""

    def __str__(self) -> str:
        if self.locked_out:
            return "sweep: another sweeper is running on this store; nothing done"
        verb = "would delete" if self.dry_run else "deleted"
        parts = [f"sweep: {self.examined} thread(s) examined",
                 f"{verb} {len(self.deleted)} thread(s)",
                 f"cut the history of {len(self.trimmed)} thread(s) "
                 f"({self.checkpoints_deleted} checkpoint(s) in all)"]
        if self.paused:
            parts.append(f"kept {len(self.paused)} paused at an interrupt")
        if self.busy:
            parts.append(f"skipped {len(self.busy)} being written")
        if self.pinned:
            parts.append(f"{self.pinned} pinned")
        if self.tombstones_dropped:
            parts.append(f"removed {self.tombstones_dropped} expired tombstone(s)")
        if self.more:
            parts.append("stopped at its limit (run again to go on)")
        return "; ".join(parts)


@dataclass
class ErasureReport:
    """What an erasure deleted (or, as a dry run, would delete): threads and counts, never
    their content."""

    at: float
    where: list[str]
    """The metadata keys matched (their values are not kept)."""
    threads: list[str] = field(default_factory=list)
    checkpoints: int = 0
    dry_run: bool = False

    def __str__(self) -> str:
        verb = "would erase" if self.dry_run else "erased"
        when = dt.datetime.fromtimestamp(self.at, dt.timezone.utc).isoformat(timespec="seconds")
        return (f"{when} {verb} {len(self.threads)} thread(s), {self.checkpoints} "
                f"checkpoint(s), matching metadata {', '.join(self.where)}")


__all__ = [
    "ErasureReport",
    "LifecycleEvent",
    "Retention",
    "SweepReport",
    "SweepSchedule",
    "ThreadState",
    "thread_digest",
]
