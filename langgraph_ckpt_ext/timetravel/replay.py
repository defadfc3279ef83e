"""`replay`: what happened between two checkpoints of a thread, from stored data alone; `rerun`:
going on from a checkpoint through the graph; `ab_test`: N variants, each on a fork of one
checkpoint, with their final states and the differences between them."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from dataclasses import dataclass, field
from itertools import combinations, pairwise
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.types import Command

from ..core.chain import ParentWalk
from ..core.errors import InvalidConfigError
from ._answers import answered, asked
from ._base import (
    CheckpointNotFoundError,
    ids_of,
    must_get,
    run_sync,
    sync_view,
    thread_config,
)
from .fork import afork_copy

_PSEUDO_NODES = frozenset({"__input__", "__interrupt__"})


@dataclass(frozen=True)
class TaskRun:
    """One task of a step: its node (when known) and what it wrote, per channel (a list: a
    task may write a channel more than once), LangGraph's routing channels left out."""

    task_id: str
    node: str | None
    writes: dict[str, list[Any]]


@dataclass(frozen=True)
class Transition:
    """One step between two stored checkpoints of a thread."""

    step: int | None
    source: str | None
    from_checkpoint: str
    to_checkpoint: str
    nodes: tuple[str, ...]
    """The nodes that ran in this step."""
    tasks: tuple[TaskRun, ...]

    def __str__(self) -> str:
        writes = "; ".join(
            f"{t.node or t.task_id[:8]}: {', '.join(sorted(t.writes))}" for t in self.tasks
        )
        return f"step {self.step}: {', '.join(self.nodes) or '-'}" + (f" ({writes})" if writes
                                                                      else "")


def _ran(before: CheckpointTuple, after: CheckpointTuple) -> tuple[str, ...]:
    """Nodes that ran between two consecutive checkpoints: those whose `versions_seen` moved
    (LangGraph records, for each node that runs, the versions of the channels it read)."""
    old = before.checkpoint.get("versions_seen") or {}
    new = after.checkpoint.get("versions_seen") or {}
    return tuple(sorted(
        n for n, seen in new.items() if n not in _PSEUDO_NODES and seen != old.get(n)
    ))


def _tasks(tup: CheckpointTuple, nodes: tuple[str, ...],
           names: Mapping[str, str]) -> tuple[TaskRun, ...]:
    by_task: dict[str, dict[str, list[Any]]] = {}
    for task_id, channel, value in tup.pending_writes or ():
        writes = by_task.setdefault(task_id, {})
        if not channel.startswith("branch:"):  # LangGraph's own routing, not the node's output
            writes.setdefault(channel, []).append(value)
    only = nodes[0] if len(nodes) == 1 and len(by_task) == 1 else None
    return tuple(TaskRun(t, names.get(t) or only, w) for t, w in by_task.items())


async def areplay(
    saver: BaseCheckpointSaver[Any],
    start: RunnableConfig,
    end: RunnableConfig | None = None,
    *,
    graph: Any = None,
) -> list[Transition]:
    """The transitions from checkpoint `start` to checkpoint `end` (default: the thread's
    latest) of one thread, oldest first: per step, the nodes that ran and each task's writes
    per channel. Nothing is executed. With `graph` (the compiled graph), every task is named
    by its node; without it, a task is named when its step ran one node."""
    first = await must_get(saver, start)
    thread_id, ns, _ = ids_of(first.config)
    last = await must_get(saver, end or thread_config(thread_id, ns))
    if ids_of(last.config)[:2] != (thread_id, ns):
        raise InvalidConfigError("replay runs within one thread and namespace: start and end "
                                 "name different ones")
    chain = [last]
    walk = ParentWalk(thread_id, ns)  # a tampered parent link must not loop forever
    walk.visit(last.checkpoint["id"])
    while chain[-1].checkpoint["id"] != first.checkpoint["id"]:
        parent = chain[-1].parent_config
        tup = None if parent is None else await saver.aget_tuple(parent)
        if tup is None:
            raise CheckpointNotFoundError(
                f"checkpoint {first.checkpoint['id']!r} is not an ancestor of "
                f"{last.checkpoint['id']!r} in thread {thread_id!r}"
            )
        walk.visit(tup.checkpoint["id"])
        chain.append(tup)
    chain.reverse()
    out = []
    for before, after in pairwise(chain):
        names: dict[str, str] = {}
        if graph is not None:
            snapshot = await graph.aget_state(before.config)
            names = {t.id: t.name for t in snapshot.tasks}
        nodes = _ran(before, after)
        md = after.metadata or {}
        step, source = md.get("step"), md.get("source")
        out.append(Transition(
            step=step if isinstance(step, int) else None,
            source=source if isinstance(source, str) else None,
            from_checkpoint=before.checkpoint["id"],
            to_checkpoint=after.checkpoint["id"],
            nodes=nodes,
            tasks=_tasks(before, nodes, names),
        ))
    return out


