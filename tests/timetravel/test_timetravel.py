"""Time travel on every backend, on threads made by real compiled graphs: history, inspect,
diff, fork, replay, A/B forks and lineage."""

from __future__ import annotations

from typing import Any

import pytest
from langgraph.types import Command

from langgraph_ckpt_ext.core import codec
from langgraph_ckpt_ext.core.errors import InvalidConfigError
from langgraph_ckpt_ext.core.rows import ListQuery
from langgraph_ckpt_ext.core.saver import StoreCheckpointer
from langgraph_ckpt_ext.timetravel import (
    CheckpointNotFoundError,
    ThreadExistsError,
    Variant,
    aab_test,
    afork,
    ahistory,
    ainspect,
    diff,
    fork,
    history,
    history_page,
    inspect,
    lineage,
    replay,
)
from tests.support.common import conf
from tests.support.graphs import approval_graph, chat_graph, fan_graph, human, subgraph_graph
from tests.support.lifecycle import later_id


def dump(saver: StoreCheckpointer, thread: str) -> list[Any]:
    """Every stored row of a thread, as bytes: checkpoints, the blobs they read, writes."""
    async def go() -> list[Any]:
        store = saver._store
        rows = [r async for r in store.iter_checkpoints(ListQuery(thread_id=thread))]
        out: list[Any] = [(r.checkpoint_ns, r.checkpoint_id, r.parent_checkpoint_id,
                           r.checkpoint, r.metadata) for r in rows]
        for ns in sorted({r.checkpoint_ns for r in rows}):
            mine = [r for r in rows if r.checkpoint_ns == ns]
            keys = {(ch, v) for r in mine
                    for ch, v in codec.blob_keys(saver._header(r)["channel_versions"]).items()}
            blobs = await store.read_blobs(thread, ns, keys)
            out += sorted((ns, k, b.type, b.data, b.base_version) for k, b in blobs.items())
            writes = await store.read_writes(thread, ns, [r.checkpoint_id for r in mine])
            out += sorted((ns, cid, w.task_id, w.idx, w.channel, w.data)
                          for cid, ws in writes.items() for w in ws)
        return out

    return saver.run_sync(go())


def chat(saver: StoreCheckpointer, thread: str, turns: int) -> Any:
    graph = chat_graph().compile(checkpointer=saver)
    for i in range(turns):
        graph.invoke({"messages": [human(f"turn {i}")]}, conf(thread))
    return graph


def test_history_is_paged_lazy_and_matches_the_graphs_view(saver: StoreCheckpointer) -> None:
    graph = chat(saver, "h", 5)
    official = list(graph.get_state_history(conf("h")))
    entries = list(history(saver, "h"))
    assert [e.checkpoint_id for e in entries] == [
        s.config["configurable"]["checkpoint_id"] for s in official]
    for e, s in zip(entries, official, strict=True):
        # (the graph also shows channels never written at their default, e.g. turns=0)
        assert e.values == {k: v for k, v in s.values.items() if k in e.values}
        assert e.next == s.next and e.step == s.metadata["step"]
        assert e.parent_checkpoint_id == (s.parent_config or {}).get("configurable", {}).get(
            "checkpoint_id")
    light = list(history(saver, "h", metadata_only=True))
    assert [e.checkpoint_id for e in light] == [e.checkpoint_id for e in entries]
    assert all(e.values is None and e.next is None for e in light)
    assert [e.metadata for e in light] == [e.metadata for e in entries]

    pages, before = [], None
    while True:
        page = history_page(saver, "h", size=4, before=before)
        pages.append([e.checkpoint_id for e in page.entries])
        if page.before is None:
            break
        before = page.before
    assert [cid for p in pages for cid in p] == [e.checkpoint_id for e in entries]
    assert [len(p) for p in pages][:-1] == [4] * (len(pages) - 1)

    loops = list(history(saver, "h", filter={"source": "loop"}, limit=3))
    assert len(loops) == 3 and all(e.source == "loop" for e in loops)
    with pytest.raises(Exception, match="filter"):
        list(history(saver, "h", filter={"$where": 1}))


