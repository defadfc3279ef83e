"""What the user reads of replication: `status()` (health and lag) and `repair()` reports."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class ReplicaStatus:
    """One replica's health and lag (`checkpointer.status()`)."""

    name: str
    up: bool
    queued: int
    """Operations waiting to be applied."""
    oldest_unreplicated_age: float
    """Seconds the oldest waiting operation has waited (0 when none)."""
    applied: int
    """Operations applied so far."""
    failures: int
    """Failed attempts so far (each retried, or the thread marked for repair)."""
    last_error: str | None
    needs_repair: bool
    """Operations were dropped (queue overflow, or the replica refused one): run `repair()`."""
    threads_to_repair: int
    fenced: bool = False
    """It refused this node's writes as fenced off (`FencedError`): another node promoted it,
    this node's primary was demoted, and this node's writes are refused."""


@dataclass
class ReplicationStatus:
    primary_up: bool
    primary_error: str | None
    replicas: list[ReplicaStatus]

    def __str__(self) -> str:
        lines = [f"primary: {'up' if self.primary_up else 'DOWN'}"
                 + (f" ({self.primary_error})" if self.primary_error else "")]
        for r in self.replicas:
            lines.append(
                f"{r.name}: {'up' if r.up else 'DOWN'}, {r.queued} queued, oldest "
                f"{r.oldest_unreplicated_age:.2f} s, {r.applied} applied, {r.failures} failed"
                + (", needs repair" if r.needs_repair else "")
                + (", FENCED (this node's primary was demoted)" if r.fenced else "")
                + (f", last error: {r.last_error}" if r.last_error else "")
            )
        return "\n".join(lines)


@dataclass
class ReplicaRepair:
    """What `repair()` did on one replica."""

    name: str
    threads_checked: int = 0
    threads_equal: int = 0
    checkpoints_copied: int = 0
    writes_copied: int = 0
    threads_rebuilt: list[str] = field(default_factory=list)
    """Threads deleted on the replica and copied whole (it held checkpoints or writes the
    primary does not, or different ones)."""
    threads_deleted: list[str] = field(default_factory=list)
    """Threads the primary no longer holds."""
    threads_skipped: list[str] = field(default_factory=list)
    """Threads with writes still queued for the replica: compared again next time."""
    threads_failed: dict[str, str] = field(default_factory=dict)
    """Threads whose repair failed, with why (the others were repaired)."""
    error: str | None = None
    """Why the repair of this replica stopped (it is resumed by running `repair()` again)."""


@dataclass
class RepairReport:
    replicas: list[ReplicaRepair]
    seconds: float

    @property
    def clean(self) -> bool:
        """True when every replica was already equal to the primary."""
        return all(
            r.error is None and not (r.checkpoints_copied or r.writes_copied
                                     or r.threads_rebuilt or r.threads_deleted
                                     or r.threads_failed)
            for r in self.replicas
        )

    def summary(self) -> str:
        lines = []
        for r in self.replicas:
            lines.append(
                f"{r.name}: {r.threads_checked} threads checked, {r.threads_equal} equal, "
                f"{r.checkpoints_copied} checkpoints and {r.writes_copied} writes copied, "
                f"{len(r.threads_rebuilt)} rebuilt, {len(r.threads_deleted)} deleted, "
                f"{len(r.threads_skipped)} skipped (busy)"
                + (f", {len(r.threads_failed)} failed" if r.threads_failed else "")
                + (f"; stopped: {r.error}" if r.error else "")
            )
        lines.append(f"{self.seconds:.2f} s")
        return "\n".join(lines)
