"""`Checkpointer`: the core saver with the methods of the layers above it (time travel,
`verify`, `migrate_threads`), the base class of every backend's public checkpointer."""

from __future__ import annotations

from ..core.saver import StoreCheckpointer
from ..migrations.methods import Migrating
from ..timetravel.methods import TimeTravel, Verifying


class Checkpointer(StoreCheckpointer, TimeTravel, Verifying, Migrating):
    """A `StoreCheckpointer` that also offers the time-travel helpers as methods
    (`history`, `inspect`, `diff`, `fork`, `replay`, `lineage`), `verify` and
    `migrate_threads`."""
