"""Whether a store is audited, as its audit log says."""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from ..rows import AuditSwitch


@dataclass(frozen=True)
class AuditStatus:
    """Whether a store is audited (`StoreCheckpointer.audit_status`), and its audit log."""

    enabled: bool
    log: list[AuditSwitch]
    """Each time auditing was turned on or off, oldest first (the newest is in force)."""

    @property
    def turned_off(self) -> list[AuditSwitch]:
        """The explicit turn-offs: where the trail stops being sealed."""
        return [s for s in self.log if not s.enabled]

    def __str__(self) -> str:
        head = "audit: on" if self.enabled else "audit: off"
        return "\n".join([head, *(f"  {when(s.at)} {'on ' if s.enabled else 'off'} {s.reason}"
                                  for s in self.log)])


def when(at: float) -> str:
    """A time as the audit reports show it (UTC, to the second)."""
    return dt.datetime.fromtimestamp(at, dt.timezone.utc).isoformat(timespec="seconds")