def replay(
    saver: BaseCheckpointSaver[Any],
    start: RunnableConfig,
    end: RunnableConfig | None = None,
    *,
    graph: Any = None,
) -> list[Transition]:
    saver = sync_view(saver)
    return run_sync(saver, areplay(saver, start, end, graph=graph))


def rerun(graph: Any, config: RunnableConfig, input: Any = None, **kwargs: Any) -> Any:
    """Run the graph on from a stored checkpoint (as LangGraph does with a `checkpoint_id`):
    with `input=None` it continues from there; the new checkpoints branch off that one.

    Raises:
        InvalidConfigError: `input` is a `Command(resume=...)` at a checkpoint whose questions
            were all answered: LangGraph would replay the stored answers, not this one (fork
            there instead: `fork(..., resume=...)`).
    """
    if _answers(input) and isinstance(saver := graph.checkpointer, BaseCheckpointSaver):
        view = sync_view(saver)
        _check_answer(config, run_sync(view, must_get(view, config)))
    return graph.invoke(input, config, **kwargs)


async def arerun(graph: Any, config: RunnableConfig, input: Any = None, **kwargs: Any) -> Any:
    if _answers(input) and isinstance(saver := graph.checkpointer, BaseCheckpointSaver):
        _check_answer(config, await must_get(saver, config))
    return await graph.ainvoke(input, config, **kwargs)


def _answers(input: Any) -> bool:
    return isinstance(input, Command) and input.resume is not None


def _check_answer(config: RunnableConfig, tup: CheckpointTuple) -> None:
    writes = tup.pending_writes or []
    if asked(writes) and asked(writes) <= answered(writes):
        raise InvalidConfigError(
            f"checkpoint {tup.checkpoint['id']!r} of thread {ids_of(config)[0]!r} was answered "
            "already, and LangGraph would run on with the stored answer, not this one: fork "
            "the thread there with the new answer (fork(saver, config, resume=..., graph=...) "
            "or ab_test with Variant(resume=...))"
        )


# -- A/B forks -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """One arm of an A/B run: an input (None: go on from the checkpoint) or the `resume`
    answer to the interrupt the checkpoint waits at, config to merge (e.g.
    `{"configurable": {"model": "small", "temperature": 0.2}}`), and values to apply to the
    fork first (as `update_state`, optionally `as_node`). Each arm's fork of a checkpoint where
    the graph asked a human waits for its own answer, whatever the source was answered."""

    input: Any = None
    config: Mapping[str, Any] | None = None
    values: Mapping[str, Any] | None = None
    as_node: str | None = None
    thread_id: str | None = None
    """The fork's thread id (default: `<source>~<variant>-<random>`)."""
    resume: Any = None
    """The arm's answer: runs it with `Command(resume=resume)`."""

    def __post_init__(self) -> None:
        if self.resume is not None and self.input is not None:
            raise InvalidConfigError(
                "a Variant takes input or resume, not both: pass "
                "input=Command(resume=..., update=...) to answer and update at once"
            )

    def run_input(self) -> Any:
        """What the arm's run is invoked with."""
        return self.input if self.resume is None else Command(resume=self.resume)


@dataclass
class VariantRun:
    name: str
    thread_id: str
    values: dict[str, Any] | None
    error: BaseException | None = None


