"""The store's audit setting as a checkpointer reads and switches it (`audit_status`,
`enable_audit`, `disable_audit`), and the sealing of a copied thread; the hashing is
`core.audit`'s."""

from __future__ import annotations

import builtins
import dataclasses
import logging
import os
import time

from . import codec
from .audit import AuditStatus
from .base import SaverBase
from .errors import InvalidConfigError
from .rows import AuditSwitch, ListQuery
from .store import BatchItem

_audit_logger = logging.getLogger("langgraph_ckpt_ext.audit")


class Auditing(SaverBase):
    """The audit switches of `StoreCheckpointer`."""

    audit_refresh: float = 1.0
    """Seconds this checkpointer trusts the store's audit setting it read last: a write finding
    an older reading reads it again (0: before every write). It is read at `setup()` too."""

    def audit_status(self) -> AuditStatus:
        """Whether the store is audited, with its audit log (each time auditing was turned on
        or off, when and why), read from the store now."""
        return self.run_sync(self.aaudit_status())

    async def aaudit_status(self) -> AuditStatus:
        log = await self._store.read_audit_log()
        self._audit_on, self._audit_read_at = bool(log) and log[-1].enabled, time.monotonic()
        return AuditStatus(self._audit_on, log)

    def enable_audit(self, *, reason: str = "enable_audit()") -> AuditStatus:
        """Turn auditing on for the store, recorded in it (nothing new if it is on already):
        from then on every checkpointer writing to it seals what it stores, each from its
        next reading of the setting (see `audit_refresh`). `audit=True` does this on open."""
        return self.run_sync(self.aenable_audit(reason=reason))

    async def aenable_audit(self, *, reason: str = "enable_audit()") -> AuditStatus:
        return await self._switch_audit(True, _reason(reason, "enable_audit"))

    def disable_audit(self, *, reason: str) -> AuditStatus:
        """Turn the store's auditing off: an explicit act, logged as a warning and recorded in
        the store (when, `reason`), where `verify` reports it. Checkpoints stored from then on
        are not sealed; those stored before stay verifiable. Raises `InvalidConfigError`
        without a reason.

        Example:
            >>> checkpointer.disable_audit(reason="bulk re-import, ticket 4711")  # doctest: +SKIP
        """
        return self.run_sync(self.adisable_audit(reason=reason))

    async def adisable_audit(self, *, reason: str) -> AuditStatus:
        return await self._switch_audit(False, _reason(reason, "disable_audit"))

    async def _switch_audit(self, enabled: bool, reason: str) -> AuditStatus:
        status = await self.aaudit_status()
        if status.enabled == enabled:
            return status
        if not enabled:
            _audit_logger.warning(
                "audit trail turned off for the store of %s: %s; checkpoints stored from now on "
                "are not sealed", type(self).__name__, reason)
        await self._store.log_audit_switch(AuditSwitch(enabled, time.time(), reason))
        return await self.aaudit_status()

    async def _audited(self) -> bool:
        """Whether the store is audited: its setting as read at most `audit_refresh` seconds
        ago, else read now."""
        if self._audit_on is None or time.monotonic() - self._audit_read_at >= self.audit_refresh:
            await self._read_audit()
        return bool(self._audit_on)

    async def _read_audit(self) -> None:
        """Read the store's audit setting; the first reading turns it on if `audit=True` (once:
        an explicit `disable_audit` later is not undone by this checkpointer)."""
        if self._audit_want:
            self._audit_want = False
            await self._switch_audit(
                True, f"audit=True ({type(self).__name__}, pid {os.getpid()})")
            return
        last = await self._store.read_audit_log(last=True)
        self._audit_on, self._audit_read_at = bool(last) and last[-1].enabled, time.monotonic()

    async def _reseal(self, thread_id: str) -> None:
        """Seal a thread's stored checkpoints again, as one batch (a copy of another's)."""
        rows = [r async for r in self._store.iter_checkpoints(ListQuery(thread_id=thread_id))]
        items: builtins.list[BatchItem] = []
        for row, record in await self._auditor.reseal(self.serde, rows):
            what = f"metadata of checkpoint {row.checkpoint_id!r}"
            md = {**self._metadata(row), "audit": record}
            versions = (codec.blob_keys(self._header(row)["channel_versions"])
                        if self._row_versions else None)
            items.append((dataclasses.replace(
                row, metadata=codec.dumps(self.serde, md, what), versions=versions), []))
        if items:
            await self._store.write_batch(items)


def _reason(reason: object, call: str) -> str:
    if not isinstance(reason, str) or not reason.strip():
        raise InvalidConfigError(
            f"{call} needs a reason (reason='...'), recorded in the store's audit log; got "
            f"{reason!r}")
    return reason.strip()
