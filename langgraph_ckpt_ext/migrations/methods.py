"""`migrate_threads` as a method of the public checkpointers (`Migrating`, mixed into each
backend's class over `StoreCheckpointer`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..core.config import check_ids
from ..core.errors import InvalidConfigError
from ..core.saver import StoreCheckpointer
from ..core.telemetry import no_thread, traced
from .runner import MigrationProgress, MigrationReport, migrate_threads


class Migrating:
    """Mixed into the backends' checkpointers (subclasses of `StoreCheckpointer`)."""

    def _own(self) -> StoreCheckpointer:
        if not isinstance(self, StoreCheckpointer):  # pragma: no cover - a wrong mix
            raise TypeError(f"{type(self).__name__} mixes in Migrating without StoreCheckpointer")
        return self

    def migrate_threads(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[MigrationProgress], None] | None = None,
        concurrency: int = 4,
        include_unstamped: bool = False,
    ) -> MigrationReport:
        """Rewrite stored checkpoints older than `schema_chain.current` (of every thread, or of
        `thread_ids`) to the current version: values, channel versions and pending writes.

        Only the chain's own threads are rewritten: those whose newest checkpoint with a chain
        name carries `schema_chain.name`. `include_unstamped=True` adds the threads with no
        name at all (written with no chain, or before chains had names), which are then
        stamped with the name; an unnamed chain needs it. A thread of another chain's name is
        never touched. Skipped threads are counted and listed in the report.

        Each checkpoint is rewritten and logged in one atomic step, at most once per version,
        so a run that was interrupted finishes the job when started again; a second run finds
        nothing to do. `dry_run` reports what would change without writing. `progress` is
        called after each thread with a `MigrationProgress`.

        Raises:
            InvalidConfigError: no `schema_chain`, or an unnamed one without
                `include_unstamped=True`.
        """
        return self._own().run_sync(
            self.amigrate_threads(
                thread_ids, dry_run=dry_run, progress=progress, concurrency=concurrency,
                include_unstamped=include_unstamped,
            )
        )

    @traced("migrate_threads", no_thread, lambda r: {
        "threads_seen": r.threads_seen, "threads_migrated": r.threads_migrated,
        "checkpoints_migrated": r.checkpoints_migrated, "writes_migrated": r.writes_migrated})
    async def amigrate_threads(
        self,
        thread_ids: Sequence[str] | None = None,
        *,
        dry_run: bool = False,
        progress: Callable[[MigrationProgress], None] | None = None,
        concurrency: int = 4,
        include_unstamped: bool = False,
    ) -> MigrationReport:
        saver = self._own()
        if saver.schema_chain is None:
            raise InvalidConfigError(
                "migrate_threads needs the state schema's chain: pass schema_chain=SchemaChain("
                "current, upcasters) to the checkpointer"
            )
        if isinstance(thread_ids, str):
            raise InvalidConfigError("thread_ids is a list of thread ids, not one string")
        if thread_ids is not None:
            thread_ids = check_ids(thread_ids, "thread_id", required=True)
        return await migrate_threads(
            saver, saver.schema_chain, thread_ids,
            dry_run=dry_run, progress=progress, concurrency=concurrency,
            include_unstamped=include_unstamped,
        )