def test_history_of_subgraphs_on_request_and_inspect(saver: StoreCheckpointer) -> None:
    graph = subgraph_graph().compile(checkpointer=saver)
    graph.invoke({"text": "x", "trail": []}, conf("sub"))
    root = list(history(saver, "sub"))
    everything = list(history(saver, "sub", subgraphs=True))
    assert {e.checkpoint_ns for e in root} == {""}
    assert any(e.checkpoint_ns.startswith("child:") for e in everything)
    assert len(everything) > len(root)

    approval = approval_graph().compile(checkpointer=saver)
    approval.invoke({"request": "refund", "log": []}, conf("ask"))
    seen = inspect(saver, conf("ask"))
    assert seen.next == ("ask",) and seen.values["log"] == ["proposed refund"]
    assert seen.interrupts == ({"question": "approve refund?"},)
    assert seen.metadata["step"] == approval.get_state(conf("ask")).metadata["step"]
    first = list(history(saver, "ask"))[-1]
    assert inspect(saver, first.config).next == ("__start__",)
    with pytest.raises(CheckpointNotFoundError, match="'nope' is not stored"):
        inspect(saver, conf("ask", "nope"))
    with pytest.raises(CheckpointNotFoundError, match="thread 'ghost' has no checkpoint"):
        inspect(saver, conf("ghost"))
    with pytest.raises(InvalidConfigError, match="no thread"):
        inspect(saver, {"configurable": {}})


def test_fork_resumes_and_leaves_the_source_untouched(saver: StoreCheckpointer) -> None:
    graph = approval_graph().compile(checkpointer=saver)
    graph.invoke({"request": "refund", "log": []}, conf("src"))  # paused at ask
    before = dump(saver, "src")
    point = fork(saver, conf("src"), "copy")
    assert point["configurable"]["thread_id"] == "copy"
    out = graph.invoke(Command(resume="yes"), conf("copy"))
    assert out["log"] == ["proposed refund", "human said yes", "acted on yes"]
    assert dump(saver, "src") == before
    assert graph.get_state(conf("src")).next == ("ask",)
    # the fork's history is the source's chain, then its own
    src_ids = [e.checkpoint_id for e in history(saver, "src")]
    fork_ids = [e.checkpoint_id for e in history(saver, "copy")]
    assert fork_ids[-len(src_ids):] == src_ids and len(fork_ids) > len(src_ids)
    marked = [e for e in history(saver, "copy") if e.metadata.get("fork_thread") == "copy"]
    assert len(marked) == 1 and marked[0].metadata["fork_of"] == "src"

    # at an earlier checkpoint, with values applied through the graph
    early = next(e for e in history(saver, "src") if e.next == ("ask",))
    proposed = next(e for e in history(saver, "src") if e.next == ("propose",))
    edited = fork(saver, proposed.config, "edited", {"request": "upgrade"}, graph=graph)
    assert graph.get_state(edited).values["request"] == "upgrade"
    graph.invoke(None, conf("edited"))
    assert graph.get_state(conf("edited")).values["log"] == ["proposed upgrade"]
    assert early.checkpoint_id in [e.checkpoint_id for e in history(saver, "src")]
    assert dump(saver, "src") == before

    # bad input: nothing changes
    copy_rows = dump(saver, "copy")
    with pytest.raises(ThreadExistsError, match="'copy' already holds checkpoints"):
        fork(saver, conf("src"), "copy")
    with pytest.raises(ThreadExistsError):
        fork(saver, conf("src"), "src")
    with pytest.raises(CheckpointNotFoundError):
        fork(saver, conf("src", "1f0-missing"), "never")
    with pytest.raises(CheckpointNotFoundError):
        fork(saver, conf("ghost"), "never")
    with pytest.raises(InvalidConfigError, match="graph="):
        fork(saver, conf("src"), "never", {"request": "x"})
    assert list(history(saver, "never")) == []
    assert dump(saver, "copy") == copy_rows and dump(saver, "src") == before


def test_fork_of_a_thread_paused_inside_a_subgraph(saver: StoreCheckpointer) -> None:
    graph = subgraph_graph().compile(checkpointer=saver)
    graph.invoke({"text": "x", "trail": []}, conf("outer"))
    assert graph.get_state(conf("outer")).next == ("child",)
    before = dump(saver, "outer")
    fork(saver, conf("outer"), "outer-fork")
    out = graph.invoke(Command(resume="ok"), conf("outer-fork"))
    assert out["text"] == "x+outer+inner(ok)"
    assert dump(saver, "outer") == before
    out = graph.invoke(Command(resume="src"), conf("outer"))
    assert out["text"] == "x+outer+inner(src)"


