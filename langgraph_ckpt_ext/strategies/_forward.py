"""What the two wrappers share: the helpers of this package's checkpointers (`sizes`, `verify`,
`migrate_threads`, ...), which each wrapper passes to the checkpointer it wraps in its own way
(`_forward`: the smart one writes its buffer first, the replicated one goes to its primary);
`with` / `async with` (`Closing`); and a listing written once for `list` and `alist`
(`either_each`, `iterate_closing`)."""

from __future__ import annotations

import builtins
from collections.abc import AsyncGenerator, AsyncIterable, Callable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, TypeVar, cast

from langgraph.checkpoint.base import BaseCheckpointSaver

from ..core.bridge import iterate_inline, run_inline

if TYPE_CHECKING:
    from ..core.audit import AuditStatus
    from ..core.rotation import RotationProgress, RotationReport
    from ..core.rows import MigrationEntry, StoredSize
    from ..migrations.runner import MigrationProgress, MigrationReport
    from ..timetravel.audit import AuditReport

P = ParamSpec("P")
T = TypeVar("T")
W = TypeVar("W", bound="Closing")


def store_method(saver: BaseCheckpointSaver[Any], name: str, role: str) -> Callable[..., Any]:
    """`saver.<name>`, or `NotImplementedError` saying what it needs (`role`: where the wrapper
    holds `saver`, e.g. "inner")."""
    method = getattr(saver, name, None)
    if not callable(method):
        raise NotImplementedError(
            f"{name}() needs one of this package's checkpointers as the {role} checkpointer; "
            f"{type(saver).__name__} has no {name}()")
    return cast(Callable[..., Any], method)


def not_forwarded(wrapper: object, saver: object | None, attr: str, name: str, bypassed: str
                  ) -> AttributeError:
    """The error of a wrapper's `__getattr__`: for a public method of `saver`, the checkpointer
    it holds as `attr` (None while it is being built), that it does not forward (calling it
    there bypasses `bypassed`), where to call it."""
    kind = type(wrapper).__name__
    if name.startswith("_") or saver is None or not callable(getattr(type(saver), name, None)):
        return AttributeError(f"{kind!r} object has no attribute {name!r}")
    return AttributeError(
        f"{kind} does not forward {name}() (it would bypass {bypassed}): call "
        f"checkpointer.{attr}.{name}(...) on the {type(saver).__name__} it wraps")


