"""`fork`: a new thread holding a thread's history up to one checkpoint; `lineage`: the tree of
forks a thread belongs to.

A fork copies the source's chain of checkpoints up to the fork point (every ancestor, with its
pending writes, and the subgraph checkpoints written meanwhile) through the ordinary
`BaseCheckpointSaver` interface, so it works on any saver. The copy of the fork point carries
the link to its origin in its metadata:

    fork_of        the source thread id
    fork_checkpoint  the source checkpoint id
    fork_thread    the fork's own thread id (copies of the fork point into later forks keep the
                   link of their own fork, which this tells apart)
    forked_at      when (ISO 8601, UTC)

A fork point where the graph waited for a human who has since answered is copied as it was
while it waited (see `_answers`): the fork waits at that interrupt for an answer of its own.
"""

from __future__ import annotations

import html
import unicodedata
import uuid
from collections import defaultdict
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import BaseCheckpointSaver, CheckpointTuple
from langgraph.types import Command

from ..core.chain import ParentWalk
from ..core.config import check_id
from ..core.errors import InvalidConfigError
from ._answers import asked, reopen
from ._base import (
    ThreadExistsError,
    ThreadNotFoundError,
    ids_of,
    must_get,
    run_sync,
    sync_view,
    thread_config,
    thread_exists,
)


async def _chain(saver: BaseCheckpointSaver[Any], head: CheckpointTuple) -> list[CheckpointTuple]:
    """`head` and its ancestors, oldest first."""
    chain = [head]
    thread_id, ns, _ = ids_of(head.config)
    walk = ParentWalk(thread_id, ns)  # a tampered parent link must not loop forever
    walk.visit(head.checkpoint["id"])
    while chain[-1].parent_config is not None:
        parent = await saver.aget_tuple(chain[-1].parent_config)
        if parent is None:
            break  # the history was pruned below here: the copy starts at the oldest kept
        walk.visit(parent.checkpoint["id"])
        chain.append(parent)
    chain.reverse()
    return chain


async def _put_chain(
    saver: BaseCheckpointSaver[Any],
    target: str,
    chain: list[CheckpointTuple],
    marks: Mapping[str, Mapping[str, Any]],
) -> None:
    """Put `chain` (one namespace, oldest first) under thread `target`, each checkpoint with its
    pending writes; `marks` adds metadata to the checkpoints it names."""
    previous: Mapping[str, Any] = {}
    parent: str | None = None
    for tup in chain:
        _, ns, _ = ids_of(tup.config)
        cp = tup.checkpoint
        versions = cp["channel_versions"]
        # Only what moved since the previous copy: the rest is stored under the same version.
        new_versions = {ch: v for ch, v in versions.items() if previous.get(ch) != v}
        metadata = {**(tup.metadata or {}), **marks.get(cp["id"], {})}
        conf = thread_config(target, ns, parent)
        stored = await saver.aput(conf, cp, metadata, new_versions)  # type: ignore[arg-type]
        by_task: dict[str, list[tuple[str, Any]]] = defaultdict(list)
        for task_id, channel, value in tup.pending_writes or ():
            by_task[task_id].append((channel, value))
        # task paths keep the stored order of the writes (LangGraph applies them in that order)
        for i, (task_id, writes) in enumerate(by_task.items()):
            await saver.aput_writes(stored, writes, task_id, f"~{i:06d}")
        previous, parent = versions, cp["id"]


def _subgraph_part(tups: list[CheckpointTuple], point: str, step_end: str | None
                   ) -> list[CheckpointTuple]:
    """What a fork at `point` copies of one subgraph namespace, oldest first: its checkpoints
    up to the fork point, and, when the subgraph waited for a human during the step that
    starts there (its checkpoints then come after `point`, before `step_end`), those up to
    the one where it waited, reopened as `fork` reopens the fork point."""
    tups = sorted(tups, key=lambda t: t.checkpoint["id"])
    before = [t for t in tups if t.checkpoint["id"] <= point]
    step = [t for t in tups
            if t.checkpoint["id"] > point and (step_end is None or t.checkpoint["id"] < step_end)]
    waited = next((i for i, t in enumerate(step) if asked(t.pending_writes or ())), None)
    if waited is None:
        return before
    paused = step[waited]
    return [*before, *step[:waited],
            paused._replace(pending_writes=reopen(paused.pending_writes or []))]