def test_replay_lists_exactly_the_nodes_that_ran(saver: StoreCheckpointer) -> None:
    graph = fan_graph().compile(checkpointer=saver)
    out = graph.invoke({"items": [1, 2, 3], "results": [], "total": 0}, conf("fan"))
    assert out["total"] == 14
    entries = list(history(saver, "fan"))
    steps = replay(saver, entries[-1].config)
    assert [t.nodes for t in steps] == [("__start__",), ("square",), ("join",)]
    assert [len(t.tasks) for t in steps] == [1, 3, 1]
    squares = sorted(v for t in steps[1].tasks for v in t.writes["results"])
    assert squares == [[1], [4], [9]]
    named = replay(saver, entries[-1].config, entries[0].config, graph=graph)
    assert [sorted({t.node for t in s.tasks}) for s in named] == [
        ["__start__"], ["square"], ["join"]]
    assert str(named[2]) == "step 2: join (join: total)"

    approval = approval_graph().compile(checkpointer=saver)
    approval.invoke({"request": "r", "log": []}, conf("ap"))
    approval.invoke(Command(resume="yes"), conf("ap"))
    ap = list(history(saver, "ap"))
    assert [t.nodes for t in replay(saver, ap[-1].config)] == [
        ("__start__",), ("propose",), ("ask",), ("act",)]
    with pytest.raises(CheckpointNotFoundError, match="not an ancestor"):
        replay(saver, ap[0].config, ap[-1].config)


def test_diff_applied_to_the_first_gives_the_second(saver: StoreCheckpointer) -> None:
    chat(saver, "d", 4)
    entries = list(history(saver, "d"))
    for a, b in [(entries[-1], entries[0]), (entries[3], entries[1]), (entries[0], entries[5])]:
        d = diff(saver, a.config, b.config)
        assert d.apply(a.values) == b.values
    last = diff(saver, entries[2].config, entries[0].config)
    assert "turns" in last.channels_changed and "messages" in last.channels_changed
    assert any(c.delta == 1 for c in last.changes)
    # across two threads
    fork(saver, entries[2].config, "d2")
    chat_graph().compile(checkpointer=saver).invoke({"messages": [human("other")]}, conf("d2"))
    two = diff(saver, conf("d"), conf("d2"))
    assert two.apply(entries[0].values) == next(iter(history(saver, "d2"))).values
    assert "d2@" in two.to_text() or "d2" in str(two.to_dict())
    with pytest.raises(CheckpointNotFoundError):
        diff(saver, conf("d", "nope"), conf("d"))
    with pytest.raises(CheckpointNotFoundError):
        diff(saver, conf("d"), conf("ghost"))


def test_lineage_tree(saver: StoreCheckpointer) -> None:
    chat(saver, "root", 2)
    fork(saver, conf("root"), "b")
    chat_graph().compile(checkpointer=saver).invoke({"messages": [human("b1")]}, conf("b"))
    fork(saver, conf("b"), "c")
    fork(saver, list(history(saver, "root"))[2].config, "d")
    for start in ("root", "b", "c", "d"):
        tree = lineage(saver, start)
        assert tree.thread_id == "root" and tree.forked_from is None
        assert sorted(n.thread_id for n in tree.children) == ["b", "d"]
        b = next(n for n in tree.children if n.thread_id == "b")
        assert [n.thread_id for n in b.children] == ["c"]
        assert b.children[0].forked_from[0] == "b"  # type: ignore[index]
    assert {n.thread_id for n in lineage(saver, "c").walk()} == {"root", "b", "c", "d"}
    svg = lineage(saver, "root").to_svg()
    assert svg.startswith("<svg") and all(t in svg for t in ("root", "b", "c", "d"))
    check_svg(svg, lineage(saver, "root"))
    text = lineage(saver, "root").to_text()
    assert "└─ c  (from b step 7, checkpoint " in text and "└─ d  (from root step 2, " in text
    assert lineage(saver, "root").to_dict()["children"][0]["forked_from"]["thread_id"] == "root"
    with pytest.raises(CheckpointNotFoundError):
        lineage(saver, "ghost")


# Glyph widths of a common sans-serif (Helvetica/Arial), in em: what a box must hold.
_WIDE = {"W": 0.944, "M": 0.833, "m": 0.833, "w": 0.722, "@": 1.015, "%": 0.889}


