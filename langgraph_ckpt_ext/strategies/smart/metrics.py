"""`Metrics`: what a `SmartCheckpointer` did so far, and what waits."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Metrics:
    """What a `SmartCheckpointer` did so far (read `checkpointer.metrics`)."""

    saves_requested: int = 0
    """Checkpoints handed to `put`."""
    writes_requested: int = 0
    """`put_writes` calls."""
    checkpoints_written: int = 0
    writes_written: int = 0
    """`put_writes` calls passed on to the inner checkpointer."""
    batches: int = 0
    """Flushes that wrote something."""
    bytes_written: int = 0
    """An estimate of the values' sizes written."""
    buffered: int = 0
    """Items waiting now."""
    buffered_bytes: int = 0
    oldest_unflushed_age: float = 0.0
    """Seconds the oldest waiting item has waited."""
    flush_failures: int = 0
    writes_refused: int = 0
    """Batches (and puts) refused as another writer got to their thread first
    (`ConcurrentWriteError`): their items were dropped, and the run that wrote them told."""
    last_error: BaseException | None = None
