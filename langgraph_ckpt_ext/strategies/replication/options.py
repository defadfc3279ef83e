"""The options of a `ReplicatedCheckpointer`, checked before anything starts, and the
replicas as given (a checkpointer, or a URL with options for the replicator process)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from langgraph.checkpoint.base import BaseCheckpointSaver

from ...core.errors import InvalidConfigError
from ...core.urls import parse_url

Consistency = Literal["async", "quorum", "anti_entropy"]
MODES = ("async", "quorum", "anti_entropy")

ReplicaArg = BaseCheckpointSaver[Any] | str | tuple[str, dict[str, Any]]
"""A replica as the caller gives it: a checkpointer, a URL, or (url, options for `connect`)."""
ReplicaSpec = BaseCheckpointSaver[Any] | tuple[str, dict[str, Any]]
"""A replica once checked: a checkpointer, or (url, options) for the replicator process."""


@dataclass(frozen=True)
class Options:
    """The checked options (see `ReplicatedCheckpointer` for each)."""

    consistency: Consistency
    quorum: int
    max_queue: int
    max_wait: float
    quorum_timeout: float
    repair_interval: float
    full_repair_every: int
    failover_reads: bool
    promote: bool
    retry_primary_after: float
    linger: float


def check(primary: Any, given: Sequence[ReplicaArg], names: Sequence[str] | None,
          consistency: str, *, quorum: int, max_queue: int, max_wait: float,
          quorum_timeout: float, repair_interval: float, full_repair_every: int,
          failover_reads: bool, promote: bool, retry_primary_after: float, linger: float
          ) -> tuple[Options, list[ReplicaSpec], list[str]]:
    """The options, the replicas and a name for each; `InvalidConfigError` for the first
    that is wrong."""
    if not isinstance(primary, BaseCheckpointSaver):
        raise InvalidConfigError(f"primary must be a BaseCheckpointSaver, got {primary!r}")
    replicas = [replica_spec(r) for r in given]
    for r in replicas:
        if r is primary:
            raise InvalidConfigError("a replica is the primary itself: replicas must be "
                                     "other checkpointers")
    if len({id(r) for r in replicas}) != len(replicas):
        raise InvalidConfigError("the same checkpointer is given twice as a replica")
    if consistency not in MODES:
        raise InvalidConfigError(
            f"unknown consistency {consistency!r}: use one of {', '.join(MODES)}")
    if consistency == "quorum":
        if not replicas:
            raise InvalidConfigError("consistency='quorum' needs at least one replica")
        if not 1 <= quorum <= len(replicas):
            raise InvalidConfigError(
                f"quorum={quorum} must be between 1 and the number of replicas "
                f"({len(replicas)})")
    for name, value in (("max_wait", max_wait), ("quorum_timeout", quorum_timeout),
                        ("repair_interval", repair_interval),
                        ("retry_primary_after", retry_primary_after), ("linger", linger)):
        if not value >= 0:
            raise InvalidConfigError(f"{name} must be >= 0, got {value!r}")
    if max_queue < 1:
        raise InvalidConfigError(f"max_queue must be >= 1, got {max_queue!r}")
    names = list(names) if names is not None else [f"replica-{i}" for i in range(len(replicas))]
    if len(names) != len(replicas) or len(set(names)) != len(names):
        raise InvalidConfigError("names must give each replica a different name")
    options = Options(
        cast(Consistency, consistency), quorum, max_queue, max_wait, quorum_timeout,
        repair_interval, max(1, int(full_repair_every)), failover_reads, promote,
        retry_primary_after, linger)
    return options, replicas, names


def replica_spec(r: Any) -> ReplicaSpec:
    """A replica as given: a checkpointer, or `(url, options)` for the replicator process."""
    if isinstance(r, BaseCheckpointSaver):
        return r
    if isinstance(r, str):
        r = (r, {})
    if (isinstance(r, tuple) and len(r) == 2 and isinstance(r[0], str)
            and isinstance(r[1], dict)):
        try:
            parsed = parse_url(r[0])  # refused here, not in the replicator process
            parsed.arguments(r[1])
        except InvalidConfigError as exc:
            raise InvalidConfigError(f"replica URL: {exc}") from None
        if parsed.backend == "memory":
            raise InvalidConfigError(
                f"a replica URL must be sqlite:///..., postgresql://... or redis://..., got "
                f"{parsed.redacted!r} (a memory:// replica in another process would be lost "
                "with it)")
        return r
    what = "a tuple that is not (url, options)" if isinstance(r, tuple) else repr(r)
    raise InvalidConfigError(
        f"each replica must be a BaseCheckpointSaver, a URL or (url, options), got {what}")