def text_width(text: str, size: float) -> float:
    import unicodedata

    def em(ch: str) -> float:
        if ch in _WIDE:
            return _WIDE[ch]
        if unicodedata.east_asian_width(ch) in "WF":
            return 1.0
        return 0.78 if ch.isupper() else 0.556

    return sum(map(em, text)) * size


def check_svg(svg: str, tree: Any) -> None:
    """Each thread's box holds its label (the full id in a <title>), each fork's label sits on
    the middle of its curve."""
    import re
    import xml.etree.ElementTree as ET

    ns = {"s": "http://www.w3.org/2000/svg"}
    root = ET.fromstring(svg)
    boxes = root.findall("s:g", ns)
    assert sorted(g.find("s:title", ns).text or "" for g in boxes) == sorted(  # type: ignore[union-attr]
        n.thread_id for n in tree.walk())
    for g in boxes:
        rect, label = g.find("s:rect", ns), g.find("s:text", ns)
        assert rect is not None and label is not None and label.text
        size = float(label.get("font-size") or root.get("font-size") or 12)
        left = float(rect.get("x") or 0)
        right = left + float(rect.get("width") or 0)
        assert left < float(label.get("x") or 0)
        assert float(label.get("x") or 0) + text_width(label.text, size) <= right, label.text
        full = g.find("s:title", ns).text or ""  # type: ignore[union-attr]
        if label.text != full:
            assert "…" in label.text
            head, tail = label.text.split("…")
            assert full.startswith(head) and full.endswith(tail)
    paths = root.findall("s:path", ns)
    labels = root.findall("s:text", ns)
    assert len(paths) == len(labels) == len(tree.walk()) - 1
    for path, label in zip(paths, labels, strict=True):
        x0, y0, x1, y1, x2, y2, x3, y3 = map(float, re.findall(r"-?[\d.]+", path.get("d") or ""))
        mid = ((x0 + 3 * x1 + 3 * x2 + x3) / 8, (y0 + 3 * y1 + 3 * y2 + y3) / 8)  # t = 1/2
        assert label.get("text-anchor") == "middle"
        assert label.get("dominant-baseline") == "central"
        assert (float(label.get("x") or 0), float(label.get("y") or 0)) == pytest.approx(mid)
        width = text_width(label.text or "", float(label.get("font-size") or 12))
        assert x0 < mid[0] - width / 2 and mid[0] + width / 2 < x3  # between the two boxes


def test_lineage_svg_fits_long_ids() -> None:
    from langgraph_ckpt_ext.timetravel.fork import ForkNode

    cid = later_id()
    long_id = "customer-support-session-2026-01-01-with-a-rather-long-suffix-0042"
    tree = ForkNode(long_id, children=[
        ForkNode("WWWWMMMMWWWWMMMMWWWWMMMM-fork", (long_id, cid), forked_step=12, children=[
            ForkNode("短い" * 20, ("WWWWMMMMWWWWMMMMWWWWMMMM-fork", cid))]),
        ForkNode("b", (long_id, cid), forked_step=3),
        ForkNode("<&>" * 30, (long_id, cid), forked_step=1234567890123),
    ])
    svg = tree.to_svg()
    check_svg(svg, tree)
    assert f"<title>{long_id}</title>" in svg and "&lt;&amp;&gt;" in svg


def test_ab_variants_on_forks(saver: StoreCheckpointer) -> None:
    from langgraph_ckpt_ext.timetravel import ab_test

    graph = approval_graph().compile(checkpointer=saver)
    graph.invoke({"request": "refund", "log": []}, conf("ab"))
    before = dump(saver, "ab")
    result = ab_test(graph, conf("ab"), {
        "yes": Variant(input=Command(resume="yes")),
        "no": {"input": Command(resume="no"), "thread_id": "ab-no"},
        "edited": Variant(values={"request": "credit"}, as_node="propose",
                          input=Command(resume="maybe")),
    })
    assert {n: r.values["decision"] for n, r in result.runs.items()  # type: ignore[index]
            } == {"yes": "yes", "no": "no", "edited": "maybe"}
    d = result.diff("yes", "no")
    assert d.apply(result.runs["yes"].values) == result.runs["no"].values
    assert set(result.diffs) == {("yes", "no"), ("yes", "edited"), ("no", "edited")}
    assert dump(saver, "ab") == before
    assert result.runs["no"].thread_id == "ab-no"
    labelled = diff(saver, conf("ab"), conf("ab-no"), labels=("paused", "said no"))
    assert labelled.to_text().splitlines()[:2] == ["--- paused", "+++ said no"]
    assert {n.thread_id for n in lineage(saver, "ab").children} == {
        r.thread_id for r in result.runs.values()}


