"""How a write goes: to the primary first, then queued for every replica in the primary's
order; a quorum write the other way round (to the replicas first, to the primary once
`quorum` of them confirmed it), withdrawn from the replicas when it fails.

A replica applies a write later, from another thread, while LangGraph goes on; and LangGraph
changes some values in place (`add_messages` gives ids to the messages of an input or a write
once it applies them, maybe before a background put has serialized them). So the primary and
the replicas all get one copy taken when the call came: a channel's list shallowly (its items
are stored values, no longer changed), anything else through the serializer. With savers of
ours, all with LangGraph's own serializer, the primary encodes each write once instead, and
the replicas store the very rows it stored (taken when the call came: later changes in place
cannot reach bytes).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar, cast

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    copy_checkpoint,
)
from langgraph.checkpoint.serde.base import SerializerProtocol

from ...core.bridge import either
from ...core.config import thread_id_of
from ...core.errors import FencedError, QuorumUnavailableError, ReplicationError
from ...core.inner import Op as InnerOp
from ...core.inner import RowSaver
from .calls import in_thread
from .failover import Failover
from .failures import classifier, describe, foreign_unavailable, unavailable_at
from .fanout import Fanout
from .gate import Gate
from .queue import Ack, Op
from .repair import Repairs
from .worker import Replica

T = TypeVar("T")
Saver = BaseCheckpointSaver[Any]
Call = Callable[[Saver], Awaitable[T]]
Args = tuple[Any, ...] | Callable[[], tuple[Any, ...]]


class Writer:
    def __init__(self, failover: Failover, fanout: Fanout, gate: Gate, repairs: Repairs,
                 rows: bool, closed: threading.Event) -> None:
        self.failover, self.fanout, self.gate, self.repairs = failover, fanout, gate, repairs
        self.options = fanout.options
        self.rows, self.closed = rows, closed

    async def write(self, sync: bool, kind: str, call: Call[T], args: Args,
                    threads: tuple[str, ...]) -> T:
        """Write to the primary, then queue the op for the replicas (`args`: the op's, or
        what makes them once the primary is written); a quorum write the other way round."""
        self._check()
        await self.failover.learn_epoch(sync)
        if self.options.consistency == "quorum":  # values, never rows: `args` is a tuple
            return await self._quorum(sync, kind, call, cast(tuple[Any, ...], args), threads)
        await self.gate.enter(sync, threads)
        try:
            result = await self.failover.call(sync, call, write=True)
            await self.fanout.queue(sync, kind, args() if callable(args) else args, threads)
        finally:
            self.gate.leave(threads)
        return result

    def _check(self) -> None:
        """Before the primary is touched: not closed, and enough replicas up for a quorum
        write."""
        if self.closed.is_set():
            raise ReplicationError(
                "this ReplicatedCheckpointer is closed: its replicas no longer follow, so it "
                "takes no more writes (open a new one over the same checkpointers)")
        fenced = self.fanout.fenced()
        if fenced is not None:
            raise FencedError(
                "this node's primary was demoted by a failover elsewhere (a replica refused "
                f"its writes as fenced off: {describe(fenced)}); its writes are refused. Open "
                "a new ReplicatedCheckpointer with the promoted store as its primary") from fenced
        if self.options.consistency != "quorum":
            return
        views, quorum = self.fanout.views, self.options.quorum
        up = [r for r in views if r.up]
        if len(up) < quorum:
            down = ", ".join(f"{r.name} ({describe(r.last_error) if r.last_error else 'down'})"
                             for r in views if not r.up)
            raise QuorumUnavailableError(
                f"quorum write needs {quorum} replica(s) up, {len(up)} are: {down}. "
                "Nothing was written; retry once they are back, or lower quorum")

    async def _quorum(self, sync: bool, kind: str, call: Call[T], args: tuple[Any, ...],
                      threads: tuple[str, ...]) -> T:
        """A quorum write goes to the replicas first, and to the primary (where every read
        goes) only once `quorum` of them confirmed it: a write that fails its quorum is never
        seen as stored. It is then withdrawn from the replicas (`_after_failure`)."""
        self.failover.known_down()
        await self.gate.enter(sync, threads)
        failed: BaseException | None = None
        try:
            op = await self.fanout.queue(sync, kind, args, threads)
            ack = cast(Ack, op.ack)
            timeout = self.options.quorum_timeout
            try:
                if await either(sync, ack.wait, ack.await_, timeout) and ack.succeeded:
                    return await self.failover.call(sync, call, write=True)
            except BaseException as exc:
                failed = exc
            self.fanout.withdraw(op)
        finally:
            self.gate.leave(threads)
        if failed is not None and not isinstance(failed, Exception):  # cancelled: no repair
            raise failed
        raise await either(sync, self._after_failure, in_thread(self._after_failure),
                           op, failed, threads)

    def _after_failure(self, op: Op, failed: BaseException | None,
                       threads: tuple[str, ...]) -> BaseException:
        """What a failed quorum write leaves (nothing a reader of the primary sees), and the
        error to raise: `failed` (the primary's) or why the quorum was not met."""
        # Its threads repaired on the replicas that can be now, which removes it from those
        # that took it (the others stay marked for repair); not while the primary is down.
        if threads and (failed is None or (
                isinstance(failed, Exception)
                and not unavailable_at(failed, self.failover.primary))):
            with contextlib.suppress(Exception):  # reported in each replica's status
                self.repairs.run(sorted(set(threads)))
        return failed if failed is not None else self._refusal(cast(Ack, op.ack))

    def _unavailable(self, name: str, exc: BaseException) -> bool:
        """For an error replica `name` settled a quorum write with."""
        for r in self.fanout.views:
            if r.name == name and isinstance(r, Replica):
                return classifier(r.saver)(exc)
        return foreign_unavailable(exc)  # told by the replicator process (`RemoteError`)

    def _refusal(self, ack: Ack) -> BaseException:
        """Why a quorum write failed: the replicas' own error when they all refused it as a bad
        request, else `QuorumUnavailableError`."""
        if ack.errors and not any(self._unavailable(n, e) for n, e in ack.errors):
            return ack.errors[0][1]
        why = "; ".join(f"{n}: {describe(e)}" for n, e in ack.errors) or (
            f"no answer within {self.options.quorum_timeout} s")
        return QuorumUnavailableError(
            f"only {ack.ok} of the {self.options.quorum} replica(s) the quorum needs confirmed "
            f"the write ({why}), so it was not written to the primary: no read of it shows the "
            "write. Replicas that took it were repaired, or are marked for repair (`status()`, "
            "`repair()`); retry once they are back, or lower quorum")

    # -- what a put and put_writes queue -----------------------------------------------------

    # `serde`: the calling checkpointer's (a `with_allowlist` copy has its own).

    async def put(self, sync: bool, serde: SerializerProtocol, config: RunnableConfig,
                  checkpoint: Checkpoint, metadata: CheckpointMetadata,
                  new_versions: ChannelVersions) -> RunnableConfig:
        threads = (thread_id_of(config),)
        if self.rows:
            call, rows = self._rows(sync, ("put", config, checkpoint, metadata, new_versions))
            return cast(RunnableConfig, await self.write(sync, "rows", call, rows, threads))
        args = _frozen_put(serde, config, checkpoint, metadata, new_versions)
        return await self.write(sync, "put", lambda s: either(sync, s.put, s.aput, *args),
                                args, threads)

    async def put_writes(self, sync: bool, serde: SerializerProtocol, config: RunnableConfig,
                         writes: Sequence[tuple[str, Any]], task_id: str, task_path: str
                         ) -> None:
        threads = (thread_id_of(config),)
        if self.rows:
            call, rows = self._rows(sync, ("writes", config, writes, task_id, task_path))
            await self.write(sync, "rows", call, rows, threads)
            return
        args = (config, [(ch, _frozen(serde, v)) for ch, v in writes], task_id, task_path)
        await self.write(sync, "writes", lambda s: either(sync, s.put_writes, s.aput_writes,
                                                          *args), args, threads)

    def _rows(self, sync: bool, op: InnerOp) -> tuple[Call[Any], Callable[[], tuple[Any, ...]]]:
        """The primary's write of `op`, and the rows it stored for the replicas."""
        made: list[Any] = []

        async def call(s: Saver) -> Any:
            # `rows` holds only when the primary and every replica are `RowSaver`s (checked
            # once, by the checkpointer): so is whichever takes the write.
            saver = cast(RowSaver, s)
            config, rows = await either(sync, saver.write_op, saver.awrite_op, op)
            # the rows, with the epoch of the primary that took them: a replica whose epoch
            # is newer (promoted by another node) refuses them (`FencedError`)
            made.append((rows, getattr(s, "writer_epoch", None)))
            return config

        return call, lambda: made[-1]


def _frozen_put(serde: SerializerProtocol, config: RunnableConfig, checkpoint: Checkpoint,
                metadata: CheckpointMetadata, new_versions: ChannelVersions
                ) -> tuple[Any, ...]:
    checkpoint = copy_checkpoint(checkpoint)
    values = checkpoint["channel_values"]
    for ch in new_versions:
        if ch in values:
            values[ch] = _frozen(serde, values[ch])
    return (config, checkpoint, _frozen(serde, dict(metadata)), dict(new_versions))


def _frozen(serde: SerializerProtocol, value: Any) -> Any:
    """A copy of `value` that later changes in place cannot reach (a list's items too: a
    message may be changed in place and put again)."""
    if value is None or isinstance(value, str | int | float | bool | bytes):
        return value
    return serde.loads_typed(serde.dumps_typed(value))