async def afork_copy(
    saver: BaseCheckpointSaver[Any],
    config: RunnableConfig,
    new_thread_id: str | None = None,
) -> RunnableConfig:
    """The copy part of `fork` (no graph needed): returns the fork point's config."""
    if new_thread_id is not None:
        check_id(new_thread_id, "new_thread_id", required=True)
    source = await must_get(saver, config)
    src_thread, src_ns, _ = ids_of(source.config)
    if src_ns:
        raise InvalidConfigError(
            f"fork a thread at a checkpoint of its root graph, not of subgraph {src_ns!r}"
        )
    target = new_thread_id or f"{src_thread}~{uuid.uuid4().hex[:8]}"
    if not isinstance(target, str) or not target:
        raise InvalidConfigError(f"new_thread_id must be a non-empty string, got {target!r}")
    if target == src_thread or await thread_exists(saver, target):
        raise ThreadExistsError(
            f"thread {target!r} already holds checkpoints: fork onto a new thread id (or "
            "delete that thread first)"
        )
    point = source.checkpoint["id"]
    chain = await _chain(saver, source)
    # the answer to a question asked here belongs to the source: the fork asks again
    chain[-1] = source._replace(pending_writes=reopen(source.pending_writes or []))
    children: dict[str, list[CheckpointTuple]] = defaultdict(list)
    later: list[str] = []  # root checkpoints after the fork point: the first ends its step
    async for tup in saver.alist({"configurable": {"thread_id": src_thread}}):
        _, ns, cid = ids_of(tup.config)
        if cid is not None and ns:
            children[ns].append(tup)
        elif cid is not None and cid > point:
            later.append(cid)
    step_end = min(later, default=None)
    children = {ns: _subgraph_part(tups, point, step_end) for ns, tups in children.items()}
    mark = {
        "fork_of": src_thread,
        "fork_checkpoint": point,
        "fork_thread": target,
        "forked_at": datetime.now(timezone.utc).isoformat(),
    }
    try:
        await _put_chain(saver, target, chain, {point: mark})
        for ns in sorted(children):
            await _put_chain(saver, target, sorted(children[ns], key=lambda t: t.checkpoint["id"]), {})
    except BaseException:
        await saver.adelete_thread(target)  # no half fork left behind
        raise
    return thread_config(target, "", point)


# -- lineage -----------------------------------------------------------------------------------


@dataclass
class ForkNode:
    """A thread in a fork tree: where it was forked from, and its own forks."""

    thread_id: str
    forked_from: tuple[str, str] | None = None
    """(source thread id, source checkpoint id), None for the tree's root."""
    forked_at: str | None = None
    forked_step: int | None = None
    """The step of the source checkpoint the fork starts from."""
    children: list[ForkNode] = field(default_factory=list)

    def walk(self) -> list[ForkNode]:
        out = [self]
        for child in self.children:
            out += child.walk()
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "thread_id": self.thread_id,
            "forked_from": None if self.forked_from is None else {
                "thread_id": self.forked_from[0], "checkpoint_id": self.forked_from[1]},
            "forked_at": self.forked_at,
            "forked_step": self.forked_step,
            "children": [c.to_dict() for c in self.children],
        }

    def to_text(self) -> str:
        lines: list[str] = []

        def draw(node: ForkNode, prefix: str, last: bool, root: bool) -> None:
            at = "" if node.forked_from is None else f"  (from {node._where()})"
            lines.append(node.thread_id if root else f"{prefix}{'└─ ' if last else '├─ '}"
                         f"{node.thread_id}{at}")
            inner = "" if root else prefix + ("   " if last else "│  ")
            for i, child in enumerate(node.children):
                draw(child, inner, i == len(node.children) - 1, False)

        draw(self, "", True, True)
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.to_text()

    def _where(self) -> str:
        assert self.forked_from is not None
        step = "" if self.forked_step is None else f"step {self.forked_step}, "
        return f"{self.forked_from[0]} {step}checkpoint {self.forked_from[1]}"

    def to_svg(self) -> str:
        """The tree as an SVG picture: threads as boxes (an id too long for its box is cut in
        the middle, the full id in a tooltip), forks as curves labelled on their middle with
        the step (or checkpoint) they start from."""
        depth: dict[int, int] = {}
        row: dict[int, float] = {}
        leaves = [0]

        def place(node: ForkNode, d: int) -> float:
            depth[id(node)] = d
            if not node.children:
                row[id(node)] = leaves[0]
                leaves[0] += 1
            else:
                ys = [place(c, d + 1) for c in node.children]
                row[id(node)] = (ys[0] + ys[-1]) / 2
            return row[id(node)]

        place(self, 0)
        width = (max(depth.values()) + 1) * (_BOX_W + _GAP_X)
        height = max(1, leaves[0]) * (_BOX_H + _GAP_Y) + _GAP_Y
        parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
                 f'font-family="sans-serif" font-size="{_FONT}">']

        def xy(node: ForkNode) -> tuple[float, float]:
            return (depth[id(node)] * (_BOX_W + _GAP_X) + 4,
                    row[id(node)] * (_BOX_H + _GAP_Y) + _GAP_Y)

        for node in self.walk():
            x, y = xy(node)
            for child in node.children:
                parts += _svg_edge((x + _BOX_W, y + _BOX_H / 2), xy(child), child)
            parts.append(_svg_box(node, x, y))
        parts.append("</svg>")
        return "".join(parts)

    def _repr_svg_(self) -> str:
        return self.to_svg()