async def test_async_helpers(saver: StoreCheckpointer) -> None:
    graph = chat_graph().compile(checkpointer=saver)
    for i in range(3):
        await graph.ainvoke({"messages": [human(f"a{i}")]}, conf("as"))
    entries = [e async for e in ahistory(saver, "as", limit=4)]
    assert len(entries) == 4 and entries[0].values["turns"] == 3  # type: ignore[index]
    seen = await ainspect(saver, conf("as"))
    assert seen.values["turns"] == 3
    head = await afork(saver, entries[1].config, "as-fork", {"turns": 10}, graph=graph)
    assert (await graph.aget_state(head)).values["turns"] == entries[1].values["turns"] + 10  # type: ignore[index]
    result = await aab_test(graph, conf("as"), {
        "short": Variant(input={"messages": [human("short")]}),
        "long": Variant(input={"messages": [human("a much longer question")]},
                        config={"configurable": {"model": "big"}}),
    })
    assert result.runs["short"].values["turns"] == 4  # type: ignore[index]
    assert result.diff("short", "long").channels_changed == ["messages"]


def test_the_helpers_are_methods_of_every_checkpointer(saver: StoreCheckpointer) -> None:
    graph = approval_graph().compile(checkpointer=saver)
    graph.invoke({"request": "refund", "log": []}, conf("m"))
    entries = list(saver.history("m"))
    assert [e.checkpoint_id for e in entries] == [e.checkpoint_id for e in history(saver, "m")]
    assert saver.history_page("m", size=2).before is not None
    assert saver.inspect(conf("m")).next == ("ask",)
    assert sorted(saver.diff(entries[-1].config, entries[0].config).channels_added) == [
        "log", "request"]
    head = saver.fork(conf("m"), "m2")
    graph.invoke(Command(resume="ok"), head)
    start = list(saver.history("m2"))[-1].config
    assert [t.nodes for t in saver.replay(start, conf("m2"))][-2:] == [("ask",), ("act",)]
    assert [n.thread_id for n in saver.lineage("m").children] == ["m2"]


def _helpers_on(saver: Any) -> list[Any]:
    """Every sync time-travel helper over `saver`, on a two-turn chat: what each returns, ids
    and times aside."""
    from langgraph_ckpt_ext.timetravel import ab_test, rerun

    graph = chat_graph().compile(checkpointer=saver)
    config = conf("tt")
    for i in range(2):
        graph.invoke({"messages": [human(f"m{i}")]}, config)
    entries = list(history(saver, "tt"))
    page = history_page(saver, "tt", size=2)
    first, last = entries[-1].config, entries[0].config
    seen = inspect(saver, last)
    changed = diff(saver, first, last)
    forked = fork(saver, entries[2].config, "tt-fork")
    tree = lineage(saver, "tt")
    steps = replay(saver, first, last)
    again = rerun(graph, forked, {"messages": [human("again")]})
    arms = ab_test(graph, last, {"x": {"values": {"messages": [human("x")]}}})
    return [len(entries), [e.step for e in entries], len(page.entries),
            sorted(seen.values), len(changed), ids_of_thread(forked),
            [c.thread_id for c in tree.children], [s.nodes for s in steps],
            len(again["messages"]), sorted(arms.runs)]


def ids_of_thread(config: Any) -> str:
    return str(config["configurable"]["thread_id"])


def test_time_travel_on_langgraphs_sync_sqlite_saver(tmp_path: Any) -> None:
    """LangGraph's `SqliteSaver` has sync methods only: every helper works on it, and gives
    what it gives on InMemorySaver."""
    from langgraph.checkpoint.memory import InMemorySaver
    from langgraph.checkpoint.sqlite import SqliteSaver

    with SqliteSaver.from_conn_string(str(tmp_path / "lg.db")) as sync_only:
        got = _helpers_on(sync_only)
    assert got == _helpers_on(InMemorySaver())