@dataclass
class ABResult:
    """The final state of every variant, each on its own fork of `origin`."""

    origin: RunnableConfig
    runs: dict[str, VariantRun] = field(default_factory=dict)

    def diff(self, a: str, b: str) -> Any:
        """The structured difference between the final states of variants `a` and `b`."""
        from .statediff import diff_values

        va, vb = self.runs[a].values, self.runs[b].values
        if va is None or vb is None:
            failed = a if va is None else b
            raise ValueError(f"variant {failed!r} failed: {self.runs[failed].error!r}")
        return diff_values(va, vb, labels=(a, b))

    @property
    def diffs(self) -> dict[tuple[str, str], Any]:
        """The difference between every pair of variants that finished."""
        done = [n for n, r in self.runs.items() if r.values is not None]
        return {(a, b): self.diff(a, b) for a, b in combinations(done, 2)}


def _variant(v: Variant | Mapping[str, Any]) -> Variant:
    return v if isinstance(v, Variant) else Variant(**v)


def _merge(base: RunnableConfig, extra: Mapping[str, Any] | None) -> RunnableConfig:
    extra = dict(extra or {})
    conf = {**(extra.pop("configurable", None) or {}), **base["configurable"]}
    return {**extra, "configurable": conf}  # type: ignore[typeddict-item]


def _fork_name(origin: RunnableConfig, name: str) -> str:
    import uuid

    return f"{ids_of(origin)[0]}~{name}-{uuid.uuid4().hex[:6]}"


def ab_test(
    graph: Any, config: RunnableConfig, variants: Mapping[str, Variant | Mapping[str, Any]]
) -> ABResult:
    """Run each variant on its own fork of the checkpoint `config` names (the thread's latest
    without a checkpoint id) and collect the final states. The source thread is untouched; a
    variant that fails is reported in its run, the others go on."""
    saver = sync_view(_saver(graph))
    arms = {name: _variant(v) for name, v in variants.items()}
    origin = run_sync(saver, must_get(saver, config)).config
    result = ABResult(origin)
    for name, v in arms.items():
        fork = run_sync(saver, afork_copy(saver, origin, v.thread_id or _fork_name(origin, name)))
        thread = ids_of(fork)[0]
        try:
            if v.values is not None:
                fork = graph.update_state(fork, dict(v.values), as_node=v.as_node)
            graph.invoke(v.run_input(), _merge(fork, v.config))
            final = graph.get_state(thread_config(thread)).values
            result.runs[name] = VariantRun(name, thread, dict(final))
        except Exception as exc:
            result.runs[name] = VariantRun(name, thread, None, exc)
    return result


async def aab_test(
    graph: Any, config: RunnableConfig, variants: Mapping[str, Variant | Mapping[str, Any]]
) -> ABResult:
    """Async `ab_test`: the variants run concurrently."""
    saver = _saver(graph)
    arms = {name: _variant(v) for name, v in variants.items()}
    origin = (await must_get(saver, config)).config
    result = ABResult(origin)

    async def run(name: str, v: Variant) -> VariantRun:
        fork = await afork_copy(saver, origin, v.thread_id or _fork_name(origin, name))
        thread = ids_of(fork)[0]
        try:
            if v.values is not None:
                fork = await graph.aupdate_state(fork, dict(v.values), as_node=v.as_node)
            await graph.ainvoke(v.run_input(), _merge(fork, v.config))
            final = (await graph.aget_state(thread_config(thread))).values
            return VariantRun(name, thread, dict(final))
        except Exception as exc:
            return VariantRun(name, thread, None, exc)

    runs = await asyncio.gather(*(run(n, v) for n, v in arms.items()))
    result.runs = {r.name: r for r in runs}
    return result


def _saver(graph: Any) -> BaseCheckpointSaver[Any]:
    saver = getattr(graph, "checkpointer", None)
    if not isinstance(saver, BaseCheckpointSaver):
        raise InvalidConfigError("time travel through a graph needs a graph compiled with a "
                                 "checkpointer")
    return saver