class Forwarded:
    """Mixed into the wrappers: the helpers `StoreCheckpointer` has beyond the saver
    interface, each passed on by `_forward(name, threads, *args)`, where `threads` are the
    threads whose stored rows it reads or rewrites (None: every thread; empty: none)."""

    def _forward(self, name: str, threads: Sequence[str] | None, *args: Any, **kwargs: Any
                 ) -> Any:
        raise NotImplementedError

    async def _aforward(self, name: str, threads: Sequence[str] | None, *args: Any,
                        **kwargs: Any) -> Any:
        raise NotImplementedError

    def thread_ids(self) -> builtins.list[str]:
        """Every thread id that holds a checkpoint, sorted."""
        return cast(builtins.list[str], self._forward("thread_ids", None))

    async def athread_ids(self) -> builtins.list[str]:
        return cast(builtins.list[str], await self._aforward("athread_ids", None))

    def sizes(self, thread_id: str) -> builtins.list[StoredSize]:
        """What a thread takes in storage (see `StoreCheckpointer.sizes`)."""
        return cast("builtins.list[StoredSize]", self._forward("sizes", [thread_id], thread_id))

    async def asizes(self, thread_id: str) -> builtins.list[StoredSize]:
        return cast("builtins.list[StoredSize]",
                    await self._aforward("asizes", [thread_id], thread_id))

    def prune_plan(self, thread_id: str, *, strategy: str = "keep_latest"
                   ) -> builtins.list[tuple[str, str]]:
        """What `prune` would delete now (see `StoreCheckpointer.prune_plan`)."""
        return cast(builtins.list[tuple[str, str]],
                    self._forward("prune_plan", [thread_id], thread_id, strategy=strategy))

    async def aprune_plan(self, thread_id: str, *, strategy: str = "keep_latest"
                          ) -> builtins.list[tuple[str, str]]:
        return cast(builtins.list[tuple[str, str]], await self._aforward(
            "aprune_plan", [thread_id], thread_id, strategy=strategy))

    def verify(self, thread_id: str) -> AuditReport:
        """Check a thread's audit chain against storage (see `StoreCheckpointer.verify`)."""
        return cast("AuditReport", self._forward("verify", [thread_id], thread_id))

    async def averify(self, thread_id: str) -> AuditReport:
        return cast("AuditReport", await self._aforward("averify", [thread_id], thread_id))

    def storage_version(self) -> int:
        """The storage version in force (see `StoreCheckpointer.storage_version`)."""
        return cast(int, self._forward("storage_version", ()))

    async def astorage_version(self) -> int:
        return cast(int, await self._aforward("astorage_version", ()))

    def audit_status(self) -> AuditStatus:
        """Whether the store is audited, with its audit log (see
        `StoreCheckpointer.audit_status`)."""
        return cast("AuditStatus", self._forward("audit_status", ()))

    async def aaudit_status(self) -> AuditStatus:
        return cast("AuditStatus", await self._aforward("aaudit_status", ()))

    def enable_audit(self, *, reason: str = "enable_audit()") -> AuditStatus:
        """Turn auditing on for the store (see `StoreCheckpointer.enable_audit`); a
        `SmartCheckpointer` writes its buffer first."""
        return cast("AuditStatus", self._forward("enable_audit", None, reason=reason))

    async def aenable_audit(self, *, reason: str = "enable_audit()") -> AuditStatus:
        return cast("AuditStatus", await self._aforward("aenable_audit", None, reason=reason))

    def disable_audit(self, *, reason: str) -> AuditStatus:
        """Turn the store's auditing off, with a reason (see
        `StoreCheckpointer.disable_audit`); a `SmartCheckpointer` writes its buffer first."""
        return cast("AuditStatus", self._forward("disable_audit", None, reason=reason))

    async def adisable_audit(self, *, reason: str) -> AuditStatus:
        return cast("AuditStatus", await self._aforward("adisable_audit", None, reason=reason))

    def migration_log(self, thread_id: str | None = None) -> builtins.list[MigrationEntry]:
        """The state-schema migrations stored checkpoints went through (see
        `StoreCheckpointer.migration_log`)."""
        return cast("builtins.list[MigrationEntry]",
                    self._forward("migration_log", (), thread_id))

    async def amigration_log(self, thread_id: str | None = None
                             ) -> builtins.list[MigrationEntry]:
        return cast("builtins.list[MigrationEntry]",
                    await self._aforward("amigration_log", (), thread_id))

    def migrate_threads(
        self, thread_ids: Sequence[str] | None = None, *, dry_run: bool = False,
        progress: Callable[[MigrationProgress], None] | None = None, concurrency: int = 4,
        include_unstamped: bool = False,
    ) -> MigrationReport:
        """Rewrite stored checkpoints older than the schema chain's current version (see
        `StoreCheckpointer.migrate_threads`)."""
        return cast("MigrationReport", self._forward(
            "migrate_threads", _threads(thread_ids), thread_ids, dry_run=dry_run,
            progress=progress, concurrency=concurrency, include_unstamped=include_unstamped))

    async def amigrate_threads(
        self, thread_ids: Sequence[str] | None = None, *, dry_run: bool = False,
        progress: Callable[[MigrationProgress], None] | None = None, concurrency: int = 4,
        include_unstamped: bool = False,
    ) -> MigrationReport:
        return cast("MigrationReport", await self._aforward(
            "amigrate_threads", _threads(thread_ids), thread_ids, dry_run=dry_run,
            progress=progress, concurrency=concurrency, include_unstamped=include_unstamped))

    def rotate_keys(
        self, thread_ids: Sequence[str] | None = None, *, dry_run: bool = False,
        progress: Callable[[RotationProgress], None] | None = None, concurrency: int = 4,
    ) -> RotationReport:
        """Seal every stored value under its tenant's current key, in place (see
        `StoreCheckpointer.rotate_keys`)."""
        return cast("RotationReport", self._forward(
            "rotate_keys", _threads(thread_ids), thread_ids, dry_run=dry_run,
            progress=progress, concurrency=concurrency))

    async def arotate_keys(
        self, thread_ids: Sequence[str] | None = None, *, dry_run: bool = False,
        progress: Callable[[RotationProgress], None] | None = None, concurrency: int = 4,
    ) -> RotationReport:
        return cast("RotationReport", await self._aforward(
            "arotate_keys", _threads(thread_ids), thread_ids, dry_run=dry_run,
            progress=progress, concurrency=concurrency))


def _threads(thread_ids: Sequence[str] | None) -> Sequence[str] | None:
    """The threads a call names (a string is refused by the call itself: none here)."""
    return () if isinstance(thread_ids, str) else thread_ids


async def either_each(
    sync: bool,
    call: Callable[P, Iterable[T]],
    acall: Callable[P, AsyncIterable[T]],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> AsyncGenerator[T, None]:
    """`core.bridge.either` for a listing: the items of `call` when `sync` (iterated without
    suspending: a sync entry point drives the generator with `iterate_inline`), else those of
    `acall`."""
    if sync:
        for item in call(*args, **kwargs):
            yield item
    else:
        async for item in acall(*args, **kwargs):
            yield item


def iterate_closing(agen: AsyncGenerator[T, None]) -> Iterator[T]:
    """A sync listing: an async generator that never suspends, driven from sync code
    (`iterate_inline`), and closed when the caller stops early, not left to the garbage
    collector or to a running event loop's async-generator hooks."""
    try:
        yield from iterate_inline(agen)
    finally:
        run_inline(_aclose(agen))


async def _aclose(agen: AsyncGenerator[Any, None]) -> None:
    await agen.aclose()


class Closing:
    """`with` and `async with` a wrapper: `close()` / `aclose()` on exit."""

    def close(self) -> None:
        raise NotImplementedError

    async def aclose(self) -> None:
        raise NotImplementedError

    def __enter__(self: W) -> W:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self: W) -> W:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