# The SVG picture: box and gap sizes in pixels, font sizes; text widths are estimated (an SVG
# has no layout engine to ask) on the generous side, per character.
_BOX_W, _BOX_H, _GAP_X, _GAP_Y = 190, 34, 96, 22
_PAD = 8
_FONT, _LABEL_FONT = 12, 9
_EM_WIDE = frozenset("MWmw@%")


def _em(ch: str) -> float:
    if ch in _EM_WIDE or unicodedata.east_asian_width(ch) in ("W", "F"):
        return 1.05
    if ch.isupper() or not ch.isascii():
        return 0.82
    return 0.6


def _text_width(text: str, size: float) -> float:
    """An upper estimate of `text`'s width in pixels, in a sans-serif font of `size`."""
    return sum(_em(ch) for ch in text) * size


def _fit(text: str, width: float, size: float) -> str:
    """`text`, or its start and end around `…`, in at most `width` pixels."""
    if _text_width(text, size) <= width:
        return text
    keep = min(len(text), int(width / (0.6 * size)) + 1)  # no character is narrower
    while keep > 0:
        keep -= 1
        head, tail = text[: (keep + 1) // 2], text[len(text) - keep // 2:] if keep > 1 else ""
        short = f"{head}…{tail}"
        if _text_width(short, size) <= width:
            return short
    return "…"


def _svg_box(node: ForkNode, x: float, y: float) -> str:
    fill = "#e8f0fe" if node.forked_from is None else "#eef7ee"
    shown = _fit(node.thread_id, _BOX_W - 2 * _PAD, _FONT)
    return (f"<g><title>{html.escape(node.thread_id)}</title>"
            f'<rect x="{x}" y="{y}" width="{_BOX_W}" height="{_BOX_H}" rx="6" fill="{fill}" '
            f'stroke="#555"/><text x="{x + _PAD}" y="{y + _BOX_H / 2}" '
            f'dominant-baseline="central">{html.escape(shown)}</text></g>')


def _svg_edge(start: tuple[float, float], box: tuple[float, float], child: ForkNode
              ) -> list[str]:
    """The curve from a box's right side to a child's box, and its label on the curve's
    middle: a cubic Bézier whose control points sit half a gap out, so that point is the
    midpoint of its two ends."""
    (x0, y0), (x3, y3) = start, (box[0], box[1] + _BOX_H / 2)
    mx, my = (x0 + x3) / 2, (y0 + y3) / 2
    edge = (f'<path d="M{x0},{y0} C{x0 + _GAP_X / 2},{y0} {x3 - _GAP_X / 2},{y3} {x3},{y3}" '
            'fill="none" stroke="#888"/>')
    if child.forked_from is None:
        return [edge]
    text = (f"step {child.forked_step}" if child.forked_step is not None
            else child.forked_from[1][-12:])
    label = html.escape(_fit(text, _GAP_X - 2 * _PAD, _LABEL_FONT))
    return [edge, f'<text x="{mx}" y="{my}" text-anchor="middle" dominant-baseline="central" '
                  f'font-size="{_LABEL_FONT}" fill="#555" stroke="#fff" stroke-width="3" '
                  f'paint-order="stroke">{label}</text>']


def _node(thread_id: str, md: Mapping[str, Any]) -> ForkNode:
    """The tree node of a fork, from its fork point's metadata."""
    at, step = md.get("forked_at"), md.get("step")
    return ForkNode(
        thread_id,
        (str(md.get("fork_of")), str(md.get("fork_checkpoint"))),
        at if isinstance(at, str) else None,
        step if isinstance(step, int) else None,
    )


async def _origin(saver: BaseCheckpointSaver[Any], thread_id: str) -> dict[str, Any] | None:
    """The fork link of a thread (its own fork point's metadata), if it is a fork."""
    async for tup in saver.alist({"configurable": {"thread_id": thread_id, "checkpoint_ns": ""}},
                                 filter={"fork_thread": thread_id}, limit=1):
        return dict(tup.metadata or {})
    return None


async def _forks_of(saver: BaseCheckpointSaver[Any], thread_id: str) -> list[ForkNode]:
    found: dict[str, ForkNode] = {}
    async for tup in saver.alist(None, filter={"fork_of": thread_id}):
        md = tup.metadata or {}
        own = ids_of(tup.config)[0]
        if md.get("fork_thread") == own and own not in found:
            found[own] = _node(own, md)
    return sorted(found.values(), key=lambda n: (n.forked_at or "", n.thread_id))


async def alineage(saver: BaseCheckpointSaver[Any], thread_id: str) -> ForkNode:
    """The fork tree that `thread_id` belongs to, from its root thread down."""
    if not await thread_exists(saver, thread_id):
        raise ThreadNotFoundError(f"thread {thread_id!r} has no checkpoint")
    root, seen = thread_id, {thread_id}
    while (md := await _origin(saver, root)) is not None:
        parent = str(md.get("fork_of"))
        if parent in seen or not await thread_exists(saver, parent):
            break  # the origin was deleted: this fork is the root of what is left
        root = parent
        seen.add(root)
    md = await _origin(saver, root)
    tree = ForkNode(root) if md is None else _node(root, md)
    todo, done = [tree], {root}
    while todo:
        node = todo.pop()
        for child in await _forks_of(saver, node.thread_id):
            if child.thread_id not in done:
                done.add(child.thread_id)
                node.children.append(child)
                todo.append(child)
    return tree


def lineage(saver: BaseCheckpointSaver[Any], thread_id: str) -> ForkNode:
    saver = sync_view(saver)
    return run_sync(saver, alineage(saver, thread_id))


def _check_fork_args(values: Mapping[str, Any] | None, resume: Any, graph: Any) -> None:
    if graph is None and (values is not None or resume is not None):
        arg = "values" if values is not None else "resume"
        raise InvalidConfigError(f"fork({arg}=...) runs through the graph: pass graph=")


async def _must_wait(saver: BaseCheckpointSaver[Any], config: RunnableConfig) -> None:
    """Refuse `resume=` at a checkpoint where the graph asked nothing (before any copy)."""
    source = await must_get(saver, config)
    if not asked(source.pending_writes or []):
        thread_id = ids_of(source.config)[0]
        raise InvalidConfigError(
            f"fork(resume=...) answers an interrupt, but checkpoint {source.checkpoint['id']!r} "
            f"of thread {thread_id!r} waits for no answer: fork at a checkpoint where the graph "
            "called interrupt() (inspect(...).interrupts), or fork without resume="
        )


async def afork(
    saver: BaseCheckpointSaver[Any],
    config: RunnableConfig,
    new_thread_id: str | None = None,
    values: Mapping[str, Any] | None = None,
    *,
    graph: Any = None,
    as_node: str | None = None,
    resume: Any = None,
) -> RunnableConfig:
    """A new thread whose history is the source's chain up to the checkpoint `config` names
    (the thread's latest without a checkpoint id), marked as a fork of it; the source is not
    touched. Returns the config of the fork's head.

    At a checkpoint where the graph waited for a human (`interrupt()`), the fork waits there
    again, whatever the source was answered since: the answer and what the tasks that read it
    wrote are left out, so `graph.invoke(Command(resume=...), head)` gives the fork its own.

    Args:
        values: applied to the fork as `update_state` does (needs `graph`, `as_node` optional).
        graph: the compiled graph, for `values` and `resume`.
        resume: an answer to the interrupt the fork waits at (a value, or a map of interrupt
            ids to values, as `Command(resume=...)` takes): the fork runs on with it through
            `graph` and the head it reaches is returned.

    Raises:
        InvalidConfigError: `values` or `resume` without `graph`; `resume` (without
            `values`) at a checkpoint where the graph waited for no answer.

    Example:
        >>> head = fork(cp, paused.config, "t-1-no", resume="no", graph=graph)  # doctest: +SKIP
    """
    _check_fork_args(values, resume, graph)
    if resume is not None and values is None:
        await _must_wait(saver, config)
    point = await afork_copy(saver, config, new_thread_id)
    if values is not None:
        point = await graph.aupdate_state(point, dict(values), as_node=as_node)
    if resume is None:
        return point
    await graph.ainvoke(Command(resume=resume), point)
    return (await graph.aget_state(thread_config(ids_of(point)[0]))).config  # type: ignore[no-any-return]


def fork(
    saver: BaseCheckpointSaver[Any],
    config: RunnableConfig,
    new_thread_id: str | None = None,
    values: Mapping[str, Any] | None = None,
    *,
    graph: Any = None,
    as_node: str | None = None,
    resume: Any = None,
) -> RunnableConfig:
    """Sync `afork`."""
    _check_fork_args(values, resume, graph)
    view = sync_view(saver)
    if resume is not None and values is None:
        run_sync(view, _must_wait(view, config))
    point = run_sync(view, afork_copy(view, config, new_thread_id))
    if values is not None:
        point = graph.update_state(point, dict(values), as_node=as_node)
    if resume is None:
        return point
    graph.invoke(Command(resume=resume), point)
    return graph.get_state(thread_config(ids_of(point)[0])).config  # type: ignore[no-any-return]
